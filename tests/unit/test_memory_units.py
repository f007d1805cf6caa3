"""A trial's trap: ``4GB`` was 4096 MiB in ``-l gpumem=4GB`` (PBS reads ``gb`` as a power
of 1024) but 3815 MiB through the SDK, and ``--devices 2x80GB`` made 74.5 GiB cards.  A
size has one reading wherever it is given: every unit a power of 1024."""

from __future__ import annotations

import pytest

from ebbtide.queue.qsub import parse_resources
from ebbtide.queue.spec import JobSpec
from ebbtide.units import parse_memory_mib
from ebbtide.workers.devices import parse_devices


@pytest.mark.parametrize(
    ("text", "mib"),
    [("4GB", 4096), ("4gb", 4096), ("4GiB", 4096), ("4g", 4096), ("512MB", 512),
     ("1TB", 1024 * 1024), ("1.5GB", 1536), ("2048KB", 2)],
)  # fmt: skip
def test_every_unit_is_a_power_of_1024(text: str, mib: int) -> None:
    assert parse_memory_mib(text) == mib


def test_a_size_reads_the_same_in_the_sdk_the_resource_list_and_the_devices() -> None:
    sdk = JobSpec(command=["true"], gpumem="4GB").memory_mib
    cli = JobSpec(command=["true"], **parse_resources("gpu=25%,gpumem=4GB")).memory_mib
    assert sdk == cli == 4096
    [card] = parse_devices("1x80GB")
    assert card.memory_mib == 80 * 1024
