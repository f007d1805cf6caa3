"""``ebb nodes`` as a table, from what a (fake) client gives: what admission keeps back
on each device, the warm-up's cold reserve, and the heartbeat's age."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli import nodes_cmd

from .test_ownership_pods import run_nodes as run_rows

GIB = 1024


def device(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "memory_mib": 80.0 * GIB,
        "online_compute_pct": 3.0,
        "online_memory_mib": 4.0 * GIB,
        **extra,
    }


def run_nodes(monkeypatch: pytest.MonkeyPatch, devices: list[dict[str, Any]], *args: str) -> str:
    rows = [{"name": "gpu-a", "heartbeat_age_s": 1.0, "stopping": False, "devices": devices}]
    return run_rows(monkeypatch, rows, *args)


def test_the_reserve_kept_back_shows_beside_a_nearly_idle_card(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An SRE's trap: a job waited while ``ebb nodes`` showed a card nearly idle with no
    slices; the forecast's 72000 MiB reserve was only in ``--json``."""
    devices = [
        device(0, reserve_compute_pct=5.0, reserve_memory_mib=72000.0),
        device(1),  # an agent with nothing to forecast (or an older one)
    ]
    header, first, second = run_nodes(monkeypatch, devices).splitlines()
    at = header.index("KEPT BACK")
    assert first[at:].startswith("5% / 70.3GiB") and first.endswith(" ok")
    assert second[at:].startswith("- ") and second.endswith(" ok")
    assert all(len(line) <= 100 for line in (header, first, second))
    assert header.index("STATE") == first.index(" ok") + 1


def test_the_cold_reserve_says_the_agent_is_warming_up(monkeypatch: pytest.MonkeyPatch) -> None:
    cold = device(0, reserve_compute_pct=30.0, reserve_memory_mib=8.0 * GIB, reserve_cold_for_s=420)
    header, row = run_nodes(monkeypatch, [cold]).splitlines()
    assert row[header.index("KEPT BACK") :].startswith("30% / 8GiB ")
    assert row.endswith("  warming up (the cold reserve, 7m left)")
    full = run_nodes(monkeypatch, [cold], "-f")
    assert (
        "kept back: 30% / 8GiB, the cold reserve while its agent learns the online load "
        "(defaults.forecast_warmup_s, 7m left); the policy's margin comes on top"
    ) in full


def test_full_lines_say_why_the_reserve_is_kept_back(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [
        device(0, reserve_compute_pct=5.0, reserve_memory_mib=72000.0),
        device(1, reserve_compute_pct=20.0, reserve_memory_mib=8.0 * GIB, eviction_trigger=False),
        device(2),
    ]
    full = run_nodes(monkeypatch, devices, "-f")
    assert (
        "kept back: 5% / 70.3GiB for the online side's growth within the eviction deadline "
        "(forecast); the policy's margin comes on top"
    ) in full
    assert "(forecast), with the planning margin for device-level figures;" in full
    assert "kept back: nothing for the online side's growth (the policy's margin aside)" in full
    assert "kept back" not in run_nodes(monkeypatch, devices)


@pytest.mark.parametrize("age_s", [-0.03, -2.0])
def test_an_age_a_little_below_zero_shows_as_zero(
    monkeypatch: pytest.MonkeyPatch, age_s: float
) -> None:
    """An SRE's trap: a heartbeat stamped by a clock a little ahead showed ``-0.0s``."""
    rows = [{"name": "gpu-a", "heartbeat_age_s": age_s, "stopping": False, "devices": [device(0)]}]

    class FakeClient:
        def nodes(self) -> list[dict[str, Any]]:
            return rows

    monkeypatch.setattr(nodes_cmd, "_client", FakeClient)
    row = CliRunner().invoke(nodes_cmd.nodes, []).output.splitlines()[1]
    assert row.split()[:2] == ["gpu-a", "0.0s"]


def test_fractions_of_a_mib_keep_the_columns_in_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forecast's reserve is no whole number: ``737.281MiB`` pushed the row out of line."""
    odd = device(
        0,
        online_memory_mib=512.4,
        reserve_compute_pct=12.0,
        reserve_memory_mib=737.281,
        slices={"jobs": [1, 2], "compute_pct": 96.0, "memory_mib": 1000.75},
    )
    header, row = run_nodes(monkeypatch, [odd, device(1)]).splitlines()[:2]
    assert "737.281" not in row and "12% / 737MiB" in row and "2: 96% / 1001MiB" in row
    assert header.index("STATE") == row.index(" ok") + 1
