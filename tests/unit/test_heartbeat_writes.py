"""When a node agent's heartbeat reaches the store (``ebbtide.workers.heartbeat``), on a
fake clock: what the scheduler must act on is written at once, the rest once a period,
and the agent still fences its attempts when the store does not answer."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import sqlalchemy as sa

from ebbtide.clock import FakeClock
from ebbtide.messaging.messages import DeviceReport
from ebbtide.workers.heartbeat import (
    HEARTBEAT_WRITE_PERIOD_S,
    SHRINK_DEADBAND_COMPUTE_PCT,
    SHRINK_DEADBAND_MEMORY_MIB,
    HeartbeatRules,
    HeartbeatWriter,
    why_write,
    write_period_s,
)
from ebbtide.workers.journal import Journal
from ebbtide.workers.sync import StoreSync

RULES = HeartbeatRules()


def device(index: int = 0, **fields: Any) -> dict[str, Any]:
    return DeviceReport.model_validate(
        {"index": index, "memory_mib": 81920.0, **fields}
    ).model_dump(mode="json")


def beat(
    *devices: dict[str, Any], stopping: bool = False, started_at: float = 1.0
) -> dict[str, Any]:
    return {
        "started_at": started_at,
        "devices": list(devices) or [device()],
        "stopping": stopping,
    }


class FakeStore:
    """Takes heartbeats (or refuses every call, like a store that does not answer)."""

    def __init__(self) -> None:
        self.beats: list[dict[str, Any]] = []
        self.down = False
        self.reads_only = False

    def heartbeat(
        self,
        node: str,
        *,
        started_at: float,
        devices: list[dict[str, Any]],
        stopping: bool = False,
        runs_jobs_of: str | None = None,
    ) -> None:
        if self.down or self.reads_only:
            raise sa.exc.OperationalError("UPDATE nodes", {}, OSError("connection refused"))
        self.beats.append({"started_at": started_at, "devices": devices, "stopping": stopping})

    def active_attempts(self, node: str | None = None) -> list[Any]:
        if self.down:
            raise sa.exc.OperationalError("SELECT attempts", {}, OSError("connection refused"))
        return []


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def writer(clock: FakeClock, store: FakeStore | None = None) -> HeartbeatWriter:
    w = HeartbeatWriter("n1", store or FakeStore(), RULES, monotonic=clock.monotonic)
    assert w.offer(beat(device(online_compute_pct=40.0, online_memory_mib=20_000)))
    return w


def test_the_write_period_fits_inside_the_timeout() -> None:
    assert write_period_s(60.0) == HEARTBEAT_WRITE_PERIOD_S
    assert write_period_s(10.0) == pytest.approx(2.5)
    assert write_period_s(2.0) == pytest.approx(0.5)
    # the agent fences (and its shims kill) at half the timeout: a stopped agent's
    # attempts are dead three quarters of a timeout after its last write at the latest
    assert write_period_s(2.0) + 2.0 / 2 < 2.0


def test_writes_are_never_further_apart_than_the_period(clock: FakeClock) -> None:
    """Heartbeats are offered every half second: the write falls on the last offer
    within the period, not on the first one past it (a review's finding: a 0.6 s period
    wrote every 1.0 s)."""
    store = FakeStore()
    w = HeartbeatWriter("n1", store, HeartbeatRules(period_s=1.2), monotonic=clock.monotonic)
    written_at = []
    for _ in range(13):
        if w.offer(beat(device(online_compute_pct=40.0))):
            written_at.append(clock.monotonic())
        clock.advance(0.5)
    gaps = [b - a for a, b in pairwise(written_at)]
    assert gaps == [1.0] * 6  # the first, then every second offer


def test_the_deadbands_stay_within_half_the_policys_margins() -> None:
    rules = HeartbeatRules.for_policy(10.0, 5.0, 2048.0)
    assert (rules.deadband_compute_pct, rules.deadband_memory_mib) == (2.0, 256.0)
    rules = HeartbeatRules.for_policy(10.0, 0.0, 0.0)  # no margin: every shrink at once
    assert (rules.deadband_compute_pct, rules.deadband_memory_mib) == (0.0, 0.0)
    small = HeartbeatRules.for_policy(10.0, 1.0, 100.0)
    assert (small.deadband_compute_pct, small.deadband_memory_mib) == (0.5, 50.0)


def test_the_first_heartbeat_is_written(clock: FakeClock) -> None:
    store = FakeStore()
    writer(clock, store)
    assert len(store.beats) == 1


def test_nothing_changed_waits_for_the_period(clock: FakeClock) -> None:
    store = FakeStore()
    w = writer(clock, store)
    same = beat(device(online_compute_pct=40.0, online_memory_mib=20_000))
    for _ in range(5):
        clock.advance(0.5)
        assert not w.offer(same)
    clock.advance(RULES.period_s - 2.5)
    assert w.offer(same)  # the period holds: the node stays alive in the store
    assert len(store.beats) == 2
    clock.advance(0.5)
    assert not w.offer(same)  # and counts again from this write


def test_room_that_shrank_is_written_at_once(clock: FakeClock) -> None:
    w = writer(clock)
    clock.advance(0.5)
    assert w.offer(beat(device(online_compute_pct=60.0, online_memory_mib=20_000)))
    clock.advance(0.5)
    assert w.offer(beat(device(online_compute_pct=60.0, online_memory_mib=30_000)))
    clock.advance(0.5)  # a reserve that grows takes room as well
    grown = device(online_compute_pct=60.0, online_memory_mib=30_000, reserve_memory_mib=4096)
    assert w.offer(beat(grown))


def test_room_that_grew_waits_for_the_period(clock: FakeClock) -> None:
    store = FakeStore()
    w = writer(clock, store)
    calmer = beat(device(online_compute_pct=5.0, online_memory_mib=1_000))
    clock.advance(0.5)
    assert not w.offer(calmer)
    clock.advance(RULES.period_s)
    assert w.offer(calmer)
    assert store.beats[-1]["devices"][0]["online_compute_pct"] == 5.0


def test_a_shrink_inside_the_deadband_waits_but_a_creeping_one_is_written(
    clock: FakeClock,
) -> None:
    w = writer(clock)
    step = SHRINK_DEADBAND_COMPUTE_PCT * 0.6
    clock.advance(0.5)
    assert not w.offer(beat(device(online_compute_pct=40.0 + step, online_memory_mib=20_000)))
    clock.advance(0.5)  # measured from the figures written, not the last ones offered
    assert w.offer(beat(device(online_compute_pct=40.0 + 2 * step, online_memory_mib=20_000)))
    clock.advance(0.5)
    less_memory = 20_000 + SHRINK_DEADBAND_MEMORY_MIB / 2
    assert not w.offer(
        beat(device(online_compute_pct=40.0 + 2 * step, online_memory_mib=less_memory))
    )


def test_a_stopping_node_is_written_at_once(clock: FakeClock) -> None:
    store = FakeStore()
    w = writer(clock, store)
    clock.advance(0.1)
    assert w.offer(beat(device(online_compute_pct=40.0, online_memory_mib=20_000), stopping=True))
    assert store.beats[-1]["stopping"] is True


def test_whose_jobs_a_node_runs_is_written_at_once(clock: FakeClock) -> None:
    """Submissions are checked against it: a reload that lets root's jobs run (or no
    longer) must not wait a write period."""
    w = writer(clock, FakeStore())
    d = device(online_compute_pct=40.0, online_memory_mib=20_000)
    clock.advance(0.1)
    assert w.offer({**beat(d), "runs_jobs_of": "users"})
    clock.advance(0.1)
    assert not w.offer({**beat(d), "runs_jobs_of": "users"})
    later = {**beat(d), "runs_jobs_of": "any"}
    assert why_write(w.written, later, 0.1, RULES) == "whose jobs it runs changed"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"health": "unhealthy", "fault": {"xid": 79, "meaning": "fell off the bus"}}, "health"),
        ({"sample_ok": False}, "sample_ok"),
        ({"last_eviction_at": 1_700_000_000.0}, "last_eviction_at"),
        ({"eviction_trigger": False}, "eviction_trigger"),
    ],
)
def test_what_changes_admission_is_written_at_once(
    clock: FakeClock, change: dict[str, Any], why: str
) -> None:
    w = writer(clock)
    clock.advance(0.1)
    now = beat(device(online_compute_pct=40.0, online_memory_mib=20_000, **change))
    assert why in (why_write(w.written, now, 0.1, RULES) or "")
    assert w.offer(now)


def test_a_device_that_comes_or_goes_is_written_at_once(clock: FakeClock) -> None:
    w = writer(clock)
    clock.advance(0.1)
    assert w.offer(beat(device(online_compute_pct=40.0, online_memory_mib=20_000), device(1)))


def test_what_is_only_shown_waits(clock: FakeClock) -> None:
    w = writer(clock)
    clock.advance(0.1)
    shown = device(
        online_compute_pct=40.0,
        online_memory_mib=20_000,
        offline_compute_pct=30.0,
        online_pods=["serving/llm-0"],
        sampled_at=1_700_000_001.0,
        reserve_cold_for_s=12.0,
    )
    assert not w.offer(beat(shown))


def test_every_heartbeat_is_written_under_the_old_rule(clock: FakeClock) -> None:
    store = FakeStore()
    w = HeartbeatWriter("n1", store, HeartbeatRules(every=True), monotonic=clock.monotonic)
    for _ in range(4):
        w.offer(beat())
        clock.advance(0.5)
    assert len(store.beats) == 4


def test_a_heartbeat_the_store_did_not_take_stays_due(clock: FakeClock) -> None:
    store = FakeStore()
    w = writer(clock, store)
    clock.advance(RULES.period_s)
    store.down = True
    with pytest.raises(sa.exc.OperationalError):
        w.offer(beat())
    store.down = False
    assert w.offer(beat())


# -- fencing -----------------------------------------------------------------------------


def store_thread(clock: FakeClock, store: FakeStore, liveness: Any = None) -> StoreSync:
    """A node's store thread on ``store`` (and ``liveness``: Redis, where given), its
    first heartbeat written."""
    payload = beat(device(online_compute_pct=40.0))
    journal = Journal(None)
    sync = StoreSync(
        "n1",
        store,  # type: ignore[arg-type]
        journal,
        post=lambda _item: None,
        view=lambda: (journal.seq, {}),
        heartbeat=lambda: payload,
        heartbeat_rules=HeartbeatRules.for_timeout(10.0),
        monotonic=clock.monotonic,
        liveness=liveness,
    )
    sync.write_heartbeat()
    return sync


def tick(sync: StoreSync, clock: FakeClock, seconds: float) -> None:
    """Half a second at a time: journal a heartbeat, deliver it, reconcile."""
    for _ in range(round(seconds / 0.5)):
        clock.advance(0.5)
        sync.journal.append("heartbeat")
        report = sync.journal.peek(timeout_s=0)
        assert report is not None
        if sync._deliver(report):
            sync._reconcile()


def test_a_node_in_touch_with_the_store_is_not_silent_between_writes(clock: FakeClock) -> None:
    store = FakeStore()
    sync = store_thread(clock, store)
    tick(sync, clock, 20.0)
    assert sync.silence_s() <= 0.5
    assert 5 <= len(store.beats) <= 9  # one a write period, not forty


def test_a_store_that_does_not_answer_leads_to_the_fence(clock: FakeClock) -> None:
    store = FakeStore()
    sync = store_thread(clock, store)
    tick(sync, clock, 2.0)
    store.down = True
    tick(sync, clock, 4.5)
    assert sync.silence_s() < 5.0  # not yet half the 10 s timeout
    tick(sync, clock, 0.5)
    assert sync.silence_s() >= 5.0  # the agent fences here, 5 s before the scheduler gives up


def test_writes_failing_while_reads_pass_still_lead_to_the_fence(clock: FakeClock) -> None:
    store = FakeStore()
    sync = store_thread(clock, store)
    store.reads_only = True
    period_s = sync.heartbeats.rules.period_s
    tick(sync, clock, 10.0 / 2)
    assert sync.silence_s() < 5.0  # contact until the next write fell due
    tick(sync, clock, period_s)
    # fenced at most a write period later than by contact alone: still before the
    # scheduler's timeout, counted from the last write
    assert sync.silence_s() >= 5.0
    assert 10.0 / 2 + period_s < 10.0
