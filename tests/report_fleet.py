"""An hour of history in a real store for ``ebb report``'s tests, made through the store's
own API on a fake clock.  Times are seconds after the clock's start ``t0``:

- 0: node gpu-a (2 devices) reports; ``old`` (carol, batch) runs and succeeds by 100.
- 1000: ``train`` (alice, default, 50 %, 8 GiB) and ``batch`` (bob, batch, 25 %, 4 GiB)
  are submitted.  ``train`` is dispatched at 1060, paused 1660-1780, evicted at 2082
  (online_compute, 2 s, 100 s of work lost), dispatched again at 2112 and succeeds at 2712.
  ``batch`` is dispatched at 1200 and evicted at 3031.5 (online_memory, killed at its
  30 s deadline: 31.5 s, 300 s lost); it waits in the queue since.
- 2000: ``whole`` (bob, batch, 2 whole GPUs) is submitted and dispatched; it still runs.
- 2500: ``gone`` (alice) is submitted, and cancelled at 2600.
- 2700: ``broken`` (alice, 10 %) is dispatched; it fails for good at 2800.
- 3600: the report's time; gpu-a heartbeats.

So a report of [1000, 3600) harvests :data:`GPU_SECONDS` GPU-seconds.
"""

from __future__ import annotations

from typing import Any

from ebbtide.clock import FakeClock
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

GIB = 1024
WINDOW = (1000.0, 3600.0)
#: train (902 s, less the pause, then 600 s at 50 %), batch (1831.5 s at 25 %), whole
#: (1600 s on 2 GPUs), broken (100 s at 10 %)
GPU_SECONDS = 0.5 * 902 + 0.5 * 600 + 0.25 * 1831.5 + 2 * 1600 + 0.1 * 100
DEVICES = [
    {"index": i, "memory_mib": 80 * GIB, "online_compute_pct": 20, "online_memory_mib": 8 * GIB}
    for i in range(2)
]


def _submit(store: Store, owner: str, queue: str, gpu: str, gpumem: str, **spec: Any) -> int:
    job = JobSpec(command=["train"], queue=queue, gpu=gpu, gpumem=gpumem, **spec)
    return store.submit(job, owner, defaults_deadline_s=30)[0]


def _start(store: Store, job_id: int, attempt: int, devices: tuple[int, ...] = (0,)) -> None:
    job = store.get(job_id)
    number = store.dispatch(
        job_id,
        expected_attempts=attempt - 1,
        node="gpu-a",
        devices=devices,
        compute_pct=job.compute_pct,
        memory_mib=job.memory_mib,
    )
    store.mark_started(job_id, number, pid=100 + job_id, stdout_path="o", stderr_path="e")


def _evict(
    store: Store, clock: FakeClock, job_id: int, code: str, latency_s: float, lost_s: float
) -> None:
    spike = clock.time()
    store.begin_eviction(
        job_id,
        store.get(job_id).attempts,
        reason=f"{code} rose",
        deadline_s=30,
        spike_at=spike,
        source="agent",
        reason_code=code,
    )
    clock.advance(latency_s)
    missed = latency_s > 30
    eviction = {
        "reason": f"{code} rose",
        "reason_code": code,
        "deadline_s": 30.0,
        "spike_at": spike,
        "freed_at": clock.time(),
        "latency_s": latency_s,
        "killed": missed,
        "checkpointed": not missed,
        "lost_work_s": lost_s,
        "deadline_missed": missed,
    }
    store.finish_attempt(
        job_id, store.get(job_id).attempts, exit_code=-9 if missed else 99, eviction=eviction
    )


def _at(clock: FakeClock, t0: float, offset: float) -> None:
    clock.advance(t0 + offset - clock.time())


def make_history(store: Store, clock: FakeClock) -> dict[str, int]:
    """The history (see the module doc) in ``store``, whose clock is ``clock``, from the
    clock's time on; the job ids by name, and ``t0``."""
    t0 = clock.time()
    store.heartbeat("gpu-a", started_at=t0, devices=DEVICES)
    ids = {"old": _submit(store, "carol", "batch", "10%", "1GiB")}
    _start(store, ids["old"], 1)
    _at(clock, t0, 100)
    store.finish_attempt(ids["old"], 1, exit_code=0)

    _at(clock, t0, 1000)
    ids["train"] = _submit(store, "alice", "default", "50%", "8GiB")
    ids["batch"] = _submit(store, "bob", "batch", "25%", "4GiB")
    _at(clock, t0, 1060)
    _start(store, ids["train"], 1)
    _at(clock, t0, 1200)
    _start(store, ids["batch"], 1, devices=(1,))
    _at(clock, t0, 1660)
    store.record_pause(
        ids["train"], 1, at=clock.time(), reason="spike", reason_code="online_compute"
    )
    _at(clock, t0, 1780)
    store.record_thaw(ids["train"], 1, at=clock.time(), paused_s=120.0)
    _at(clock, t0, 2000)
    ids["whole"] = _submit(store, "bob", "batch", "2", "10GiB")
    _start(store, ids["whole"], 1, devices=(0, 1))
    _at(clock, t0, 2080)
    _evict(store, clock, ids["train"], "online_compute", latency_s=2.0, lost_s=100.0)
    _at(clock, t0, 2112)
    _start(store, ids["train"], 2)
    _at(clock, t0, 2500)
    ids["gone"] = _submit(store, "alice", "default", "10%", "1GiB")
    _at(clock, t0, 2600)
    store.cancel(ids["gone"], user="alice")
    _at(clock, t0, 2700)
    ids["broken"] = _submit(store, "alice", "default", "10%", "1GiB", max_attempts=1)
    _start(store, ids["broken"], 1)
    _at(clock, t0, 2712)
    store.finish_attempt(ids["train"], 2, exit_code=0)
    _at(clock, t0, 2800)
    store.finish_attempt(ids["broken"], 1, exit_code=1)
    _at(clock, t0, 3000)
    _evict(store, clock, ids["batch"], "online_memory", latency_s=31.5, lost_s=300.0)
    _at(clock, t0, 3600)
    store.heartbeat("gpu-a", started_at=t0, devices=DEVICES)
    return ids
