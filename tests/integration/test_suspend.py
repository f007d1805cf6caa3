"""Suspend to host with real processes and the fake ``cuda-checkpoint`` (it models the
state machine only): a memory spike suspends a job instead of evicting it; room returns,
it is restored and thawed, and its count is exact."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import psutil
import pytest

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.scheduling.snapshot import PauseRules
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.shim import descendants
from ebbtide.workers.suspend import CudaCheckpoint, SuspendError
from tests.integration.test_pause import COUNT, wait_until
from tests.integration.test_pause import states as process_states

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "cuda-checkpoint"
RULES = PauseRules(min_pause_s=0.5, max_pause_s=600, suspend=True, max_suspend_s=600)


@pytest.fixture
def cuda_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CudaCheckpoint:
    monkeypatch.setenv("EBBTIDE_FAKE_CUDA_CHECKPOINT_DIR", str(tmp_path / "cuda-state"))
    return CudaCheckpoint(FAKE, timeout_s=10)


def job_pids(agent: NodeAgent, job_id: int) -> list[int]:
    local = agent.attempts.get(job_id)
    return descendants(local.handle.pid) if local else []


def cuda_states(cc: CudaCheckpoint, agent: NodeAgent, job_id: int) -> set[str]:
    out = set()
    for pid in job_pids(agent, job_id):
        try:
            out.add(cc.state(pid))
        except SuspendError:
            pass  # ended meanwhile
    return out


def test_the_wrapper_toggles_and_refuses_a_missing_process(
    cuda_checkpoint: CudaCheckpoint,
) -> None:
    cc = cuda_checkpoint
    assert cc.available()
    child = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert cc.state(child.pid) == "running"
        cc.suspend([child.pid])
        cc.suspend([child.pid])  # already on the host: left alone
        assert cc.state(child.pid) == "checkpointed"
        cc.restore([child.pid])
        assert cc.state(child.pid) == "running"
    finally:
        child.kill()
        child.wait()
    with pytest.raises(SuspendError, match="does not exist"):
        cc.suspend([child.pid])
    assert not CudaCheckpoint("/nonexistent/cuda-checkpoint").available()


def test_restoring_skips_a_process_that_ended_while_on_the_host(
    cuda_checkpoint: CudaCheckpoint,
) -> None:
    """A process of the attempt may end between the thaw and the restore (a data loader
    worker, a helper): it needs nothing back, and the live ones are restored."""
    cc = cuda_checkpoint
    gone = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    live = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cc.suspend([gone.pid, live.pid])
        gone.kill()
        gone.wait()
        cc.restore([gone.pid, live.pid])
        assert cc.state(live.pid) == "running"
    finally:
        live.kill()
        live.wait()


def test_a_memory_spike_suspends_room_returning_restores_and_the_count_is_exact(
    tmp_path: Path, cuda_checkpoint: CudaCheckpoint
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent(
        "n1", store, source, home=tmp_path, pause=RULES, cuda_checkpoint=cuda_checkpoint
    )
    agent.start()
    try:
        out = tmp_path / "result.json"
        spec = JobSpec(
            # 6 s of counting: the spike must find it still running on a busy machine,
            # where each run of the fake utility (a Python process) takes a few tenths of
            # a second and the suspend runs it about six times (at 2 s it had ended once)
            command=[sys.executable, str(COUNT), "120", "--step-s", "0.05", "--every", "5",
                     "--out", str(out)],
            deadline_s=5,
        )  # fmt: skip
        [job_id] = store.submit(spec, "alice", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=2048
        )
        wait_until(lambda: store.get(job_id).state == "running")
        wait_until(lambda: store.get(job_id).checkpoint_path)

        # online memory rises: suspended to host, not evicted
        source.set(0, 10.0, 80_000)
        wait_until(lambda: "paused" in [e["type"] for e in store.events(job_id)])
        [paused] = [e for e in store.events(job_id) if e["type"] == "paused"]
        assert paused["kind"] == "suspend" and paused["reason_code"] == "online_memory"
        assert "suspended to host" in paused["reason"]
        assert process_states(agent, job_id) == {psutil.STATUS_STOPPED}
        assert cuda_states(cuda_checkpoint, agent, job_id) == {"checkpointed"}
        assert agent.attempts[job_id].suspended_at is not None
        time.sleep(0.6)
        assert store.get(job_id).state == "running"

        # room returns: restored, then thawed; the count goes on in the same attempt
        source.set(0, 0.0, 0)
        wait_until(lambda: "thawed" in [e["type"] for e in store.events(job_id)])
        [thawed] = [e for e in store.events(job_id) if e["type"] == "thawed"]
        assert thawed["kind"] == "restore"
        wait_until(lambda: store.get(job_id).state == "succeeded", timeout=30)
        result = json.loads(out.read_text())
        assert result["count"] == 120 and result["attempts_seen"] == [1]
        types = [e["type"] for e in store.events(job_id)]
        assert "evict_requested" not in types and "evicted" not in types
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def test_a_failed_suspend_evicts_instead(
    tmp_path: Path, cuda_checkpoint: CudaCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EBBTIDE_FAKE_CUDA_CHECKPOINT_FAIL", "toggle")
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent(
        "n1", store, source, home=tmp_path, pause=RULES, cuda_checkpoint=cuda_checkpoint
    )
    agent.start()
    try:
        sleeper = JobSpec(command=[sys.executable, "-c", "import time; time.sleep(30)"])
        [job_id] = store.submit(sleeper, "bob", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=2048
        )
        wait_until(lambda: store.get(job_id).state == "running")
        source.set(0, 10.0, 80_000)
        wait_until(lambda: store.get(job_id).state == "queued")
        types = [e["type"] for e in store.events(job_id)]
        assert "paused" not in types
        [ev] = [e for e in store.events(job_id) if e["type"] == "evicted"]
        assert (
            ev["reason_code"] == "online_memory"
            and "suspending it to host failed" in (ev["reason"])
        )
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def _two_sleepers(store: Store) -> tuple[int, int]:
    """Two pausable jobs of 1 GiB on n1/0, the first of lower priority (the first victim)."""
    ids = []
    for priority in (0, 5):
        sleeper = JobSpec(
            command=[sys.executable, "-c", "import time; time.sleep(30)"], priority=priority
        )
        [job_id] = store.submit(sleeper, "bob", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=1024
        )
        ids.append(job_id)
    return ids[0], ids[1]


def test_the_host_budget_takes_one_suspension_and_the_other_job_is_evicted(
    tmp_path: Path, cuda_checkpoint: CudaCheckpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """suspend_host_memory_pct 50 of a 3 GiB host: room for one 1 GiB job, not two."""
    monkeypatch.setattr("ebbtide.workers.agent.host_memory_mib", lambda: (3072.0, 100_000.0))
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    rules = dataclasses.replace(RULES, host_memory_pct=50)
    agent = NodeAgent(
        "n1", store, source, home=tmp_path, pause=rules, cuda_checkpoint=cuda_checkpoint
    )
    agent.start()
    try:
        first, second = _two_sleepers(store)
        wait_until(lambda: {store.get(j).state for j in (first, second)} == {"running"})
        wait_until(lambda: all(job_pids(agent, j) for j in (first, second)))  # forked
        source.set(0, 10.0, 80_000)  # both must leave the GPU
        wait_until(lambda: store.get(second).state == "queued")
        job = store.get(first)
        assert job.state == "running" and job.suspended_at is not None
        assert agent.attempts[first].suspended_at is not None
        [ev] = [e for e in store.events(second) if e["type"] == "evicted"]
        assert "suspend_host_memory_pct 50%" in ev["reason"]
        assert "paused" not in [e["type"] for e in store.events(second)]
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def test_a_host_without_the_memory_available_evicts(
    tmp_path: Path,
    cuda_checkpoint: CudaCheckpoint,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("ebbtide.workers.agent.host_memory_mib", lambda: (65536.0, 2048.0))
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent(
        "n1", store, source, home=tmp_path, pause=RULES, cuda_checkpoint=cuda_checkpoint
    )
    agent.start()
    try:
        caplog.set_level(logging.INFO, logger="ebbtide.agent")
        sleeper = JobSpec(command=[sys.executable, "-c", "import time; time.sleep(30)"])
        [job_id] = store.submit(sleeper, "bob", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=1024
        )
        wait_until(lambda: store.get(job_id).state == "running")
        source.set(0, 10.0, 80_000)
        wait_until(lambda: store.get(job_id).state == "queued")
        assert "paused" not in [e["type"] for e in store.events(job_id)]
        assert store.get(job_id).suspended_at is None
        assert "not suspended to host: the host has 2GiB available" in caplog.text
    finally:
        agent.shutdown(timeout_s=20)
        store.close()


def test_suspension_off_in_the_rules_evicts_even_with_the_utility(
    tmp_path: Path, cuda_checkpoint: CudaCheckpoint
) -> None:
    """A policy reload to suspend_to_host: never stops new suspensions at once."""
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    agent = NodeAgent(
        "n1", store, source, home=tmp_path, pause=RULES, cuda_checkpoint=cuda_checkpoint
    )
    agent.pause_rules = dataclasses.replace(RULES, suspend=False)
    agent.start()
    try:
        sleeper = JobSpec(command=[sys.executable, "-c", "import time; time.sleep(30)"])
        [job_id] = store.submit(sleeper, "bob", defaults_deadline_s=5, pausable=True)
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=20, memory_mib=1024
        )
        wait_until(lambda: store.get(job_id).state == "running")
        source.set(0, 10.0, 80_000)
        wait_until(lambda: store.get(job_id).state == "queued")
        assert "paused" not in [e["type"] for e in store.events(job_id)]
    finally:
        agent.shutdown(timeout_s=20)
        store.close()
