"""A small fleet in a real store for ``ebb top``'s tests: three nodes (one device out of
service), attempts running and paused, jobs requeued and held, and two evictions, one
that met its deadline and one that missed it."""

from __future__ import annotations

import time
from typing import Any

from ebbtide.messaging.messages import DeviceReport
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

GIB = 1024

#: Each node's devices as its agent reports them.
DEVICES: dict[str, list[dict[str, Any]]] = {
    "gpu-a": [
        {
            "index": 0,
            "memory_mib": 80 * GIB,
            "online_compute_pct": 30,
            "online_memory_mib": 20 * GIB,
        },
        {
            "index": 1,
            "memory_mib": 80 * GIB,
            "online_compute_pct": 60,
            "online_memory_mib": 40 * GIB,
        },
    ],
    "gpu-b": [
        {
            "index": 0,
            "memory_mib": 80 * GIB,
            "online_compute_pct": 10,
            "online_memory_mib": 4 * GIB,
        },
        {
            "index": 1,
            "memory_mib": 80 * GIB,
            "health": "unhealthy",
            "fault": {"xid": 79, "meaning": "GPU has fallen off the bus", "at": 0.0},
        },
    ],
    "gpu-10": [{"index": 0, "memory_mib": 40 * GIB}],
}


def heartbeat(store: Store, now: float | None = None) -> None:
    """Every node reports its devices (each a valid :class:`DeviceReport`)."""
    now = time.time() if now is None else now
    for name, devices in DEVICES.items():
        for d in devices:
            DeviceReport.model_validate(d)
        store.heartbeat(name, started_at=now, devices=devices)


def _run(store: Store, owner: str, queue: str, where: tuple[str, int], pct: float) -> int:
    [job_id] = store.submit(
        JobSpec(command=["true"], gpu=f"{pct:g}%", gpumem="4GiB", queue=queue),
        owner,
        defaults_deadline_s=30,
    )
    attempt = store.dispatch(
        job_id,
        expected_attempts=0,
        node=where[0],
        devices=(where[1],),
        compute_pct=pct,
        memory_mib=4 * GIB,
    )
    store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    return job_id


def _evict(store: Store, job_id: int, *, latency_s: float, missed: bool) -> None:
    now = time.time()
    reason = "online compute rose to 97%, above its 90% threshold"
    store.begin_eviction(
        job_id,
        1,
        reason=reason,
        deadline_s=30,
        spike_at=now - latency_s,
        source="agent",
        reason_code="online_compute",
    )
    eviction = {
        "reason": reason,
        "reason_code": "online_compute",
        "deadline_s": 30.0,
        "latency_s": latency_s,
        "deadline_missed": missed,
        "killed": missed,
    }
    store.finish_attempt(job_id, 1, exit_code=99 if not missed else -9, eviction=eviction)


def make_fleet(store: Store) -> dict[str, int]:
    """The fleet (see the module doc); the job ids by name."""
    heartbeat(store)
    ids = {
        "alice": _run(store, "alice", "default", ("gpu-a", 0), 25),
        "bob": _run(store, "bob", "default", ("gpu-a", 1), 20),
        "carol": _run(store, "carol", "batch", ("gpu-b", 0), 25),
        "erin": _run(store, "erin", "batch", ("gpu-b", 0), 10),
    }
    store.record_pause(ids["bob"], 1, at=time.time(), reason="spike", reason_code="online_compute")
    _evict(store, ids["carol"], latency_s=0.84, missed=False)
    _evict(store, ids["erin"], latency_s=31.5, missed=True)
    ids["frank"] = _run(store, "frank", "batch", ("gpu-b", 0), 30)
    [ids["dave"]] = store.submit(
        JobSpec(command=["true"], queue="batch", hold=True), "dave", defaults_deadline_s=30
    )
    return ids
