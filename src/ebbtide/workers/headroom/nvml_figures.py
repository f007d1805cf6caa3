"""What one GPU's NVML readings say (:mod:`~ebbtide.workers.headroom.nvml`'s figures).

``NvmlSource`` reads each GPU at its own rates and keeps here what it read: the process
list and whose each process is (:class:`Listed`), per-process SM samples
(:class:`ProcessSamples`), the utilisation and the last sample (:class:`Readings`).
:func:`figures` turns them into a :class:`~ebbtide.workers.headroom.base.DeviceSample`;
it reads nothing.
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from ebbtide.workers.headroom.base import ComputeBasis, DeviceSample, JobUsage, Offline
from ebbtide.workers.headroom.nvml_lists import ListReader

MIB_B = 1024 * 1024
_S_US = 1_000_000

#: A per-process SM sample counts this long after it was taken, in seconds (and is dropped
#: when stamped further than this in the future); GPUs sample every 1/6 s to 1 s.
PROCESS_SAMPLE_MAX_AGE_S = 2.0


@dataclass
class ProcessSamples:
    """The latest per-process SM sample of each process on one GPU."""

    #: pid → (timestamp µs, smUtil)
    latest: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: the newest timestamp seen (NVML is asked for newer ones only), µs
    newest_us: int = 0
    #: µs: when :meth:`fresh` last forgot stale samples, and before when none of those
    #: kept can go stale (it forgets again then)
    pruned_at_us: float = -math.inf
    prune_at_us: float = math.inf
    #: counts the changes of ``latest``
    version: int = 0
    #: what :meth:`fresh` last returned: ``version`` then, the ``pids`` asked about, the
    #: answer (asked again about the same pids while ``latest`` stays the same, it is
    #: the same dict: a GPU is sampled 20 times a second, its SM samples read a few)
    _fresh: tuple[int, Container[int], dict[int, int]] | None = field(default=None, repr=False)

    def read(self, lists: ListReader, handle: Any, now: float) -> None:
        """Take in the samples newer than the newest seen.  Raises ``NotSupported`` /
        ``NoPermission`` where the GPU keeps no samples."""
        now_us = round(now * _S_US)
        max_age_us = round(PROCESS_SAMPLE_MAX_AGE_S * _S_US)
        if self.newest_us > now_us + max_age_us:  # the clock went back: start over
            self.newest_us, self.latest = 0, {}
            self.pruned_at_us, self.prune_at_us = -math.inf, math.inf
            self.version += 1
        # none newer: what was seen still holds
        for s in lists.process_utilization(handle, self.newest_us):
            stamp = s.timeStamp
            if stamp > now_us + max_age_us:  # not to be trusted, nor to stop the asking
                continue
            seen = self.latest.get(s.pid)
            if seen is None or stamp >= seen[0]:
                self.latest[s.pid] = (stamp, s.smUtil)
                self.prune_at_us = min(self.prune_at_us, stamp + max_age_us + 1)
                self.version += 1
            self.newest_us = max(self.newest_us, stamp)

    def fresh(self, pids: Container[int], now: float) -> dict[int, int]:
        """pid → its fresh smUtil, for the processes in ``pids`` that have one.  Stale
        samples are forgotten; those of processes not listed are kept while fresh (a
        process listed later, when its process list is read again, has its own).  The
        answer is not to be changed: while ``latest`` stays the same, the same ``pids``
        (the same object, itself unchanged) get the same dict."""
        now_us = round(now * _S_US)
        if not self.pruned_at_us <= now_us < self.prune_at_us:
            max_age_us = round(PROCESS_SAMPLE_MAX_AGE_S * _S_US)
            self.latest = {
                pid: (stamp, util)
                for pid, (stamp, util) in self.latest.items()
                if abs(now_us - stamp) <= max_age_us
            }
            oldest_us = min((stamp for stamp, _ in self.latest.values()), default=math.inf)
            self.pruned_at_us, self.prune_at_us = now_us, oldest_us + max_age_us + 1
            self.version += 1
        last = self._fresh
        if last is not None and last[0] == self.version and last[1] is pids:
            return last[2]
        out = {pid: util for pid, (_, util) in self.latest.items() if pid in pids}
        self._fresh = (self.version, pids, out)
        return out


@dataclass
class Listed:
    """One GPU's process list as last read, and what it says (kept while the device's
    used memory stays what it was then, for up to ``process_list_period_s``)."""

    #: Unix seconds it was read, and the device's used memory then, in bytes
    at: float
    used_b: int
    #: pid → usedGpuMemory in bytes (``None``: unknown)
    processes: dict[int, int | None]
    #: the owners' answers below hold for this ``Offline`` at this epoch (``None``: for
    #: this sample only)
    offline: Any = None
    epoch: int | None = None
    #: ebbtide's processes, the online ones (ascending), and the memory split
    ours: frozenset[int] = frozenset()
    online_pids: tuple[int, ...] = ()
    online_mib: float = 0.0
    offline_mib: float | None = 0.0
    #: job of each of ebbtide's processes
    owners: dict[int, int] = field(default_factory=dict)


@dataclass
class Readings:
    """What a whole GPU said last, and when, of what is read less often than memory."""

    #: ``nvmlDeviceGetUtilizationRates(...).gpu``, and when it was read (Unix seconds)
    utilization_pct: float = 0.0
    utilization_at: float = -math.inf
    #: when per-process samples were last read (Unix seconds); whether the GPU keeps them
    shares_at: float = -math.inf
    shares_supported: bool = True
    #: the GPU lists graphics processes (False once it said ``NotSupported``)
    graphics: bool = True
    listed: Listed | None = None
    #: the last sample, and what it was made from besides the list
    last: DeviceSample | None = None
    last_listed: Listed | None = None
    last_from: tuple[Any, ...] = ()


class OwnersOnce:
    """``offline`` for one sample, each pid's owner looked up once: a sample asks about
    each GPU process several times, and a lookup reads ``/proc``.  ``epoch``: the
    ``offline``'s, when it has one (its answers change only when that does: see
    :class:`~ebbtide.workers.ownership.ProcessOwnership`); else ``None``."""

    def __init__(self, offline: Offline) -> None:
        self.inner = offline
        epoch = getattr(offline, "epoch", None)
        self.epoch: int | None = epoch if isinstance(epoch, int) else None
        self._owners: dict[int, int | None] = {}

    def owner(self, pid: int) -> int | None:
        if pid not in self._owners:
            self._owners[pid] = self.inner.owner(pid)
        return self._owners[pid]

    def granted_compute_pct(self, index: int) -> float:
        return self.inner.granted_compute_pct(index)

    def granted_memory_mib(self, index: int) -> float:
        return self.inner.granted_memory_mib(index)


def figures(
    index: int,
    now: float,
    listed: Listed,
    utilization_pct: float,
    shares_supported: bool,
    shares: dict[int, int] | None,
    granted_compute_pct: float,
) -> DeviceSample:
    """One whole GPU's sample from what was read of it: its process list and whose each
    process is, its utilisation, and (with processes of ebbtide's on it) the per-process
    SM samples, or that the GPU keeps none (then the slices granted count)."""
    processes, ours = listed.processes, listed.ours
    basis = ComputeBasis.DEVICE
    offline_pct: float | None = 0.0
    online_pct = utilization_pct
    if ours:
        if not shares_supported:
            basis, offline_pct = ComputeBasis.SLICES, None
            online_pct = utilization_pct - granted_compute_pct
        else:
            assert shares is not None
            offline_share = float(sum(shares.get(pid, 0) for pid in ours))
            online_share = float(sum(u for pid, u in shares.items() if pid not in ours))
            basis, offline_pct = ComputeBasis.PROCESS, min(100.0, offline_share)
            # a job none of whose processes has a sample yet (it just started, its first
            # sample is up to a period away) is taken to use its slice, so its first
            # kernels are not mistaken for an online spike
            owners = listed.owners
            if set(owners.values()) - {owners[pid] for pid in ours if pid in shares}:
                offline_share = max(offline_share, granted_compute_pct)
            online_pct = max(utilization_pct - offline_share, online_share)
    return DeviceSample(
        index=index,
        time=now,
        online_compute_pct=min(100.0, max(0.0, online_pct)),
        online_memory_mib=listed.online_mib,
        offline_compute_pct=offline_pct,
        offline_memory_mib=listed.offline_mib,
        basis=basis.value,
        online_pids=listed.online_pids,
        offline_jobs=by_job(processes, listed.owners, shares if shares_supported else None),
    )


def fresh_at(at: float, now: float, period_s: float) -> bool:
    """Whether what was read at ``at`` still serves at ``now`` (a clock that stepped back
    reads again)."""
    return at <= now < at + period_s


def memory_split(
    processes: dict[int, int | None], owners: dict[int, int], used_b: int
) -> tuple[float, float | None]:
    """(online MiB, offline MiB or ``None`` when some of ebbtide's processes' is unknown);
    ``owners``: the job of each of ebbtide's processes."""
    ours = [used for pid, used in processes.items() if pid in owners]
    theirs = [used for pid, used in processes.items() if pid not in owners]
    ours_known_b = sum(used or 0 for used in ours)
    if any(used is None for used in theirs):
        online_b = max(0, used_b - ours_known_b)
    else:
        online_b = sum(used or 0 for used in theirs)
    offline_mib = None if any(used is None for used in ours) else ours_known_b / MIB_B
    return online_b / MIB_B, offline_mib


def by_job(
    processes: dict[int, int | None],
    owners: dict[int, int],
    shares: dict[int, int] | None,
) -> tuple[JobUsage, ...]:
    """What each job with a process on the device (``owners``: pid → job, for ebbtide's
    processes) used: its processes' memory (``None`` if some process's is unknown) and,
    with per-process SM samples (``shares``, pid → smUtil; ``None``: none kept here),
    their sum, capped at 100."""
    memory_b: dict[int, int | None] = {}
    compute: dict[int, int] = {}
    for pid, job in owners.items():
        used, seen = processes.get(pid), memory_b.get(job, 0)
        memory_b[job] = None if used is None or seen is None else seen + used
        compute[job] = compute.get(job, 0) + (shares or {}).get(pid, 0)
    return tuple(
        JobUsage(
            job_id=job,
            compute_pct=None if shares is None else float(min(100, compute[job])),
            memory_mib=None if used_b is None else used_b / MIB_B,
        )
        for job, used_b in sorted(memory_b.items())
    )
