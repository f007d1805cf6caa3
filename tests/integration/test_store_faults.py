"""The store and device faults, on SQLite and PostgreSQL: a GPU fault moves a job without
counting against it; a job that cannot start fails at once; admins' drains."""

from __future__ import annotations

import pytest

from ebbtide.queue.drains import WHOLE_NODE
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store

from .test_store import start, submit

S = JobState


@pytest.fixture
def store(any_store: Store) -> Store:
    """The store's behaviour on every backend: SQLite, PostgreSQL and in memory."""
    return any_store


FAULT = {
    "reason": "GPU fault on n1/0: XID 79: GPU has fallen off the bus",
    "reason_code": "gpu_fault",
    "deadline_s": 0.0,
    "spike_at": 100.0,
    "freed_at": 100.2,
    "latency_s": 0.2,
    "killed": True,
}


def test_a_gpu_fault_requeues_without_counting_as_eviction_or_failure(store: Store) -> None:
    job_id = submit(store, max_attempts=1)
    attempt = start(store, job_id)
    # the job died of the fault before it could be warned: still running by the store
    assert store.finish_attempt(job_id, attempt, exit_code=134, eviction=FAULT) == S.QUEUED
    job = store.get(job_id)
    assert (job.evictions, job.failures, job.attempts) == (0, 0, 1)
    [ev] = [e for e in store.events(job_id) if e["type"] == "evicted"]
    assert ev["reason_code"] == "gpu_fault" and "XID 79" in ev["reason"]


def test_a_gpu_fault_during_an_eviction_does_not_count_either(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.begin_eviction(
        job_id,
        attempt,
        reason=FAULT["reason"],
        reason_code="gpu_fault",
        deadline_s=30,
        spike_at=100.0,
        source="agent",
    )
    assert store.eviction_request(job_id, attempt)["reason_code"] == "gpu_fault"  # type: ignore[index]
    assert store.finish_attempt(job_id, attempt, exit_code=143, eviction=FAULT) == S.QUEUED
    assert store.get(job_id).evictions == 0


def test_eviction_request_is_none_without_one(store: Store) -> None:
    job_id = submit(store)
    assert store.eviction_request(job_id, 1) is None


def test_a_final_failure_does_not_retry(store: Store) -> None:
    job_id = submit(store, max_attempts=5)
    attempt = start(store, job_id)
    why = "could not start ['/nope']: No such file or directory"
    assert store.finish_attempt(job_id, attempt, exit_code=127, why=why, final=True) == S.FAILED
    assert store.get(job_id).reason == f"{why} (exit code 127)"


def test_drains_and_undrains_are_kept_per_device(store: Store) -> None:
    d = store.drains
    d.drain("n1", 0, by="root", reason="bad fan")
    d.drain("n2", WHOLE_NODE, by="root")
    assert [(x.node, x.device, x.reason) for x in d.drained()] == [
        ("n1", 0, "bad fan"),
        ("n2", WHOLE_NODE, ""),
    ]
    assert d.drained()[0].describe() == "n1/0 drained by root: bad fan"
    assert d.undrains("n1") == {}
    d.undrain("n1", 0, by="admin2")
    assert [x.node for x in d.drained()] == ["n2"]
    assert set(d.undrains("n1")) == {0}
    d.undrain("n2", WHOLE_NODE, by="root")
    assert d.drained() == []


def test_undraining_a_node_keeps_the_drains_set_on_its_devices(store: Store) -> None:
    """An SRE's trap: ``ebb node undrain gpu-a`` silently lifted the fan drain of
    gpu-a/1; a device's own drain is a separate decision from the node's."""
    store.drains.drain("n1", 1, by="root", reason="fan")
    store.drains.drain("n1", WHOLE_NODE, by="root", reason="upgrade")
    store.drains.drain("n2", 0, by="root", reason="other node")
    store.drains.undrain("n1", WHOLE_NODE, by="admin2")
    assert [(d.node, d.device, d.by, d.reason) for d in store.drains.drained()] == [
        ("n1", 1, "root", "fan"),
        ("n2", 0, "root", "other node"),
    ]
    # the agent clears held faults on every device from the node's undrain
    assert set(store.drains.undrains("n1")) == {WHOLE_NODE}
    store.drains.undrain("n1", 1, by="admin2")
    assert [d.node for d in store.drains.drained()] == ["n2"]
    assert set(store.drains.undrains("n1")) == {1, WHOLE_NODE}


@pytest.mark.parametrize("device", [0, WHOLE_NODE])
def test_drain_twice_keeps_one_row(store: Store, device: int) -> None:
    store.drains.drain("n1", device, by="a", reason="one")
    store.drains.drain("n1", device, by="b", reason="two")
    [x] = store.drains.drained()
    assert (x.by, x.reason) == ("b", "two")


def test_a_job_lost_max_losses_times_is_held_and_qrls_forgives(store: Store) -> None:
    """A job whose node keeps going away is held with the reason, not restarted in a
    loop; losses do not count as failures; ``qrls`` starts the count again."""
    job_id = submit(store, max_attempts=1)
    for n in range(1, 3):
        store.requeue_lost(job_id, start(store, job_id), why="node n1 stopped", max_losses=3)
        assert store.get(job_id).state == S.QUEUED, n
    store.requeue_lost(job_id, start(store, job_id), why="node n1 stopped", max_losses=3)
    job = store.get(job_id)
    assert job.state == S.HELD and job.failures == 0
    assert job.reason == (
        "held: lost 3 times (max_losses 3), last: node n1 stopped; qrls to try again"
    )
    assert [e["type"] for e in store.events(job_id)][-3:] == ["lost", "requeued", "held"]
    store.release(job_id, user="u", admin=True)
    store.requeue_lost(job_id, start(store, job_id), why="node n1 stopped", max_losses=3)
    assert store.get(job_id).state == S.QUEUED  # one loss since the release


def test_a_lost_job_that_was_being_cancelled_is_cancelled_not_held(store: Store) -> None:
    job_id = submit(store)
    attempt = start(store, job_id)
    store.cancel(job_id, user="u", admin=True)
    store.requeue_lost(job_id, attempt, why="node n1 stopped", max_losses=1)
    assert store.get(job_id).state == S.CANCELLED
