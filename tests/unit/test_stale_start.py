"""Why a node agent does not act on a start request, in words an operator can act on
(an SRE's trap: ``job 7 attempt 1: stale start ignored`` said nothing of why)."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.queue.models import Job
from ebbtide.workers.stale import stale_start


def job(**over: Any) -> Job:
    fields: dict[str, Any] = {
        "id": 7,
        "name": "train",
        "owner": "alice",
        "queue": "default",
        "state": "dispatched",
        "spec_json": "{}",
        "compute_pct": 25.0,
        "memory_mib": 4096.0,
        "deadline_s": 30.0,
        "signal": 15,
        "submitted_at": 1.0,
        "attempts": 1,
        "node": "gpu-a",
        "devices": "0",
    }
    return Job(**(fields | over))


def test_a_start_still_due_is_not_stale() -> None:
    assert stale_start(job(), 1, "gpu-a") is None


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"state": "running"}, "it is running here already (the same request arrived twice"),
        ({"state": "evicting"}, "it is evicting here already"),
        ({"attempts": 2}, "the job is at attempt 2 now (a late request"),
        ({"state": "queued", "node": None}, "the scheduler requeued it before it started here"),
        ({"state": "cancelled"}, "it is cancelled now, no longer waiting to start"),
        ({"node": "gpu-b"}, "the store has this attempt on node gpu-b, not here"),
    ],
)
def test_a_stale_start_says_why(over: dict[str, Any], says: str) -> None:
    why = stale_start(job(**over), 1, "gpu-a")
    assert why is not None and why.startswith(says) and why.endswith("; nothing to do")
