"""A job may report progress at every step: the node agent passes the latest on at most
once a period, the first at once and the last when the attempt ends, so that a chatty
job neither floods the store nor delays the node's heartbeats behind its reports."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.attempt import PROGRESS_REPORT_PERIOD_S, LocalAttempt
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from tests.integration.test_pause import wait_until

# 2,000 progress lines in about 2 s, then the last one
CHATTY = [
    sys.executable,
    "-c",
    "import time, ebbtide.job as job\n"
    "for i in range(2000):\n"
    "    job.progress(i, 2000)\n"
    "    time.sleep(0.001)\n"
    "job.progress(2000, 2000)\n",
]


def test_a_chatty_job_reaches_the_store_once_a_period_and_its_last_progress_at_the_end(
    tmp_path,
):  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    calls: list[dict[str, Any]] = []
    record = store.record_progress

    def counted(job_id: int, attempt: int, done: float, total: float | None) -> None:
        calls.append({"done": done, "total": total})
        record(job_id, attempt, done, total)

    store.record_progress = counted  # type: ignore[method-assign]
    agent = NodeAgent("n1", store, StaticSource(parse_devices("1x80GiB")), home=tmp_path)
    agent.start()
    try:
        [job_id] = store.submit(JobSpec(command=CHATTY), "tester", defaults_deadline_s=5)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024
        )
        # the first progress is passed on at once, while the job still runs
        wait_until(lambda: store.get(job_id).progress_done is not None)
        wait_until(lambda: store.get(job_id).state == "succeeded")
        job = store.get(job_id)
        assert (job.progress_done, job.progress_total) == (2000.0, 2000.0)
        # the job ran for about 2 s, within one period: the first and the last
        assert len(calls) == 2, calls
        assert calls[0]["done"] < 2000 and calls[-1] == {"done": 2000.0, "total": 2000.0}
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def _attempt() -> LocalAttempt:
    # what the throttle reads is the attempt's own; the rest is not looked at
    return LocalAttempt(slice=None, handle=None, tree=None, status=None)  # type: ignore[arg-type]


def test_the_latest_progress_wins_at_most_once_a_period() -> None:
    a = _attempt()
    assert a.progress_to_report(100.0) is None  # nothing given yet
    a.progress = (1.0, 10.0)
    assert a.progress_to_report(100.0) == (1.0, 10.0)  # the first at once
    a.progress = (2.0, 10.0)
    a.progress = (3.0, 10.0)
    assert a.progress_to_report(100.0 + PROGRESS_REPORT_PERIOD_S / 2) is None
    assert a.progress == (3.0, 10.0)  # kept for later
    assert a.progress_to_report(100.0 + PROGRESS_REPORT_PERIOD_S) == (3.0, 10.0)
    assert a.progress_to_report(100.0 + 2 * PROGRESS_REPORT_PERIOD_S) is None  # sent already
    a.progress = (4.0, None)
    assert a.progress_to_report(100.0 + PROGRESS_REPORT_PERIOD_S + 1, final=True) == (4.0, None)
    assert a.progress is None


@pytest.mark.parametrize("final", [False, True])
def test_no_progress_is_reported_twice(final: bool) -> None:
    a = _attempt()
    a.progress = (5.0, None)
    assert a.progress_to_report(0.0, final=final) == (5.0, None)
    assert a.progress_to_report(1e9, final=final) is None
