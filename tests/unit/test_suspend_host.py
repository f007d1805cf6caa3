"""Suspend to host, the host's side: the node's budget for suspended CUDA state and the
memory it has available decide whether one more attempt may be moved there."""

from __future__ import annotations

import pytest

from ebbtide.workers import suspend
from ebbtide.workers.suspend import HOST_RESERVE_MIB, host_memory_mib, host_refusal

GIB = 1024.0


@pytest.mark.parametrize(
    ("memory_mib", "suspended_mib", "pct", "total_mib", "available_mib", "words"),
    [
        pytest.param(8 * GIB, 0, 50, 64 * GIB, 48 * GIB, None, id="fits"),
        pytest.param(8 * GIB, 24 * GIB, 50, 64 * GIB, 48 * GIB, None, id="fills-the-budget"),
        pytest.param(
            8 * GIB,
            25 * GIB,
            50,
            64 * GIB,
            48 * GIB,
            ["suspend_host_memory_pct 50%", "32GiB", "25GiB already suspended"],
            id="past-the-budget",
        ),
        pytest.param(
            1, 0, 0, 64 * GIB, 48 * GIB, ["suspend_host_memory_pct 0%"], id="no-budget-at-all"
        ),
        pytest.param(
            8 * GIB,
            0,
            50,
            64 * GIB,
            8 * GIB + HOST_RESERVE_MIB - 1,
            ["available", "reserve"],
            id="too-little-available",
        ),
        pytest.param(
            8 * GIB, 0, 50, 64 * GIB, 8 * GIB + HOST_RESERVE_MIB, None, id="just-available"
        ),
        # on a big host the reserve is a share of it: 5% of 1 TiB
        pytest.param(
            8 * GIB,
            0,
            50,
            1024 * GIB,
            8 * GIB + 50 * GIB,
            ["51.2GiB reserve"],
            id="reserve-grows-with-the-host",
        ),
    ],
)
def test_host_refusal(
    memory_mib: float,
    suspended_mib: float,
    pct: float,
    total_mib: float,
    available_mib: float,
    words: list[str] | None,
) -> None:
    why = host_refusal(memory_mib, suspended_mib, pct, total_mib, available_mib)
    if words is None:
        assert why is None
    else:
        assert why is not None
        for word in words:
            assert word in why, why


def test_host_memory_comes_from_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory:
        total = 64 * 2**30
        available = 10 * 2**30

    monkeypatch.setattr(suspend.psutil, "virtual_memory", lambda: Memory())
    assert host_memory_mib() == (64 * GIB, 10 * GIB)
