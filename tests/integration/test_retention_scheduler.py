"""The leading scheduler purges old finished jobs on its own, at most every
``retention.every``, on a fake clock; a standby, a deposed leader and a policy without
``retention.finished_jobs`` purge nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ebbtide.clock import FakeClock
from ebbtide.config.policy import Policy, parse_policy
from ebbtide.errors import NotLeader
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import LEADERSHIP, Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.scheduling.retention import Retention

HOUR_S = 3600.0
POLICY = "retention:\n  finished_jobs: 1h\n  every: 1h\n  batch: 1\n"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url, clock=FakeClock())
    yield s
    s.close()


def clock(store: Store) -> FakeClock:
    assert isinstance(store.clock, FakeClock)
    return store.clock


def finished(store: Store) -> int:
    [job_id] = store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30.0)
    store.cancel(job_id, user="alice")
    return job_id


def ids(store: Store) -> list[int]:
    return [job.id or 0 for job in store.list_jobs()]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.02)


def retention(store: Store, policy: Policy, *, leading: bool = True) -> Retention:
    return Retention(
        lambda: store, lambda: policy, clock=store.clock, leading=lambda: leading, pause_s=0.0
    )


def test_the_leading_scheduler_purges_at_most_every_retention_every(store: Store) -> None:
    first, second, third = (finished(store) for _ in range(3))
    clock(store).advance(HOUR_S / 2)
    queued = store.submit(JobSpec(command=["y"]), "bob", defaults_deadline_s=30.0)[0]
    scheduler = Scheduler(store, policy=parse_policy(POLICY), clock=store.clock, wakeups=False)
    scheduler.retention.poll_s = 0.02
    scheduler.retention.pause_s = 0.0
    scheduler.start()
    try:
        # the first look comes at once: nothing has finished an hour ago yet
        wait_for(lambda: scheduler.retention.last_result is not None, "the first purge")
        assert scheduler.retention.last_run_at == clock(store).time()
        assert ids(store) == [first, second, third, queued]

        clock(store).advance(HOUR_S / 2 + 1)  # old enough now, but the last purge was 30m ago
        time.sleep(0.2)
        assert ids(store) == [first, second, third, queued]

        clock(store).advance(HOUR_S / 2)  # an hour since the last purge: one is due
        wait_for(lambda: ids(store) == [queued], "the old finished jobs to go")

        def purged() -> int:
            result = scheduler.retention.last_result
            return result.jobs if result is not None else 0

        wait_for(lambda: purged() == 3, "the purge's result")
        result = scheduler.retention.last_result
        assert result is not None and (result.batches, result.kept) == (3, 0)
    finally:
        scheduler.stop()
    assert store.get(queued).state == "queued"


def test_without_finished_jobs_in_the_policy_nothing_is_ever_purged(store: Store) -> None:
    job_id = finished(store)
    clock(store).advance(400 * 86400.0)
    keeper = retention(store, Policy())
    assert keeper.run_due() is None
    assert ids(store) == [job_id]


def test_a_standby_purges_nothing(store: Store) -> None:
    job_id = finished(store)
    clock(store).advance(2 * HOUR_S)
    standby = retention(store, parse_policy(POLICY), leading=False)
    assert standby.run_due() is None
    assert ids(store) == [job_id]


def test_a_deposed_leader_purges_nothing(store: Store) -> None:
    job_id = finished(store)
    clock(store).advance(2 * HOUR_S)
    deposed = store.fenced(0)  # the epoch a fresh store starts at
    with store.engine.begin() as conn:  # another scheduler takes the lead
        conn.execute(LEADERSHIP.update().values(epoch=LEADERSHIP.c.epoch + 1))
    keeper = Retention(
        lambda: deposed,
        lambda: parse_policy(POLICY),
        clock=store.clock,
        leading=lambda: True,
        pause_s=0.0,
    )
    with pytest.raises(NotLeader):
        keeper.run_due()
    assert ids(store) == [job_id]


def test_a_purge_stops_between_batches_when_the_scheduler_stops_leading(store: Store) -> None:
    for _ in range(4):
        finished(store)
    clock(store).advance(2 * HOUR_S)
    leading = [True]
    keeper = Retention(
        lambda: store,
        lambda: parse_policy(POLICY),
        clock=store.clock,
        leading=lambda: leading[0],
        pause_s=0.0,
    )
    real_purge = store.purge_batches

    def one_then_depose(*args, **kwargs):  # type: ignore[no-untyped-def]
        for step in real_purge(*args, **kwargs):
            leading[0] = False  # deposed while the first batch ran
            yield step

    store.purge_batches = one_then_depose  # type: ignore[method-assign]
    result = keeper.run_due()
    assert result is not None and (result.jobs, result.batches) == (1, 1)
    assert len(ids(store)) == 3


def test_a_policy_reload_applies_to_the_next_purge(store: Store, tmp_path: Path) -> None:
    job_id = finished(store)
    clock(store).advance(2 * HOUR_S)
    path = tmp_path / "policy.yaml"
    path.write_text("retention:\n  finished_jobs: 3h\n")
    scheduler = Scheduler(store, policy_path=path, clock=store.clock, wakeups=False)
    scheduler.runtime.request_reload()
    scheduler.runtime.maybe_reload()
    scheduler._lead_as(True)
    result = scheduler.retention.run_due()
    assert result is not None and result.jobs == 0
    path.write_text("retention:\n  finished_jobs: 1h\n  every: 1m\n")
    scheduler.runtime.request_reload()
    scheduler.runtime.maybe_reload()
    clock(store).advance(60)
    result = scheduler.retention.run_due()
    assert result is not None and result.jobs == 1
    assert job_id not in ids(store)
