"""The statements the agents' reports write with are built once and bind their values;
they write what the statements built at every call wrote, fenced the same way (on SQLite
and PostgreSQL: the ``store`` fixture)."""

from __future__ import annotations

import pytest

from ebbtide.errors import StaleState
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store, statements


def _running(store: Store) -> tuple[int, int]:
    [job_id] = store.submit(
        JobSpec(command=["train"], gpu="20%", gpumem="4GiB"), "alice", defaults_deadline_s=30
    )
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=4096
    )
    store.mark_started(job_id, attempt, pid=7, stdout_path="o", stderr_path="e")
    return job_id, attempt


def test_checkpoints_and_progress_are_written_with_statements_built_once(store: Store) -> None:
    job_id, attempt = _running(store)
    store.record_checkpoint(job_id, attempt, path="/ck/1", at=100.0)
    store.record_progress(job_id, attempt, done=1.0, total=4.0)
    built = (
        statements._fenced_update.cache_info().misses,
        statements._attempt_update.cache_info().misses,
    )
    for k in range(2, 5):
        store.record_checkpoint(job_id, attempt, path=f"/ck/{k}", at=100.0 + k)
        store.record_progress(job_id, attempt, done=float(k), total=4.0)
    assert (
        statements._fenced_update.cache_info().misses,
        statements._attempt_update.cache_info().misses,
    ) == built
    job = store.get(job_id)
    assert (job.checkpoint_path, job.last_checkpoint_at) == ("/ck/4", 104.0)
    assert (job.progress_done, job.progress_total) == (4.0, 4.0)
    [row] = store.attempts(job_id)
    assert row.last_checkpoint_at == 104.0
    saved = [e for e in store.events(job_id) if e["type"] == "checkpointed"]
    assert [(e["path"], e["attempt"]) for e in saved] == [
        (f"/ck/{k}", attempt) for k in range(1, 5)
    ]


def test_a_bound_write_is_fenced_by_the_attempt(store: Store) -> None:
    job_id, attempt = _running(store)
    with pytest.raises(StaleState):
        store.record_checkpoint(job_id, attempt + 1, path="/ck/other", at=1.0)
    assert store.get(job_id).checkpoint_path is None


def test_a_value_that_is_an_expression_is_still_written(store: Store) -> None:
    # a suspension keeps the time the attempt was first paused: coalesce(paused_at, :at)
    job_id, attempt = _running(store)
    store.record_pause(job_id, attempt, at=50.0, reason="spike", reason_code="online_compute")
    store.record_pause(
        job_id, attempt, at=60.0, reason="memory", reason_code="online_memory", kind="suspend"
    )
    job = store.get(job_id)
    assert (job.paused_at, job.suspended_at) == (50.0, 60.0)
