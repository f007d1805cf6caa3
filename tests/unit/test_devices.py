from __future__ import annotations

import pytest

from ebbtide.workers.devices import DEFAULT_DEVICE_MEMORY_MIB, parse_devices
from ebbtide.workers.headroom.base import DeviceInfo


@pytest.mark.parametrize(
    ("text", "expected_mib"),
    [
        ("2x80GiB", [81920, 81920]),
        ("80GiB", [81920]),
        ("1x40GiB,2x80GiB", [40960, 81920, 81920]),
        ("4", [DEFAULT_DEVICE_MEMORY_MIB] * 4),
        (" 1 x 24GiB , 512MiB ", [24576, 512]),
        ("2X16GiB", [16384, 16384]),
    ],
)
def test_accepted_forms(text: str, expected_mib: list[int]) -> None:
    devices = parse_devices(text)
    assert [d.memory_mib for d in devices] == expected_mib
    assert [d.index for d in devices] == list(range(len(expected_mib)))


def test_default_device_is_80_gib() -> None:
    assert parse_devices("1") == [DeviceInfo(index=0, memory_mib=80 * 1024)]


@pytest.mark.parametrize(
    "text",
    ["", "  ", "0", "0x80GiB", "2x", "x80GiB", "eighty", "2x80Gibs", "80GiB,,", "2x8192", "-1"],
)
def test_bad_input_names_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"--devices") as info:
        parse_devices(text)
    message = str(info.value)
    assert "2x80GiB" in message or "count must be at least 1" in message or "unit" in message


def test_bad_input_message_lists_every_form() -> None:
    with pytest.raises(ValueError) as info:
        parse_devices("lots")
    for form in ("4", "80GiB", "2x80GiB", "1x40GiB,2x80GiB"):
        assert form in str(info.value)


def test_absurd_count_is_refused() -> None:
    with pytest.raises(ValueError, match="more than"):
        parse_devices("100000")
