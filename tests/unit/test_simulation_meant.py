"""``ebb worker`` and ``ebb up`` with neither --headroom nor --devices simulate one 80 GiB
device with no online load: refused where NVML sees GPUs (a trial's trap: a worker on a
GPU host joined the fleet's store with a simulated card and placed offline jobs beside
online load nothing measured), said once where it sees none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli import run_cmd
from ebbtide.cli.main import cli
from ebbtide.errors import UserError
from ebbtide.workers.headroom import nvml
from ebbtide.workers.headroom.fake_nvml import FakeNvml


def test_gpus_here_counts_what_nvml_sees_and_none_where_it_cannot_start() -> None:
    fake = FakeNvml()
    fake.add_device(81920)
    fake.add_device(81920)
    assert nvml.gpus_here(fake) == 2
    assert not fake.initialized  # shut down again

    class NoDriver:
        def nvmlInit(self) -> None:
            raise fake.NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    assert nvml.gpus_here(NoDriver()) == 0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"EBBTIDE_HOME": str(tmp_path / "home"), "EBBTIDE_DB_URL": ""}


@pytest.mark.parametrize("command", ["worker", "up"])
def test_a_gpu_host_with_no_headroom_given_is_refused_before_anything_starts(
    command: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml, "gpus_here", lambda: 8)
    opened: list[Any] = []
    monkeypatch.setattr(run_cmd, "_open_source", lambda *a: opened.append(a))
    result = CliRunner().invoke(cli, [command, "--node", "gpu-a"], env=env)
    assert result.exit_code == 1
    assert result.stderr == (
        "ebb: error: this host has 8 NVIDIA GPUs (NVML): give --headroom nvml to measure "
        f"them; without it ebb {command} simulates one 80GiB device with no online load, "
        "and would place offline jobs beside online work it cannot see (--headroom static "
        "or --devices simulates on purpose)\n"
    )
    assert opened == []


@pytest.mark.parametrize(
    "given", [["--headroom", "static"], ["--devices", "2x80GiB"], ["--headroom", "nvml"]]
)
def test_simulating_on_purpose_or_measuring_is_not_refused(
    given: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml, "gpus_here", lambda: 8)

    def stop(*_: Any) -> None:
        raise UserError("stopped where the source opens")

    monkeypatch.setattr(run_cmd, "_open_source", stop)
    result = CliRunner().invoke(cli, ["worker", "--node", "gpu-a", *given], env=env)
    assert result.stderr == "ebb: error: stopped where the source opens\n"
