"""One agent per node name: a second one is refused, a restart after a crash is not
kept waiting, and an agent elsewhere under the same name is told apart from a dead one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebbtide.clock import FakeClock
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.claim import CLOCK_SKEW_S, POLL_S, NodeClaim, NodeTaken
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=FakeClock(1_000_000.0))
    yield s  # type: ignore[misc]
    s.close()


def agent(store: Store, home: Path, name: str = "n1") -> NodeAgent:
    return NodeAgent(name, store, StaticSource(parse_devices("1x80GiB")), home=home)


def test_a_second_agent_under_the_same_name_on_this_host_is_refused(
    tmp_path: Path, store: Store
) -> None:
    first = agent(store, tmp_path)
    first.start()
    journal = tmp_path / "run" / "n1" / "journal.jsonl"
    try:
        inode = journal.stat().st_ino
        with pytest.raises(NodeTaken, match=r"an agent already runs under this name \(pid \d+ on"):
            agent(store, tmp_path)  # refused when made: before its journal is opened
        # the live agent's journal is the one on disk still
        assert journal.stat().st_ino == inode
    finally:
        first.shutdown(timeout_s=10)
    # gone cleanly: the name is free again at once
    third = agent(store, tmp_path)
    third.start()
    third.shutdown(timeout_s=10)


def test_a_restart_after_a_crash_does_not_wait(tmp_path: Path, store: Store) -> None:
    first = agent(store, tmp_path)
    first.start()
    first.kill()  # its heartbeat is fresh, but its lock died with it
    sleeps: list[float] = []
    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    claim.acquire(store, started_at=2.0, heartbeat_timeout_s=10, sleep=sleeps.append)
    claim.release()
    assert sleeps == []


def test_the_lock_of_a_killed_process_is_free(tmp_path: Path, store: Store) -> None:
    """A real process holding the claim, killed with SIGKILL: the kernel lets it go."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ebbtide.workers.claim import NodeClaim\n"
        "c = NodeClaim(Path(sys.argv[1]), 'n1')\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    run_dir = tmp_path / "run" / "n1"
    with subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
            with pytest.raises(NodeTaken, match=f"pid {proc.pid}"):
                NodeClaim(run_dir, "n1")
        finally:
            proc.kill()
    claim = NodeClaim(run_dir, "n1")
    claim.acquire(store, started_at=1.0, heartbeat_timeout_s=10)
    claim.release()


def test_an_agent_elsewhere_that_heartbeats_is_refused(tmp_path: Path, store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    store.heartbeat("n1", started_at=500.0, devices=[])  # another host's agent
    clock.advance(1.0)

    def elsewhere_beats(_s: float) -> None:
        clock.advance(0.25)
        store.heartbeat("n1", started_at=500.0, devices=[])

    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    with pytest.raises(NodeTaken, match=r"another agent runs under this name .* `ebb nodes`"):
        claim.acquire(store, started_at=2.0, heartbeat_timeout_s=10, sleep=elsewhere_beats)
    # refused: the lock here is let go too
    NodeClaim(tmp_path / "run" / "n1", "n1").release()


def test_an_agent_elsewhere_that_went_silent_is_waited_out(tmp_path: Path, store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    store.heartbeat("n1", started_at=500.0, devices=[])
    clock.advance(1.0)
    waited: list[float] = []

    def silent(s: float) -> None:
        waited.append(s)
        clock.advance(s)

    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    claim.acquire(store, started_at=2.0, heartbeat_timeout_s=3, sleep=silent)
    claim.release()
    assert 3.0 <= sum(waited) <= 3.0 + 2 * POLL_S  # until it stood still for the timeout


def test_a_clean_stop_or_a_stale_heartbeat_frees_the_name_at_once(
    tmp_path: Path, store: Store
) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    never: list[float] = []
    store.heartbeat("n1", started_at=500.0, devices=[], stopping=True)
    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    claim.acquire(store, started_at=2.0, heartbeat_timeout_s=10, sleep=never.append)
    claim.release()
    store.heartbeat("n1", started_at=500.0, devices=[])
    clock.advance(10 + CLOCK_SKEW_S + 1)  # older than the timeout, whatever the clocks
    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    claim.acquire(store, started_at=3.0, heartbeat_timeout_s=10, sleep=never.append)
    claim.release()
    assert never == []


def test_another_hosts_record_in_a_shared_home_is_not_taken_for_ours(
    tmp_path: Path, store: Store
) -> None:
    run_dir = tmp_path / "run" / "n1"
    run_dir.mkdir(parents=True)
    (run_dir / "agent.incarnation").write_text(
        json.dumps({"host": "other-host", "started_at": 500.0})
    )
    assert socket.gethostname() != "other-host"
    store.heartbeat("n1", started_at=500.0, devices=[])
    clock = store.clock
    assert isinstance(clock, FakeClock)

    def beats(_s: float) -> None:
        clock.advance(0.25)
        store.heartbeat("n1", started_at=500.0, devices=[])

    with pytest.raises(NodeTaken):
        NodeClaim(run_dir, "n1").acquire(store, started_at=2.0, heartbeat_timeout_s=10, sleep=beats)


def test_the_cli_refuses_a_second_worker_with_a_clear_message(tmp_path: Path) -> None:
    from tests.e2e.helpers import ebb_env, start, stop, wait_for

    env = ebb_env(tmp_path / "home")
    first = start(env, "up", "--node", "box", log=tmp_path / "first.log")
    try:
        wait_for(lambda: "ready" in (tmp_path / "first.log").read_text(), 30, "the first up")
        began = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "ebbtide.cli.main", "up", "--node", "box"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert time.monotonic() - began < 20
    finally:
        assert stop(first) == 0
    assert second.returncode != 0
    assert "node box: an agent already runs under this name (pid " in second.stderr
    assert "Traceback" not in second.stderr


def test_an_agent_that_is_stopping_holds_the_name_until_its_attempts_are_gone(
    tmp_path: Path, store: Store
) -> None:
    """A draining agent heartbeats 'stopping' while it evicts: its attempts are still
    running, so a replacement waits for them instead of taking them for lost."""
    clock = store.clock
    assert isinstance(clock, FakeClock)
    [job_id] = store.submit(JobSpec(command=["true"]), "alice", defaults_deadline_s=30)
    store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
    )
    store.heartbeat("n1", started_at=500.0, devices=[], stopping=True)
    polls: list[float] = []

    def draining(s: float) -> None:
        polls.append(s)
        clock.advance(s)
        store.heartbeat("n1", started_at=500.0, devices=[], stopping=True)
        if len(polls) == 3:  # its last attempt ends
            store.requeue_lost(job_id, 1, why="evicted at shutdown")

    claim = NodeClaim(tmp_path / "run" / "n1", "n1")
    claim.acquire(store, started_at=2.0, heartbeat_timeout_s=10, sleep=draining)
    claim.release()
    assert len(polls) == 3
