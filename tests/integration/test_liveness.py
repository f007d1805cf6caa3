"""Node liveness in Redis (``ebbtide.messaging.liveness``) on the real server, with a real
store and the live scheduler's snapshot and reconciliation, on a fake clock: a node whose
heartbeats reach Redis alone stays alive; one that stops is given up within the timeout
as before; a Redis that goes away or is emptied sends agents back to the store before
the scheduler could take them for silent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from ebbtide.clock import FakeClock
from ebbtide.config.policy import Policy
from ebbtide.messaging.liveness import (
    READER_TTL_MS,
    RedisLiveness,
    blind_grace_s,
    reader_ttl_ms,
)
from ebbtide.messaging.messages import DeviceReport
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.workers.heartbeat import TOUCHED, WRITTEN, HeartbeatRules, HeartbeatWriter

pytestmark = pytest.mark.redis

TIMEOUT_S = Policy().defaults.heartbeat_timeout_s


def beat() -> dict[str, Any]:
    device = DeviceReport(
        index=0, memory_mib=81920.0, online_compute_pct=10.0, online_memory_mib=10_000
    )
    return {"started_at": 1.0, "devices": [device.model_dump(mode="json")], "stopping": False}


class World:
    def __init__(self, tmp_path: Path, url: str) -> None:
        self.clock = FakeClock()
        self.namespace = f"ebbtide-test-{uuid.uuid4().hex[:8]}"
        self.redis = redis.Redis.from_url(url)
        self.store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=self.clock)
        self.store.liveness = RedisLiveness(self.redis, self.namespace, clock=self.clock)
        self.scheduler = Scheduler(
            self.store,
            policy=Policy(),
            clock=self.clock,
            wakeups=False,
            liveness=self.store.liveness,
        )
        # the agent's own connection, as on its own host
        self.agent_liveness = RedisLiveness(
            redis.Redis.from_url(url), self.namespace, clock=self.clock
        )
        self.writer = HeartbeatWriter(
            "n1",
            self.store,
            HeartbeatRules.for_timeout(TIMEOUT_S),
            monotonic=self.clock.monotonic,
            liveness=self.agent_liveness,
        )

    def alive(self) -> bool:
        return [d.node for d in self.scheduler.snapshot(self.clock.time()).devices] == ["n1"]

    def lead(self) -> None:
        """What a pass does: lead, then read the nodes (which marks the reader key)."""
        assert self.scheduler.liveness is not None
        self.scheduler.liveness.lead(TIMEOUT_S)
        self.store.nodes()

    def requeues(self) -> set[tuple[int, int]]:
        return self.scheduler.reconcile(self.clock.time())

    def close(self) -> None:
        for key in self.redis.scan_iter(match=f"{self.namespace}*"):
            self.redis.delete(key)
        self.store.close()
        self.agent_liveness.close()


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> Iterator[World]:
    w = World(tmp_path, redis_url)
    yield w
    w.close()


def test_a_node_alive_in_redis_stays_with_few_writes_and_a_silent_one_is_given_up(
    world: World,
) -> None:
    w = world
    w.lead()
    for _ in range(int(6 * TIMEOUT_S / 0.5)):  # a minute of nothing changing
        w.writer.offer(beat())
        if w.clock.monotonic() % 1.0 == 0:
            w.lead()
        assert w.alive()
        w.clock.advance(0.5)
    assert w.writer.writes == 2  # the first, and one after the relayed period (30 s)
    assert w.store.nodes()[0].heartbeat_at == pytest.approx(w.clock.time() - 0.5)
    # the agent is gone: given up a timeout after its last touch
    silent_at = w.clock.time() - 0.5
    w.clock.advance(TIMEOUT_S - 0.5 - 0.1)
    assert w.alive()
    w.clock.advance(0.2)
    assert not w.alive()
    assert w.clock.time() - silent_at == pytest.approx(TIMEOUT_S + 0.1)


def test_without_a_scheduler_reading_agents_write_as_before(world: World) -> None:
    """An older scheduler never marks the reader key: every write period is written."""
    w = world
    for _ in range(int(2 * TIMEOUT_S / 0.5)):
        w.writer.offer(beat())
        w.clock.advance(0.5)
    assert w.writer.writes == 1 + 7  # every 2.5 s over 20 s
    assert w.writer.relayed == 0


def test_the_readers_mark_expires(world: World) -> None:
    w = world
    assert w.agent_liveness.touch("n1") is False
    w.lead()
    assert w.agent_liveness.touch("n1") is True
    ttl = w.redis.pttl(w.agent_liveness.reader_key)
    assert 0 < ttl <= READER_TTL_MS


def test_the_readers_mark_lasts_at_most_a_quarter_of_the_timeout() -> None:
    """Once the scheduler stops reading, agents must be back to writing long before it
    gives their nodes up a timeout after its last read."""
    assert reader_ttl_ms(10.0) == READER_TTL_MS == 2_500
    assert reader_ttl_ms(2.0) == 500
    assert reader_ttl_ms(3600.0) == READER_TTL_MS


def test_a_pass_marks_the_reader(world: World) -> None:
    world.scheduler.run_once()
    assert world.agent_liveness.touch("n1") is True


def test_an_emptied_redis_loses_no_node(world: World) -> None:
    """Redis keeps nothing on disk: after a restart the hash is empty.  The scheduler keeps
    the times it read for a node the hash lost; an agent whose touch finds no mark writes
    to the store; the next touches fill the hash again."""
    w = world
    w.lead()
    for _ in range(20):
        w.writer.offer(beat())
        assert w.alive()
        w.clock.advance(0.5)
    assert w.writer.writes == 1
    w.redis.delete(w.agent_liveness.key, w.agent_liveness.reader_key)  # the restart
    assert w.writer.offer(beat()) == WRITTEN  # no mark: the write period is back
    w.redis.delete(w.agent_liveness.key)
    assert w.alive()  # the time read before (and the mark is set again)
    for _ in range(int(2 * TIMEOUT_S / 0.5)):
        assert w.writer.offer(beat()) in (TOUCHED, None)
        assert w.alive()
        w.clock.advance(0.5)
    assert w.writer.writes == 2


def test_a_redis_that_does_not_answer_loses_no_node(world: World) -> None:
    w = world
    w.lead()
    for _ in range(20):
        w.writer.offer(beat())
        w.clock.advance(0.5)
    assert w.writer.writes == 1
    # both ends lose Redis (a port nothing listens on)
    gone = unreachable()
    w.agent_liveness._client = gone
    w.store.liveness._client = gone  # type: ignore[union-attr]
    assert w.alive()  # the times read before
    assert w.agent_liveness.touch("n1") is None
    assert w.writer.offer(beat()) == WRITTEN
    for _ in range(int(2 * TIMEOUT_S / 0.5)):
        w.writer.offer(beat())
        assert w.alive()
        w.clock.advance(0.5)


def test_forgetting_a_node_forgets_its_liveness(world: World) -> None:
    w = world
    w.writer.offer(beat())
    assert "n1" in w.store.liveness.seen()  # type: ignore[union-attr]
    w.store.forget_node("n1")
    assert w.store.nodes() == []
    assert "n1" not in w.store.liveness.seen()  # type: ignore[union-attr]
    assert w.redis.hget(w.agent_liveness.key, "n1") is None


def start_on_n1(store: Store) -> int:
    """A job running on n1, as the scheduler and its agent would leave it."""
    from ebbtide.queue.spec import JobSpec

    [job_id] = store.submit(JobSpec(command=["true"], memory_mib=1024), "u", defaults_deadline_s=30)
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024
    )
    store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    return job_id


def test_a_new_leader_that_cannot_read_redis_gives_no_node_up_until_agents_write_again(
    world: World, tmp_path: Path
) -> None:
    """A review's finding: the leader dies; a standby takes over and its first read of
    the hash fails, while the agents still find the old leader's mark and skip the store.
    It must not take their store heartbeats, up to 30 s old, for silence; by the end of
    its grace every agent is writing to the store again."""
    w = world
    job_id = start_on_n1(w.store)
    w.lead()
    for _ in range(40):  # 20 s on Redis alone
        assert w.writer.offer(beat()) in (WRITTEN, TOUCHED)
        w.clock.advance(0.5)
    assert w.writer.writes == 1
    # the standby: its own store and a Redis it cannot reach
    standby_store = Store(w.store.url, clock=w.clock)
    standby_store.liveness = RedisLiveness(None, w.namespace, clock=w.clock, connect=unreachable)
    standby = Scheduler(
        standby_store,
        policy=Policy(),
        clock=w.clock,
        wakeups=False,
        liveness=standby_store.liveness,
    )
    try:
        standby.liveness.lead(TIMEOUT_S)  # type: ignore[union-attr]
        grace_s = blind_grace_s(TIMEOUT_S)
        requeued = set()
        for step in range(int(3 * grace_s / 0.5)):
            requeued |= standby.reconcile(w.clock.time())
            if step * 0.5 >= READER_TTL_MS / 1000:  # Redis keeps real time: as it would
                w.redis.delete(w.agent_liveness.reader_key)
            w.writer.offer(beat())  # the old leader's mark gone: agents write again
            w.clock.advance(0.5)
        assert requeued == set()
        assert w.store.get(job_id).state == "running"
        assert w.writer.writes > 1
    finally:
        standby_store.close()


def unreachable() -> Any:
    return RedisLiveness.from_url("redis://127.0.0.1:1/0", "x")._redis()


def test_a_node_whose_agent_is_silent_is_given_up_after_the_grace_even_when_blind(
    world: World,
) -> None:
    """Blind for good (Redis gone for the scheduler): a dead node is still given up, once
    the grace is over."""
    w = world
    job_id = start_on_n1(w.store)
    w.lead()
    w.writer.offer(beat())
    w.store.liveness._client = unreachable()  # type: ignore[union-attr]
    assert w.requeues() == set()  # the first blind read
    w.clock.advance(blind_grace_s(TIMEOUT_S) + TIMEOUT_S)
    assert {j for j, _ in w.requeues()} == {job_id}


def test_an_agent_cut_off_from_the_store_stops_touching(world: World) -> None:
    """A review's finding: an agent that reaches Redis but not the store kept its node
    alive for ever, its attempts fenced and never requeued."""
    from ebbtide.workers.journal import Journal
    from ebbtide.workers.sync import StoreSync

    w = world
    w.lead()
    journal = Journal(None)
    sync = StoreSync(
        "n1",
        w.store,
        journal,
        post=lambda _item: None,
        view=lambda: (journal.seq, {}),
        heartbeat=beat,
        heartbeat_rules=HeartbeatRules.for_timeout(TIMEOUT_S),
        clock=w.clock,
        liveness=w.agent_liveness,
    )
    sync.write_heartbeat()

    def offer(contact: bool) -> bool:
        """Half a second on: a heartbeat offered (after a reconcile that reached the
        store, or not); whether it touched Redis."""
        w.clock.advance(0.5)
        if contact:
            sync._contact()
        journal.append("heartbeat")
        report = journal.peek(timeout_s=0)
        assert report is not None
        before = w.redis.hget(w.agent_liveness.key, "n1")
        sync._deliver(report)
        journal.done(report)
        return w.redis.hget(w.agent_liveness.key, "n1") != before

    assert all(offer(contact=True) for _ in range(10))

    def no_answer(*_args: Any, **_kwargs: Any) -> None:
        raise sa.exc.OperationalError("UPDATE nodes", {}, OSError("connection refused"))

    w.store.heartbeat = no_answer  # type: ignore[method-assign]  # the store is cut off
    period_s = sync.heartbeats.rules.period_s
    touched = [offer(contact=False) for _ in range(int(2 * period_s / 0.5))]
    assert touched == [True] * int(period_s / 0.5) + [False] * int(period_s / 0.5)
    # so the scheduler gives the node up a timeout after the last touch, and the agent
    # fenced its attempts half a timeout after its last contact, well before
    assert sync.silence_s() >= 2 * period_s


@pytest.mark.postgres
def test_a_client_that_cannot_see_redis_says_so_and_allows_for_it(
    postgres_url: str, tmp_path: Path
) -> None:
    """A trial's trap: `ebb nodes` on a box without EBBTIDE_REDIS_URL called every live
    node of a fleet "silent" (their store heartbeats are up to 30 s old)."""
    import time

    from ebbtide.client import Client
    from ebbtide.config.settings import Settings
    from ebbtide.identity import Caller

    store = Store(postgres_url, clock=FakeClock(time.time() - 20.0))
    store.heartbeat("n1", started_at=1.0, devices=beat()["devices"])
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path), "EBBTIDE_DB_URL": postgres_url})
    with Client(settings, store=store, caller=Caller("root", admin=True, via="test")) as client:
        [node] = client.nodes()
        assert node["heartbeat_age_s"] >= 20.0
        assert node["heartbeat_may_lag_s"] == 30.0
        assert (node["silent"], node["quiet"]) == (False, False)
        # one rule, worded once: the timeout, and what it is here and why
        with pytest.raises(Exception, match=r"after 10s of silence; 40s here, as nodes' "):
            client.forget_node("n1")
    store.close()
    # the command says why the ages are what they are
    import os
    import subprocess
    import sys

    env = {**os.environ, "EBBTIDE_HOME": str(tmp_path), "EBBTIDE_DB_URL": postgres_url}
    env.pop("EBBTIDE_REDIS_URL", None)
    ebb = str(Path(sys.executable).parent / "ebb")
    result = subprocess.run([ebb, "nodes"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "liveness is kept in Redis, not read here (set EBBTIDE_REDIS_URL)" in result.stderr
    assert "agent silent" not in result.stdout
    # a trial's trap: with the URL set but Redis down, the note still said "set it", and
    # the library's warning came unworded beside it
    env["EBBTIDE_REDIS_URL"] = "redis://:hunter22@127.0.0.1:1/0"  # nothing listens there
    result = subprocess.run([ebb, "nodes"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "which did not answer at EBBTIDE_REDIS_URL" in result.stderr
    assert "set EBBTIDE_REDIS_URL" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert all(line.startswith("ebb: ") for line in lines), result.stderr
    assert any(line.startswith("ebb: warning: Redis: ") for line in lines), result.stderr
    assert "hunter22" not in result.stderr + result.stdout
    assert "agent silent" not in result.stdout


def test_a_client_that_reads_redis_allows_nothing(world: World, tmp_path: Path) -> None:
    from ebbtide.client import Client
    from ebbtide.config.settings import Settings
    from ebbtide.identity import Caller

    w = world
    w.writer.offer(beat())
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path)})
    with Client(settings, store=w.store, caller=Caller("root", admin=True, via="test")) as client:
        [node] = client.nodes()
        assert node["heartbeat_may_lag_s"] == 0.0


def test_a_report_counts_a_node_up_to_its_heartbeat_in_redis(world: World) -> None:
    """``ebb report`` counts a node's span to its latest heartbeat, as ``ebb nodes`` does:
    the store's row, written every 30 s, would cut up to 30 s off it."""
    w = world
    w.lead()
    for _ in range(40):  # 20 s: the store's row stays at the first write
        w.writer.offer(beat())
        w.lead()
        w.clock.advance(0.5)
    assert w.writer.writes == 1
    [node] = w.store.report_rows(w.clock.time() - 60, w.clock.time())["nodes"]
    assert node["heartbeat_at"] == pytest.approx(w.clock.time() - 0.5)
    assert node["heartbeat_at"] == w.store.nodes()[0].heartbeat_at
