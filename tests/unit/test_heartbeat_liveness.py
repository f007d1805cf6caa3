"""Heartbeats with liveness in Redis (``ebbtide.messaging.liveness``), on a fake clock: the
store sees a node's changes, not that it is alive, while the leading scheduler reads the
touches; a touch that fails, or finds no such scheduler, brings the write period back,
and the agent counts a touch as a heartbeat only when a scheduler reads it."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.clock import FakeClock
from ebbtide.messaging.liveness import (
    PAUSE_AFTER_FAILURE_S,
    RELAYED_WRITE_PERIOD_S,
    RedisLiveness,
    blind_grace_s,
    heartbeat_slack_s,
    reader_ttl_ms,
)
from ebbtide.workers.heartbeat import (
    SHRINK_DEADBAND_COMPUTE_PCT,
    TOUCHED,
    WRITTEN,
    HeartbeatRules,
    HeartbeatWriter,
    why_write,
)
from ebbtide.workers.sync import StoreSync
from tests.unit.test_heartbeat_writes import FakeStore, beat, device, store_thread

RULES = HeartbeatRules.for_timeout(10.0)


class FakeLiveness:
    """Redis as the agent sees it: up or down, with or without a reading scheduler."""

    def __init__(self) -> None:
        self.touches: list[str] = []
        self.up = True
        self.read = True

    def touch(self, node: str) -> bool | None:
        if not self.up:
            return None
        self.touches.append(node)
        return self.read


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def relayed_writer(clock: FakeClock, store: FakeStore, liveness: FakeLiveness) -> HeartbeatWriter:
    w = HeartbeatWriter("n1", store, RULES, monotonic=clock.monotonic, liveness=liveness)
    assert w.offer(beat(device(online_compute_pct=40.0, online_memory_mib=20_000))) == WRITTEN
    return w


def offer_for(w: HeartbeatWriter, clock: FakeClock, seconds: float, payload: Any) -> list[str]:
    """Offer ``payload`` every half second for ``seconds``; what each offer did."""
    done = []
    for _ in range(round(seconds / 0.5)):
        clock.advance(0.5)
        done.append(str(w.offer(payload)))
    return done


def test_a_steady_node_is_written_once_a_relayed_period(clock: FakeClock) -> None:
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    same = beat(device(online_compute_pct=40.0, online_memory_mib=20_000))
    done = offer_for(w, clock, 60.0, same)
    assert done.count(WRITTEN) == 2  # every 30 s, not every 2.5 s
    assert done.count(TOUCHED) == len(done) - 2
    assert len(liveness.touches) == 1 + len(done)  # every offer touches Redis
    # never further apart than the relayed period
    assert RELAYED_WRITE_PERIOD_S == 30.0
    assert [i for i, d in enumerate(done) if d == WRITTEN] == [59, 119]  # 30 s, 60 s


def test_room_that_grew_past_the_deadband_is_written_within_the_write_period(
    clock: FakeClock,
) -> None:
    """A calmer device is room the scheduler could fill: as prompt as without Redis."""
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    calmer = beat(device(online_compute_pct=40.0 - 2 * SHRINK_DEADBAND_COMPUTE_PCT))
    done = offer_for(w, clock, RULES.period_s, calmer)
    assert done[-1] == WRITTEN and done.count(WRITTEN) == 1
    assert store.beats[-1]["devices"][0]["online_compute_pct"] == 40.0 - 2 * 2.0


def test_room_that_grew_inside_the_deadband_waits_for_the_relayed_period(
    clock: FakeClock,
) -> None:
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    a_little = beat(
        device(online_compute_pct=40.0 - SHRINK_DEADBAND_COMPUTE_PCT / 2, online_memory_mib=20_000)
    )
    assert WRITTEN not in offer_for(w, clock, 20.0, a_little)


def test_what_the_scheduler_acts_on_is_written_at_once_as_before(clock: FakeClock) -> None:
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    clock.advance(0.5)
    assert w.offer(beat(device(online_compute_pct=60.0, online_memory_mib=20_000))) == WRITTEN
    clock.advance(0.5)
    stopping = beat(device(online_compute_pct=60.0, online_memory_mib=20_000), stopping=True)
    assert w.offer(stopping) == WRITTEN


@pytest.mark.parametrize("fault", ["down", "no reader"])
def test_a_touch_that_fails_or_is_not_read_brings_the_write_period_back_at_once(
    clock: FakeClock, fault: str
) -> None:
    """Redis down (or restarted, or an older scheduler leading): the next offer writes
    if the last write is older than the write period, and the period holds again."""
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    same = beat(device(online_compute_pct=40.0, online_memory_mib=20_000))
    assert WRITTEN not in offer_for(w, clock, 10.0, same)
    liveness.up = fault != "down"
    liveness.read = fault != "no reader"
    done = offer_for(w, clock, 10.0, same)
    assert done[0] == WRITTEN  # 10.5 s since the last write: at once
    assert [i for i, d in enumerate(done) if d == WRITTEN] == [0, 5, 10, 15]  # every 2.5 s
    assert TOUCHED not in done


def test_why_write_names_the_relayed_period() -> None:
    d = device(online_compute_pct=40.0)
    assert why_write(beat(d), beat(d), 5.0, RULES, relayed=True) is None
    assert why_write(beat(d), beat(d), 5.0, RULES) == "write period"
    assert why_write(beat(d), beat(d), 29.6, RULES, relayed=True) == (
        "write period (liveness in Redis)"
    )


# -- fencing -----------------------------------------------------------------------------


def deliver_for(sync: StoreSync, clock: FakeClock, seconds: float) -> None:
    """Half a second at a time: the store answers (a reconcile's read), a heartbeat is
    journaled and delivered."""
    for _ in range(round(seconds / 0.5)):
        clock.advance(0.5)
        sync._contact()
        sync.journal.append("heartbeat")
        report = sync.journal.peek(timeout_s=0)
        assert report is not None
        assert sync._deliver(report)
        sync.journal.done(report)


def test_a_touch_the_scheduler_reads_is_a_heartbeat_it_has(clock: FakeClock) -> None:
    store, liveness = FakeStore(), FakeLiveness()
    sync = store_thread(clock, store, liveness)
    deliver_for(sync, clock, 20.0)
    assert len(store.beats) == 1  # only the first was written
    assert clock.monotonic() - sync.last_heartbeat_ok == 0.0


def test_a_touch_no_scheduler_reads_is_not_counted(clock: FakeClock) -> None:
    """Written at the write period then, which is what counts for the fence."""
    store, liveness = FakeStore(), FakeLiveness()
    liveness.read = False
    sync = store_thread(clock, store, liveness)
    deliver_for(sync, clock, 2.0)
    assert clock.monotonic() - sync.last_heartbeat_ok == pytest.approx(2.0)
    deliver_for(sync, clock, 0.5)
    assert clock.monotonic() - sync.last_heartbeat_ok == 0.0
    assert len(store.beats) == 2


def test_an_agent_cut_off_from_the_store_does_not_touch(clock: FakeClock) -> None:
    store, liveness = FakeStore(), FakeLiveness()
    w = relayed_writer(clock, store, liveness)
    touched = len(liveness.touches)
    clock.advance(0.5)
    assert (
        w.offer(beat(device(online_compute_pct=40.0, online_memory_mib=20_000)), touch=False)
        is None
    )
    assert len(liveness.touches) == touched


class Blind:
    def __init__(self, blind_s: float | None) -> None:
        self.blind_s = blind_s

    def blind_for_s(self) -> float | None:
        return self.blind_s


class Dialect:
    def __init__(self, name: str) -> None:
        self.name = name


class Engine:
    def __init__(self, name: str) -> None:
        self.dialect = Dialect(name)


class StoreLike:
    def __init__(self, liveness: Blind | None, dialect: str = "postgresql") -> None:
        self.liveness = liveness
        self.engine = Engine(dialect)


def test_how_old_a_live_nodes_store_heartbeat_may_look() -> None:
    """What `ebb node forget` and the name claim allow for."""
    assert heartbeat_slack_s(StoreLike(Blind(None))) == 0.0  # Redis read: current
    assert heartbeat_slack_s(StoreLike(Blind(3.0))) == RELAYED_WRITE_PERIOD_S
    # a fleet's PostgreSQL store read without Redis: agents may keep alive there
    assert heartbeat_slack_s(StoreLike(None)) == RELAYED_WRITE_PERIOD_S
    assert heartbeat_slack_s(StoreLike(None, "sqlite")) == 0.0  # one box, no Redis
    assert heartbeat_slack_s(object()) == 0.0  # the in-memory store


def test_the_grace_outlasts_the_mark_and_a_write_period() -> None:
    for timeout_s in (2.0, 10.0, 60.0, 3600.0):
        mark_s = reader_ttl_ms(timeout_s) / 1000
        grace_s = blind_grace_s(timeout_s)
        assert grace_s >= mark_s + RULES.for_timeout(timeout_s).period_s + 0.5
        assert mark_s <= timeout_s / 4
    assert blind_grace_s(10.0) == pytest.approx(8.5)


# -- the scheduler's view ----------------------------------------------------------------


class FakeRedis:
    """The few commands a scheduler's liveness sends; ``on_set`` runs inside SET."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.hash: dict[bytes, bytes] = {}
        self.down = False
        self.on_set: Any = None

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        if self.down:
            raise ConnectionError("connection refused")
        return dict(self.hash)

    def set(self, key: str, value: bytes, px: int) -> None:
        self.keys[key] = value
        if self.on_set is not None:
            hook, self.on_set = self.on_set, None
            hook()

    def delete(self, key: str) -> None:
        self.keys.pop(key, None)


def test_a_failed_read_before_a_term_does_not_cut_the_terms_grace(clock: FakeClock) -> None:
    """A review's finding: a process whose read failed an hour before it took the lead
    (an agent's claim, an earlier term) had no grace left when its first read as leader
    failed, and gave up every relaying node."""
    r = FakeRedis()
    liveness = RedisLiveness(r, "ns", clock=clock)
    r.down = True
    liveness.seen()
    clock.advance(3600.0)
    assert liveness.blind_for_s() == pytest.approx(3600.0)  # (claim and forget allow 30 s)
    liveness.lead(10.0)
    assert liveness.blind_for_s() == 0.0  # the grace counts from the term
    clock.advance(2.0)
    liveness.seen()
    assert liveness.blind_for_s() == pytest.approx(2.0)
    liveness.lead(10.0)  # the same term's next pass
    assert liveness.blind_for_s() == pytest.approx(2.0)
    r.down = False
    clock.advance(PAUSE_AFTER_FAILURE_S)  # no call is made for a while after a failure
    liveness.seen()
    assert liveness.blind_for_s() is None
    assert r.keys == {"ns.alive.reader": b"1"}  # marked only after a read that succeeded


def test_a_stand_down_during_a_read_leaves_no_mark(clock: FakeClock) -> None:
    """A review's finding: a metrics scrape's read set the mark again just after the
    scheduler stood down and removed it."""
    r = FakeRedis()
    liveness = RedisLiveness(r, "ns", clock=clock)
    liveness.lead(10.0)
    r.on_set = liveness.stand_down  # lands between the read and its SET
    liveness.seen()
    assert r.keys == {}
    liveness.seen()  # and a standby's reads mark nothing
    assert r.keys == {}


def test_the_hash_time_is_the_latest_not_the_largest(clock: FakeClock) -> None:
    """A review's finding: one touch stamped by a clock that ran ahead kept a dead node
    alive until the wall time caught up."""
    r = FakeRedis()
    liveness = RedisLiveness(r, "ns", clock=clock)
    r.hash = {b"n1": b"9999999999.0", b"n2": b"100.0"}
    liveness.seen()
    r.hash = {b"n1": b"200.0", b"n2": b"not a time", b"n3": b"nan"}
    assert liveness.seen() == {"n1": 200.0, "n2": 100.0}  # n2 kept from before


def test_a_url_that_is_not_redis_is_named_as_the_setting() -> None:
    from ebbtide.errors import ConfigError

    liveness = RedisLiveness.from_url("foo://bar", "ns")
    with pytest.raises(ConfigError, match=r"^EBBTIDE_REDIS_URL: foo://bar: Redis URL must"):
        liveness.seen()
