"""Heartbeats written by the rules (``ebbtide.workers.heartbeat``) against a real store and
the live scheduler's snapshot and planner, on a fake clock: a silent node is still given
up within the timeout, and room a node reported gone is never planned into."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ebbtide.clock import FakeClock
from ebbtide.config.policy import Policy
from ebbtide.messaging.messages import DeviceReport
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.loop import Scheduler
from ebbtide.scheduling.planner import plan
from ebbtide.workers.heartbeat import HeartbeatRules, HeartbeatWriter

DEVICE_MIB = 81920.0
TIMEOUT_S = Policy().defaults.heartbeat_timeout_s


def beat(online_memory_mib: float) -> dict[str, Any]:
    device = DeviceReport(
        index=0, memory_mib=DEVICE_MIB, online_compute_pct=10.0, online_memory_mib=online_memory_mib
    )
    return {"started_at": 1.0, "devices": [device.model_dump(mode="json")], "stopping": False}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeClock, Store, Scheduler, HeartbeatWriter]]:
    clock = FakeClock()
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=clock)
    scheduler = Scheduler(store, policy=Policy(), clock=clock, wakeups=False)
    rules = HeartbeatRules.for_timeout(TIMEOUT_S)
    writer = HeartbeatWriter("n1", store, rules, monotonic=clock.monotonic)
    yield clock, store, scheduler, writer
    store.close()


def test_a_quiet_node_stays_and_a_silent_one_is_given_up(world) -> None:  # type: ignore[no-untyped-def]
    clock, _store, scheduler, writer = world
    for _ in range(int(3 * TIMEOUT_S / 0.5)):  # nothing changes for three timeouts
        writer.offer(beat(10_000))
        assert [d.node for d in scheduler.snapshot(clock.time()).devices] == ["n1"]
        clock.advance(0.5)
    assert writer.writes < 3 * TIMEOUT_S / 0.5 / 4  # most heartbeats were not written
    # the agent is gone: no offer, no write; it is given up a timeout after its last
    # write, which is at most a write period before it went silent
    silent_at = clock.monotonic()
    clock.advance(TIMEOUT_S - (silent_at - writer.written_at) - 0.1)
    assert scheduler.snapshot(clock.time()).devices != []
    clock.advance(0.2)
    assert scheduler.snapshot(clock.time()).devices == []
    assert clock.monotonic() - silent_at <= TIMEOUT_S


def test_room_reported_gone_is_never_planned_into(world) -> None:  # type: ignore[no-untyped-def]
    clock, store, scheduler, writer = world
    writer.offer(beat(10_000))
    clock.advance(0.5)
    assert writer.offer(beat(70_000))  # the online side took 60 GiB: written at once
    store.submit(JobSpec(command=["true"], memory_mib=16_384), "u", defaults_deadline_s=30)
    decided = plan(scheduler.snapshot(clock.time()))
    assert decided.dispatches == []  # 80 - 70 GiB less the margin holds no 16 GiB slice
    clock.advance(0.5)
    assert not writer.offer(beat(10_000))  # the room came back: that waits for the period
    assert plan(scheduler.snapshot(clock.time())).dispatches == []
    clock.advance(writer.rules.period_s)
    assert writer.offer(beat(10_000))
    assert len(plan(scheduler.snapshot(clock.time())).dispatches) == 1


def test_the_agents_write_rules_follow_the_policy_and_its_reloads(tmp_path: Path) -> None:
    """A review's finding: a reload to a shorter heartbeat timeout kept the old write
    period (3 s against a 2 s timeout: quiet nodes looked silent, and the agent fenced
    later than the scheduler gave it up); and a policy with no margin needs every shrink
    written at once."""
    from ebbtide.config.policy import parse_policy
    from ebbtide.config.settings import Settings
    from ebbtide.runtime import build
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.static import StaticSource

    path = tmp_path / "ebbtide.yaml"
    path.write_text("defaults:\n  heartbeat_timeout_s: 8s\n  margin_memory_mib: 0\n")
    settings = Settings(home=tmp_path / "home", db_url=f"sqlite:///{tmp_path / 'e.db'}")
    rt = build(
        settings,
        scheduler=True,  # ebb up: the embedded broker
        agent_name="n1",
        source=StaticSource(parse_devices("1x80GiB")),
        policy_path=path,
    )
    try:
        assert rt.agent is not None
        rules = rt.agent.sync.heartbeats.rules
        assert (rules.period_s, rules.deadband_memory_mib) == (2.0, 0.0)
        rt.apply_policy(parse_policy("defaults:\n  heartbeat_timeout_s: 2s\n", "ebbtide.yaml"))
        rules = rt.agent.sync.heartbeats.rules
        assert (rules.period_s, rules.deadband_memory_mib) == (0.5, 256.0)
    finally:
        rt.stop()


def test_a_fleet_process_on_a_sqlite_store_says_so(tmp_path, caplog, redis_url) -> None:  # type: ignore[no-untyped-def]
    """A trial's trap: ``ebb worker`` with ``EBBTIDE_REDIS_URL`` set and no
    ``EBBTIDE_DB_URL`` ran on a SQLite file of its own, said nothing, and never joined
    the fleet.  It warns, naming the file; the embedded mode (``ebb up``) does not."""
    import logging
    import uuid

    from ebbtide.config.settings import Settings
    from ebbtide.runtime import build
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.static import StaticSource

    db = tmp_path / "e.db"
    for broker in (redis_url, None):
        caplog.clear()
        settings = Settings(
            home=tmp_path / "home",
            db_url=f"sqlite:///{db}",
            redis_url=broker,
            namespace=f"t-{uuid.uuid4().hex[:8]}",
        )
        with caplog.at_level(logging.WARNING, logger="ebbtide"):
            agent = (
                {}
                if broker
                else {"agent_name": "n1", "source": StaticSource(parse_devices("1x80GiB"))}
            )
            build(settings, scheduler=True, **agent).stop()  # type: ignore[arg-type]
        said = [r.getMessage() for r in caplog.records if "SQLite file" in r.getMessage()]
        if broker:
            assert said == [
                f"the store is the SQLite file {db}: only processes on this host that use "
                "it share it; set EBBTIDE_DB_URL=postgresql://... to join a fleet"
            ]
        else:
            assert said == []


def test_a_worker_with_no_policy_file_follows_the_scheduler_s(tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    """A trial's trap: the scheduler reloaded ``allow_root_jobs: false``, and the workers,
    started with no policy file, ran root's jobs on their built-in defaults."""
    import time
    import uuid

    from ebbtide.config.settings import Settings
    from ebbtide.queue.store import Store
    from ebbtide.runtime import build
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.static import StaticSource

    url = f"sqlite:///{tmp_path / 'e.db'}"
    store = Store(url)
    store.publish_policy("defaults: {margin_compute_pct: 6}\n", "/etc/ebbtide/ebbtide.yaml")
    settings = Settings(
        home=tmp_path / "home",
        db_url=url,
        redis_url=redis_url,
        namespace=f"t-{uuid.uuid4().hex[:8]}",
    )

    def worker(**kw):  # type: ignore[no-untyped-def]
        return build(
            settings,
            scheduler=False,
            agent_name="n1",
            source=StaticSource(parse_devices("1x80GiB")),
            **kw,
        )

    rt = worker()
    try:
        assert rt.agent is not None and rt.follower is not None
        assert rt.agent.margins.compute_pct == 6  # read when it was built
        # never root's jobs from the store: whoever can write it would get root shells
        # on every worker at once; only a worker's own file allows them
        store.publish_policy(
            "allow_root_jobs: true\ndefaults: {margin_compute_pct: 7}\n",
            "/etc/ebbtide/ebbtide.yaml",
        )
        assert rt.follower.check() is True
        assert rt.agent.allow_root_jobs is False and rt.agent.margins.compute_pct == 7
        assert rt.follower.check() is False  # unchanged: nothing to do
        store.publish_policy("windows: [\n", "/etc/ebbtide/ebbtide.yaml")  # this one cannot read
        assert rt.follower.check() is False and rt.agent.margins.compute_pct == 7
        # its own thread looks again every period, and at once when woken (SIGHUP)
        rt.follower.period_s = 0.05
        rt.follower.start()
        store.publish_policy("defaults: {margin_compute_pct: 9}\n", "/etc/ebbtide/ebbtide.yaml")
        deadline = time.monotonic() + 10
        while rt.agent.margins.compute_pct != 9 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rt.agent.margins.compute_pct == 9
        rt.follower.stop()
    finally:
        rt.stop()
    # a worker given a file keeps to it, and follows it as it changes (a ConfigMap
    # updated in place: a trial's trap, its agents kept the old margins until restarted)
    own = tmp_path / "own.yaml"
    own.write_text("allow_root_jobs: true\n")
    rt = worker(policy_path=own)
    try:
        assert rt.agent is not None and rt.agent.allow_root_jobs is True
        assert rt.follower is not None and rt.follower.check() is False  # as built
        store.publish_policy("defaults: {margin_compute_pct: 4}\n", "elsewhere.yaml")
        assert rt.follower.check() is False  # the store's is not its policy
        own.write_text("allow_root_jobs: true\ndefaults: {margin_compute_pct: 8}\n")
        assert rt.follower.check() is True and rt.agent.margins.compute_pct == 8
        own.write_text("defaults: {margin_compute_pct: [\n")  # no longer reads: kept
        assert rt.follower.check() is False and rt.agent.margins.compute_pct == 8
    finally:
        rt.stop()
