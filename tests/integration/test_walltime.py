"""A trial's trap: an attempt past its walltime was killed at once, with no warning, so a
job could not save its work, unlike under PBS and Slurm.  Now it is warned (its warning
signal), killed its deadline later if it still runs, and fails whatever it exits with but
0: exit 99, its usual answer to a warning, is no requeue of its own here."""

from __future__ import annotations

import sys
import time

import pytest

from ebbtide.queue.outcomes import decide
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from tests.integration.test_pause import wait_until

# answers the warning as an ebbtide job does: checkpoint (here: a line), exit 99
POLITE = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('saved', flush=True), sys.exit(99)))\n"
    "time.sleep(30)\n",
]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)\n",
]


@pytest.fixture
def node(tmp_path):  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    agent = NodeAgent("n1", store, StaticSource(parse_devices("1x80GiB")), home=tmp_path)
    agent.start()
    yield store
    agent.shutdown(timeout_s=20)
    store.close()


def _run(store: Store, command: list[str], deadline_s: float) -> int:
    spec = JobSpec(command=command, walltime="0.5s", deadline_s=deadline_s, max_attempts=3)
    [job_id] = store.submit(spec, "tester", defaults_deadline_s=5)
    store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024
    )
    return job_id


def test_a_job_warned_of_its_walltime_saves_and_is_not_requeued_as_evicted(node) -> None:  # type: ignore[no-untyped-def]
    job_id = _run(node, POLITE, deadline_s=10)
    wait_until(lambda: node.get(job_id).failures == 1)
    job = node.get(job_id)
    # a failure (counted, requeued while attempts remain), not an eviction
    assert job.evictions == 0
    [failed] = [e for e in node.events(job_id) if e["type"] == "failed"]
    assert (failed["why"], failed["exit_code"]) == ("walltime 0.5s exceeded", 99)
    assert failed["reason_code"] == "walltime"
    assert "attempt 1 failed (walltime 0.5s exceeded); 1 of 3 failures" in job.reason


def test_a_job_that_ignores_the_warning_is_killed_its_deadline_later(node) -> None:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    job_id = _run(node, STUBBORN, deadline_s=1)
    wait_until(lambda: node.get(job_id).failures == 1)
    assert time.monotonic() - began >= 1.4  # walltime 0.5 s, then its deadline of 1 s
    [failed] = [e for e in node.events(job_id) if e["type"] == "failed"]
    assert failed["why"] == "walltime 0.5s exceeded, killed 1s after the warning"
    assert failed["exit_code"] == 137


@pytest.mark.parametrize(
    ("exit_code", "state"),
    [(0, JobState.SUCCEEDED), (99, JobState.FAILED), (143, JobState.FAILED)],
)
def test_past_its_walltime_an_attempt_fails_whatever_it_exits_with_but_0(
    exit_code: int, state: JobState
) -> None:
    verdict = decide(
        source=JobState.RUNNING,
        exit_code=exit_code,
        eviction=None,
        cancel_requested=False,
        evictions=0,
        failures=0,
        max_attempts=1,
        attempt=1,
        warning_signal=15,
        why="walltime 1s exceeded",
        ran_out=True,
    )
    assert verdict.target == state and verdict.evictions == 0
