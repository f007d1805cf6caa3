"""GPU truth on a node, with real processes against the fake NVML:

- a job started as ``bash run.sh`` whose GPU process is a child of the script, and a
  launcher with four workers, run to completion under online load without their GPU
  memory and compute being taken for online load (so the agent does not evict them to
  make room for themselves);
- an XID on a device with two attempts: both leave within their deadline, requeue onto
  the other device without the fault counting against them, and the faulty device takes
  no new work until it is healthy again (or undrained);
- a GPU that falls off the bus has its slices killed at once.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ebbtide.client import Client
from ebbtide.config.policy import Policy
from ebbtide.config.settings import Settings
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.runtime import Runtime, build
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.headroom.fake_nvml import FakeNvml
from ebbtide.workers.headroom.nvml import NvmlSource
from tests.e2e.helpers import wait_for

GIB = 1024
COUNT = Path(__file__).resolve().parents[2] / "examples" / "count.py"


def wait_until(predicate, timeout=20.0, what="condition"):  # type: ignore[no-untyped-def]
    return wait_for(predicate, timeout, what, interval=0.02)


class GpuProcesses:
    """Plays the driver: processes whose command line carries a marker appear on a fake
    GPU with the given memory and SM share, and vanish from it when they exit."""

    def __init__(self, nvml: FakeNvml, base_utilization: dict[int, float] | None = None) -> None:
        self.nvml = nvml
        #: device utilisation without the marked processes; theirs is added while they run
        self.base = base_utilization or {}
        self.rules: dict[str, tuple[int, float, float]] = {}
        self.seen: dict[int, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def on_gpu(self, marker: str, index: int, memory_mib: float, sm_util: float) -> None:
        self.rules[marker] = (index, memory_mib, sm_util)

    def __enter__(self) -> GpuProcesses:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in psutil.process_iter(["pid", "cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                for marker, (index, mem, sm) in self.rules.items():
                    if marker in cmd and p.pid not in self.seen and "-I" not in cmd:
                        self.nvml.add_process(index, p.pid, memory_mib=mem, sm_util=sm)
                        self.seen[p.pid] = (index, marker)
            for pid, (index, _marker) in list(self.seen.items()):
                if not _alive(pid):
                    self.nvml.remove_process(index, pid)
                    del self.seen[pid]
            for index, base in self.base.items():
                busy = sum(self.rules[m][2] for i, m in self.seen.values() if i == index)
                self.nvml.set_utilization(index, min(100.0, base + busy))
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not); it may exit while it is looked at."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


RUN_SH = textwrap.dedent(
    """\
    #!/bin/bash
    # a job script whose GPU work is done by a child process
    {python} -c "import time; time.sleep(2.5)  # gpu-child"
    """
)

LAUNCHER = textwrap.dedent(
    """\
    import subprocess, sys
    # a launcher (torchrun-like) with four GPU workers
    code = "import time; time.sleep(2.5)  # gpu-worker"
    workers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    sys.exit(max(w.wait() for w in workers))
    """
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Store, NodeAgent, FakeNvml]]:
    nvml = FakeNvml()
    nvml.add_device(80 * GIB, name="Fake H100")
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    agent = NodeAgent("n1", store, NvmlSource(nvml=nvml), home=tmp_path)
    agent.start()
    yield store, agent, nvml
    agent.shutdown(timeout_s=20)
    agent.source.close()
    store.close()


def _run_here(store: Store, spec: JobSpec) -> int:
    [job_id] = store.submit(spec, "tester", defaults_deadline_s=5)
    job = store.get(job_id)
    store.dispatch(
        job_id,
        expected_attempts=0,
        node="n1",
        devices=(0,),
        compute_pct=job.compute_pct,
        memory_mib=job.memory_mib,
    )
    return job_id


def test_wrapped_and_launched_gpu_processes_are_not_online_load(tmp_path, node):  # type: ignore[no-untyped-def]
    store, agent, nvml = node
    # online: a server holding 40 GiB and 45 % of the SMs; 80 % busy with the jobs
    online = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _online_load_leaves_out_the_jobs(tmp_path, store, agent, nvml, online)
    finally:  # reaped even if an assertion failed (no stray process for the next test)
        online.kill()
        online.wait()


def _online_load_leaves_out_the_jobs(tmp_path, store, agent, nvml, online):  # type: ignore[no-untyped-def]
    nvml.add_process(0, online.pid, memory_mib=40 * GIB, sm_util=45)
    nvml.set_utilization(0, 45)
    run_sh = tmp_path / "run.sh"
    run_sh.write_text(RUN_SH.format(python=sys.executable))
    run_sh.chmod(0o755)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    with GpuProcesses(nvml, base_utilization={0: 45}) as gpu:
        # 15 GiB in the script's child, 4 × 3 GiB in the workers: counted as online, the
        # device would show 67 GiB and 85 % online beside 30 GiB and 45 % of slices, and
        # the agent would evict both jobs to make room for themselves
        gpu.on_gpu("gpu-child", 0, 15 * GIB, 20)
        gpu.on_gpu("gpu-worker", 0, 3 * GIB, 5)
        wrapped = _run_here(
            store, JobSpec(command=["bash", str(run_sh)], gpu="25%", gpumem="16GiB")
        )
        launched = _run_here(
            store,
            JobSpec(
                command=[sys.executable, str(tmp_path / "launcher.py")], gpu="20%", gpumem="14GiB"
            ),
        )
        wait_until(lambda: len(gpu.seen) == 5, what="the five GPU processes")
        # a process just started has its memory in NVML before its first SM sample (the
        # driver's sample period): wait for a sample that has both for all five
        sample = wait_until(
            lambda: [
                s
                for s in agent.latest
                if s.offline_memory_mib == 27 * GIB
                and s.offline_compute_pct == pytest.approx(40, abs=1)
            ][:1],
            what="a sample with every GPU process of both jobs",
        )[0]
        assert sample.online_memory_mib == pytest.approx(40 * GIB)
        assert sample.online_compute_pct == pytest.approx(45, abs=1)
        final = {"succeeded", "failed", "queued"}
        wait_until(
            lambda: {store.get(wrapped).state, store.get(launched).state} <= final,
            what="both jobs to end",
        )
    for job_id in (wrapped, launched):
        assert store.get(job_id).state == "succeeded", store.events(job_id)
        assert not [e for e in store.events(job_id) if e["type"] == "evicted"]


# -- faults -----------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Runtime, FakeNvml, Client]]:
    """Embedded mode in this process on two idle fake 80 GiB GPUs (best fit packs the
    first jobs onto device 0)."""
    nvml = FakeNvml()
    for _ in range(2):
        nvml.add_device(80 * GIB, name="Fake H100")
    settings = Settings(
        home=tmp_path / "home", db_url=f"sqlite:///{tmp_path / 'e.db'}", user="root"
    )
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        "apiVersion: ebbtide/v1\n"
        "defaults: {eviction_cooldown_s: 0s, device_recovery_s: 1h, forecast_warmup_s: 0s,"
        " deadline_s: 10s}\n"
    )
    source = NvmlSource(nvml=nvml, event_wait_ms=10)
    rt = build(settings, scheduler=True, agent_name="n1", source=source, policy_path=policy_file)
    rt.start()
    client = Client(settings, store=rt.store, policy=Policy())
    try:
        yield rt, nvml, client
    finally:
        rt.stop()


def _count_job(client: Client, tmp_path: Path, name: str, steps: int = 100) -> int:
    out = str(tmp_path / f"{name}.json")
    return client.submit(
        JobSpec(
            name=name,
            command=[sys.executable, str(COUNT), str(steps), "--step-s", "0.05", "--out", out],
            gpu="30%",
            gpumem="8GiB",
            deadline="5s",
        )
    )


def _devices_of(client: Client, job_id: int) -> list[list[int]]:
    return [e["devices"] for e in client.events(job_id) if e["type"] == "dispatched"]


def test_an_xid_moves_both_attempts_without_counting_and_drains_the_device(tmp_path, cluster):  # type: ignore[no-untyped-def]
    _rt, nvml, client = cluster
    a, b = _count_job(client, tmp_path, "a"), _count_job(client, tmp_path, "b")
    wait_until(lambda: all(client.get(j).state == "running" for j in (a, b)), what="running")
    assert _devices_of(client, a) == [[0]] and _devices_of(client, b) == [[0]]
    nvml.set_recovery_action(0, 4)  # NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    nvml.inject_xid(0, 48)  # a double-bit ECC error

    wait_until(
        lambda: all(len(_devices_of(client, j)) == 2 for j in (a, b)),
        what="both requeued and dispatched again",
    )
    for j in (a, b):
        assert _devices_of(client, j)[1] == [1]
        [ev] = [e for e in client.events(j) if e["type"] == "evicted"]
        assert ev["reason_code"] == "gpu_fault" and "XID 48" in ev["reason"]
        assert ev["latency_s"] <= ev["deadline_s"] and not ev["deadline_missed"]
    wait_until(lambda: all(client.get(j).state == "succeeded" for j in (a, b)), 30, "done")
    for j in (a, b):
        job = client.get(j)
        assert (job.attempts, job.failures, job.evictions) == (2, 0, 0)
        assert json.loads((tmp_path / f"{job.name}.json").read_text())["count"] == 100

    [node] = client.nodes()
    faulty = node["devices"][0]
    assert faulty["health"] == "unhealthy"
    assert faulty["fault"]["xid"] == 48
    assert faulty["fault"]["recovery_action"] == "drain_and_reset"
    # nothing new goes to device 0, though it has room and device 1 is now full
    blocker = psutil.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        nvml.add_process(1, blocker.pid, memory_mib=76 * GIB, sm_util=10)
        # device 1 is full only once the scheduler has heard so (a heartbeat): before,
        # c would rightly be planned there
        wait_until(
            lambda: client.nodes()[0]["devices"][1]["online_memory_mib"] >= 76 * GIB,
            what="the node to report device 1 full",
        )
        c = _count_job(client, tmp_path, "c", steps=10)
        reason = wait_until(lambda: client.get(c).reason, what="a reason to wait")
        assert reason.startswith("waiting"), reason
        time.sleep(1.0)
        assert client.get(c).state == "queued"

        # the operator reset the GPU; an admin returns it at once
        nvml.set_recovery_action(0, 0)
        client.undrain("n1", 0)
        wait_until(lambda: client.get(c).state == "succeeded", 30, "c to run on device 0")
        assert _devices_of(client, c) == [[0]]
        assert client.nodes()[0]["devices"][0]["health"] == "healthy"
    finally:
        blocker.kill()
        blocker.wait()


def test_a_gpu_off_the_bus_has_its_slices_killed_at_once(tmp_path, cluster):  # type: ignore[no-untyped-def]
    _rt, nvml, client = cluster
    a = _count_job(client, tmp_path, "a", steps=400)
    wait_until(lambda: client.get(a).state == "running", what="running")
    assert _devices_of(client, a) == [[0]]
    nvml.fall_off_bus(0)
    wait_until(lambda: len(_devices_of(client, a)) == 2, what="moved")
    [ev] = [e for e in client.events(a) if e["type"] == "evicted"]
    assert ev["reason_code"] == "gpu_fault" and ev["killed"] is True
    assert ev["latency_s"] < 1.0
    assert _devices_of(client, a)[1] == [1]
    job = client.get(a)
    assert (job.failures, job.evictions) == (0, 0)
    assert client.nodes()[0]["devices"][0]["fault"]["lost"] is True


# -- right-sizing: what attempts used -------------------------------------------------------


def test_an_attempt_records_its_measured_peak_and_p95_at_its_end(tmp_path, node):  # type: ignore[no-untyped-def]
    """The agent samples the attempt's GPU use about once a second from NVML's per-process
    figures (not as granted) and the store keeps the summary with the attempt's end."""
    store, agent, nvml = node
    code = "import time; time.sleep(4)  # gpu-measured"
    with GpuProcesses(nvml, base_utilization={0: 0}) as gpu:
        gpu.on_gpu("gpu-measured", 0, 2 * GIB, 40)
        job_id = _run_here(
            store, JobSpec(command=[sys.executable, "-c", code], gpu="80%", gpumem="20GiB")
        )
        [pid] = wait_until(lambda: list(gpu.seen), what="the job's GPU process")
        nvml.set_memory(0, pid, 6 * GIB)  # a peak the summary must see ...
        wait_until(
            lambda: (
                (a := agent.attempts.get(job_id)) and (u := a.usage) and u.memory.peak == 6 * GIB
            ),
            what="a sample of the peak",
        )
        nvml.set_memory(0, pid, 2 * GIB)  # ... and keep after it is gone
        started = store.get(job_id).started_at
        wait_until(lambda: store.get(job_id).state == "succeeded", what="the job to end")
    [row] = store.attempts(job_id)
    ran_s = (row.ended_at or 0) - (started or 0)
    assert row.usage_samples is not None and 2 <= row.usage_samples <= ran_s + 1.5  # ~1 Hz
    assert (row.used_compute_p95_pct, row.used_compute_peak_pct) == (40.0, 40.0)
    assert row.used_memory_peak_mib == 6 * GIB
    assert row.used_memory_p95_mib is not None and row.used_memory_p95_mib <= 6 * GIB
    found = Client(
        Settings(home=tmp_path, db_url=store.url), store=store, policy=Policy()
    ).recommend(job_id)
    [r] = found["recommendations"]
    # 40 × 1.2 = 48 → 50 %; 6 GiB × 1.1 + 1 GiB = 7.6 → 8 GiB
    assert r["recommended"]["resources"] == "gpu=50%,gpumem=8GiB"
    assert r["freed_per_device"] == {"compute_pct": 30.0, "memory_mib": 12 * GIB}


def test_an_evicted_attempt_keeps_what_it_used(node):  # type: ignore[no-untyped-def]
    store, agent, nvml = node
    code = "import time; time.sleep(60)  # gpu-evictee"
    online = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with GpuProcesses(nvml) as gpu:
            gpu.on_gpu("gpu-evictee", 0, 3 * GIB, 25)
            job_id = _run_here(
                store, JobSpec(command=[sys.executable, "-c", code], gpu="30%", gpumem="8GiB")
            )
            wait_until(
                lambda: (a := agent.attempts.get(job_id)) and (u := a.usage) and u.samples >= 2,
                what="two samples",
            )
            nvml.add_process(0, online.pid, memory_mib=75 * GIB)  # no room left for 8 GiB
            wait_until(lambda: store.get(job_id).state == "queued", what="the eviction")
    finally:
        online.kill()
        online.wait()
    [row] = store.attempts(job_id)
    assert row.outcome == "evicted"
    assert row.usage_samples is not None and row.usage_samples >= 2
    assert (row.used_compute_peak_pct, row.used_memory_peak_mib) == (25.0, 3 * GIB)
