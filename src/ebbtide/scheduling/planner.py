"""The planner: snapshot → decisions.  Pure: no clock reads, no I/O.

(Longer than our modules should be: it is one pure pass, and its phases hand each other the
same lanes, budgets and fit index; split by phase, that state would travel between modules.
The snapshot, the capacity arithmetic and the fit index already stand alone.)

One pass reads as numbered phases (after kueue's scheduling cycle):

1. **evict**: on every device where online usage plus offline slices exceed capacity
   minus the margin, pick victims with :mod:`ebbtide.preemption.victims` (not on figures
   from a planning-only source); also evict attempts whose cancellation was asked for.
2. **account**: headroom per device = capacity − online − expected growth − margin −
   offline slices (slices being evicted still count until they are free); none on a
   device that is out of service or drained.
3. **nominate**: queued jobs in order — priority (high first), then submission order
   (a requeued job keeps its place ahead of later submissions of its priority).
4. **admit**: each job goes to the device that fits it best (least headroom left over,
   compute and memory together, each as a fraction of the device) among the devices of
   nodes that run its owner's jobs (:mod:`~ebbtide.scheduling.owners`); a job that fits
   nowhere is skipped, and so is every later job of the same shape (and, where some node
   refuses someone's jobs, of an owner whose jobs go to the same nodes).  Never into
   headroom that does not cover the slice plus the margin.

One pass over 1,000,000 queued jobs and 10,000 devices takes about 80 ms on two shared
cores, with the queue in the store's order (``benchmarks/plan_scale.py``):

- the best fit is found with an index of the devices' free headroom (:class:`FitIndex`)
  instead of a scan of every device, and it picks the very device the scan
  (:func:`best_fit_scan`) would, ties included; the jobs of a shape that comes back (an
  array's tasks) take the best fits its last search kept; whole-GPU jobs, each node's
  score kept per shape (:class:`WholeFit`);
- the queue is read only as far as the pass goes when the caller says it is in order
  already (the store lists it so), and sorted a priority at a time otherwise;
- a device whose slices all fit (most of a fleet) skips the relief reckoning, and why a
  job finds no device is worked out once per queue and timing, not once per job;
- whose jobs each node runs is looked at per job only where some node refuses someone's
  (:class:`~ebbtide.scheduling.owners.Owners`); then each class of owners that some node
  refuses gets a fit index of the devices that take its jobs, kept in step with the
  pass's own, and a job that fits nowhere is known of the whole class (the owners no
  node singles out share one), so many owners cost what one does;
- once the reasons are full, the jobs of shapes known to fit nowhere are passed over: given
  the queue by planning group (:class:`~ebbtide.scheduling.snapshot.GroupedJobs`, as the
  scheduler's copy of the queue keeps it), such a group is left unread, and so is a group
  whose array is at its limit or whose queue's ``max_running`` or ``max_fleet_share`` is
  spent (none of it in a backoff), so a pass reads the jobs it places and refuses,
  whatever the length of the queue; given a list, the shapes that fit nowhere are passed
  over at C speed.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, count, islice
from operator import attrgetter, not_

from ebbtide.preemption.relief import ActionKind, relief_for_device
from ebbtide.preemption.victims import Eviction, EvictReason
from ebbtide.queue.states import JobState
from ebbtide.scheduling import fit
from ebbtide.scheduling.admission import (
    MAX_REASONS,
    Quotas,
    Unplaced,
    clock_text,
    device_share,
    drain_evictions,
    fits_before_close,
    ready_at,
    share_evictions,
)
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT, headroom, within
from ebbtide.scheduling.fit import EPS, FitIndex, Free, WholeFit, fits, whole_pick
from ebbtide.scheduling.fit import MIN_WHOLE_GPU_HEADROOM_PCT as MIN_WHOLE_GPU_HEADROOM_PCT
from ebbtide.scheduling.owners import Allowed, Owners, OwnersWait
from ebbtide.scheduling.snapshot import (
    ActiveAttempt,
    DeviceView,
    GroupedJobs,
    Margins,
    QueuedJob,
    QueueGate,
    Snapshot,
    protected,
    queue_order,
)

#: What a device with no slice holds: no slice, no compute (percent), no memory (MiB).
_NOTHING_HELD = (0, 0.0, 0.0)
_PRIORITY = attrgetter("priority")
_ID = attrgetter("id")
#: A job's shape: jobs of one shape fit where the others do (and, under windows, in time)
SHAPE = attrgetter("compute_pct", "memory_mib", "gpus")
_SHAPE_AND_TIMING = attrgetter(
    "compute_pct", "memory_mib", "gpus", "queue", "first_checkpoint_s", "deadline_s"
)
_COMPUTE = attrgetter("compute_pct")
_MEMORY = attrgetter("memory_mib")


@dataclass(frozen=True)
class Dispatch:
    """A decision to start ``job_id`` on a slice."""

    job_id: int
    #: the job's attempt count seen in the snapshot; the store fences on it
    expected_attempts: int
    node: str
    devices: tuple[int, ...]
    compute_pct: float
    memory_mib: int


@dataclass
class Plan:
    dispatches: list[Dispatch] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    #: why queued jobs were not started this pass (a window, a quota, a backoff, no room)
    blocked: dict[int, str] = field(default_factory=dict)
    #: the next instant (Unix seconds) at which time alone changes a decision: a drain
    #: before a window closes, a backoff or a cooldown ending; None when nothing waits
    wake_at: float | None = None


def plan(snapshot: Snapshot, *, queued_in_order: bool = False) -> Plan:
    """The decisions of one pass on ``snapshot``.

    ``queued_in_order``: the caller vouches that ``snapshot.queued`` is in nomination order
    already (priority, high first, then id, as :meth:`Store.queued_jobs` lists it); the
    pass then reads only the jobs it reaches instead of sorting them all (at a million
    queued jobs, reading each one's priority takes longer than the rest of the pass).
    """
    out = Plan()
    now = snapshot.now
    limits = snapshot.queues
    wakes: list[float] = []

    def guarded(a: ActiveAttempt) -> bool:
        return protected(a, limits.get(a.queue), now)

    # 1. evict: online pressure, cancellations, windows closing, shares exceeded
    by_device: dict[tuple[str, int], list[ActiveAttempt]] = {}
    for a in snapshot.active:
        for d in a.devices:
            by_device.setdefault((a.node, d), []).append(a)
    margins = snapshot.margins
    # per device, in snapshot order: its slices, and the compute and memory they hold (the
    # sums allocated() makes; ``here`` holds the device's slices only)
    held: list[tuple[int, float, float]] = []
    chosen: set[tuple[int, int]] = set()
    for device in snapshot.devices:
        here = by_device.get(device.key)
        if not here:
            held.append(_NOTHING_HELD)
            continue  # no slice to take back
        held.append((len(here), sum(map(_COMPUTE, here), 0.0), sum(map(_MEMORY, here), 0.0)))
        if device.planning_only or _calm(device, here, margins):
            continue  # figures too old to evict on, or no shortfall
        for r in relief_for_device(device, here, margins, now, snapshot.pause, guarded):
            # a pause is the node agent's to make (it freezes the attempt in place); the
            # scheduler evicts only what a pause cannot relieve
            if r.kind is ActionKind.EVICT and (r.job_id, r.attempt) not in chosen:
                chosen.add((r.job_id, r.attempt))
                out.evictions.append(
                    Eviction(r.job_id, r.attempt, r.node, r.reason, r.deadline_s, r.message)
                )
    for a in snapshot.active:
        if a.cancel_requested and not a.evicting and (a.job_id, a.attempt) not in chosen:
            chosen.add((a.job_id, a.attempt))
            out.evictions.append(
                Eviction(
                    a.job_id,
                    a.attempt,
                    a.node,
                    EvictReason.CANCELLED,
                    a.deadline_s,
                    "cancelled by its owner",
                )
            )
    drains, later = drain_evictions(snapshot, chosen)
    out.evictions += drains
    wakes += later
    out.evictions += share_evictions(snapshot, by_device, chosen)

    if not snapshot.offline_allowed:
        out.wake_at = _next(wakes, now)
        return out

    # 2. account
    gates = snapshot.gates
    # devices under pressure: an eviction decided now or still in flight
    evicting = JobState.EVICTING  # what ActiveAttempt.evicting compares with
    pressed = {
        (a.node, d)
        for a in snapshot.active
        if a.state == evicting or (a.job_id, a.attempt) in chosen
        for d in a.devices
    }
    free: dict[tuple[str, int], Free] = {}
    for device, (slices, alloc_c, alloc_m) in zip(snapshot.devices, held, strict=True):
        key = device.key
        c, m = headroom(device, alloc_c, alloc_m, margins)
        # a device under pressure takes nothing new until its slices are free; nor does
        # one cooling down after an eviction
        if key in pressed:
            c = m = 0.0
        if device.cooldown_until > now:
            c = m = 0.0
            wakes.append(device.cooldown_until)
        if device.unavailable:
            c = m = 0.0  # out of service (a fault) or drained by an admin
        if gates is not None:
            share = device_share(gates.get(key))
            c = min(c, share * DEVICE_COMPUTE_PCT - alloc_c)
            m = min(m, share * device.memory_mib - alloc_m)
        free[key] = Free(device, c, m, slices, 0, alloc_c, alloc_m)
    by_node: dict[str, list[Free]] = {}
    for pos, f in enumerate(free.values()):
        f.pos = pos
        by_node.setdefault(f.device.node, []).append(f)

    running_per_array = Counter(a.array_id for a in snapshot.active if a.array_id is not None)
    quotas = Quotas(limits, snapshot.active, len(snapshot.devices)) if limits else None
    lanes = _Lanes(snapshot, free) if gates is not None else None

    def refuse(job: QueuedJob, why: str) -> None:
        if len(out.blocked) < MAX_REASONS:
            out.blocked[job.id] = why

    # 3. nominate, 4. admit
    index = FitIndex(free.values())
    wholes = WholeFit(by_node, index)
    # whose jobs each node runs: looked at per job only where some node refuses someone's
    owners = Owners(snapshot.devices)
    anyone = owners.anyone
    if not anyone:
        owners.bind(list(free.values()), by_node, index)
    # shapes known to fit nowhere (where some node refuses someone's jobs: nowhere their
    # class of owners' jobs go), and why; an owner's name is put in as a reason is written
    misfits: dict[tuple[object, ...], str | OwnersWait] = {}
    unplaced = Unplaced(snapshot, snapshot.devices)
    # where some node refuses someone's: per class of owners that some node refuses, the
    # reason of the devices that take its jobs (not of the devices that would refuse them)
    unplaced_of: dict[str, Unplaced] = {}
    dispatches = out.dispatches
    of_shape = SHAPE if lanes is None else _SHAPE_AND_TIMING
    shape_of: Callable[[QueuedJob], tuple[object, ...]] = of_shape
    if not anyone:
        told = {o: o for o in owners.singled_out}.get

        def of_shape_and_class(job: QueuedJob) -> tuple[object, ...]:
            """... and the class of its owner (:meth:`Owners.class_of`): they go to the
            same nodes."""
            return of_shape(job), told(job.owner, "")

        shape_of = of_shape_and_class

    def refuse_misfit(job: QueuedJob, shape: tuple[object, ...]) -> None:
        # (the reason worked out for the first job of the shape and class: where it names
        # a refusing node with room, jobs placed since in this pass may have taken that
        # room; the next pass words it anew)
        if len(out.blocked) < MAX_REASONS:
            why = misfits[shape]
            out.blocked[job.id] = why if isinstance(why, str) else why.text(job.owner)

    def admit(job: QueuedJob, shape: tuple[object, ...]) -> None:
        """Place ``job``, of a shape not known to fit nowhere, or say why not."""
        if (
            job.array_id is not None
            and job.array_limit is not None
            and running_per_array[job.array_id] >= job.array_limit
        ):
            refuse(job, f"array limit: {job.array_limit} of its array already running")
            return
        if job.evictions >= 2 and (until := ready_at(job, snapshot)) > now:
            if len(out.blocked) < MAX_REASONS:  # (the time in words costs a few µs)
                ready = clock_text(until)
                refuse(job, f"backoff: evicted {job.evictions} times; not before {ready}")
            wakes.append(until)
            return
        if quotas is not None and (why := quotas.refusal(job)) is not None:
            refuse(job, why)
            return
        takers = None if anyone else owners.allowed(job.owner)
        if job.gpus >= 1:
            allowed = lanes.allows(job) if lanes is not None else None
            if takers is None:
                placed = _place_whole(job, by_node, index, wholes, allowed)
            else:
                placed = _place_whole(
                    job, takers.by_node, index, takers.wholes(), allowed, takers.index()
                )
        elif lanes is not None and not lanes.plain(job):
            placed = _place_gated(job, lanes, index, takers)
        elif takers is None:
            placed = _place_fraction(job, free.values(), index)
        else:
            placed = _place_fraction(job, takers.frees, index, takers.index())
        if placed is None:
            if takers is None:
                misfits[shape] = unplaced.reason(job)
            elif (wait := owners.reason(takers, _room(job, lanes))) is not None:
                misfits[shape] = wait
            else:
                key = owners.class_of(job.owner)
                if key not in unplaced_of:
                    unplaced_of[key] = Unplaced(snapshot, [f.device for f in takers.frees])
                misfits[shape] = unplaced_of[key].reason(job)
            refuse_misfit(job, shape)
            return
        node, devices = placed
        dispatches.append(
            Dispatch(job.id, job.attempts, node, devices, job.compute_pct, job.memory_mib)
        )
        if job.array_id is not None:
            running_per_array[job.array_id] += 1
        if quotas is not None:
            quotas.take(job)

    def spent(job: QueuedJob, shape: tuple[object, ...]) -> bool:
        """Whether every later job of ``job``'s planning group is refused this pass, and
        does nothing more than say why: its shape fits nowhere (where some node refuses
        someone's jobs: nowhere its class of owners' go, the groups told apart by owner
        at least as the nodes of the pass do, so that every job of the group has the
        shape, as ``misfits`` keys it, of ``job``), its array is at its limit, or its
        queue's own quota is spent (none of the group in a backoff, whose end the
        refusal would ask to be woken at).  What each counts only grows in a pass."""
        if shape in misfits:
            return by_owner
        if (
            job.array_id is not None
            and job.array_limit is not None
            and running_per_array[job.array_id] >= job.array_limit
        ):
            return True
        return quotas is not None and job.evictions < 2 and quotas.queue_refusal(job) is not None

    queued = snapshot.queued
    if isinstance(queued, GroupedJobs):
        # the groups hold one class of owners each (as the nodes of this pass tell them
        # apart), so that one's misfit is the group's (every owner's one class where no
        # node singles one out)
        by_owner = owners.singled_out <= queued.singled_out
        # the groups merged in scheduling order; once the reasons are full, a group none
        # of whose jobs can start (see ``spent``) is left behind unread (a pass reads what
        # it places and refuses)
        groups = [iter(g) for g in queued.groups]
        heads = [(queue_order(j), k, j) for k, g in enumerate(groups) if (j := next(g, None))]
        heapq.heapify(heads)
        while heads and len(dispatches) < snapshot.max_dispatches:
            _, k, job = heads[0]
            shape = shape_of(job)
            if shape not in misfits:
                admit(job, shape)
            else:
                refuse_misfit(job, shape)
            if len(out.blocked) >= MAX_REASONS and spent(job, shape):
                heapq.heappop(heads)
                continue
            following = next(groups[k], None)
            if following is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (queue_order(following), k, following))
        out.wake_at = _next(wakes, now)
        return out
    runs = [queued] if queued_in_order else _nominated(queued)
    for run in runs:
        # the jobs of ``run`` by position; ``ahead`` reads on from ``read`` (see below)
        ahead, read, i = iter(run), 0, 0
        while i < len(run) and len(dispatches) < snapshot.max_dispatches:
            job = run[i]
            i += 1
            shape = shape_of(job)
            if shape not in misfits:
                admit(job, shape)
                continue
            refuse_misfit(job, shape)
            if len(out.blocked) >= MAX_REASONS:
                # nothing more to say, and this shape fits nowhere: no job of a shape
                # known to fit nowhere changes anything now, so go on to the next of
                # another shape (read at C speed: a full fleet has a long queue)
                i = _next_unknown(ahead, i - read, i, shape_of, misfits, len(run))
                read = i + 1
        if len(dispatches) >= snapshot.max_dispatches:
            break  # before the next priority's jobs are sorted
    out.wake_at = _next(wakes, now)
    return out


def _next_unknown(
    ahead: Iterator[QueuedJob],
    behind: int,
    start: int,
    shape_of: Callable[[QueuedJob], tuple[object, ...]],
    misfits: Container[tuple[object, ...]],
    end: int,
) -> int:
    """The position of the next job, from ``start`` on, whose shape ``misfits`` does not
    hold (``end`` when none), read from ``ahead``, which is ``behind`` jobs behind
    ``start``: ``ahead`` is left just past that job.  Built of C iterators only."""
    next(islice(ahead, behind, behind), None)
    unknown = map(not_, map(misfits.__contains__, map(shape_of, ahead)))
    return next(compress(count(start), unknown), end)


def _calm(device: DeviceView, here: list[ActiveAttempt], margins: Margins) -> bool:
    """Whether :func:`relief_for_device` has nothing to do on ``device``: no slice there is
    paused or suspended (so none has been for too long) and nothing overflows, reckoned
    as :func:`~ebbtide.scheduling.capacity.overflow` does with none paused or suspended
    (the same sums in the same order).  Most devices of a fleet are calm, and this costs
    a fraction of the relief's own reckoning."""
    compute = memory = 0.0
    for a in here:
        if a.paused_at is not None or a.suspended_at is not None:
            return False
        memory += a.memory_mib
        if a.gpus == 0:
            compute += a.compute_pct
    return within(device, compute, memory, margins)


def _next(times: list[float], now: float) -> float | None:
    return min((t for t in times if t > now), default=None)


class _Lanes:
    """Which devices take a queue under the open windows, and on what terms."""

    def __init__(self, snapshot: Snapshot, free: dict[tuple[str, int], Free]) -> None:
        assert snapshot.gates is not None
        self.now = snapshot.now
        self._gates = snapshot.gates
        self._free = free
        self._lanes: dict[str, list[tuple[Free, QueueGate]]] = {}
        self._plain: dict[str, bool] = {}

    def lane(self, queue: str) -> list[tuple[Free, QueueGate]]:
        if queue not in self._lanes:
            lane = []
            for key, f in self._free.items():
                g = self._gates.get(key)
                q = g.open.get(queue) if g is not None else None
                if q is not None:
                    lane.append((f, q))
            self._lanes[queue] = lane
            # every device, no close and the device's own share: the fit index serves it
            self._plain[queue] = len(lane) == len(self._free) and all(
                math.isinf(q.open_until) and q.share >= device_share(self._gates.get(f.device.key))
                for f, q in lane
            )
        return self._lanes[queue]

    def plain(self, job: QueuedJob) -> bool:
        self.lane(job.queue)
        return self._plain[job.queue]

    def allows(self, job: QueuedJob) -> Callable[[Free], bool]:
        ok = {
            f.pos
            for f, q in self.lane(job.queue)
            if fits_before_close(job, q.open_until, self.now) and _within_share(f, q, job)
        }
        return lambda f: f.pos in ok


def _within_share(f: Free, q: QueueGate, job: QueuedJob) -> bool:
    """The queue's own share on the device (tighter than the device's, when windows
    admitting other queues allow more)."""
    return (
        f.alloc_compute + job.compute_pct <= q.share * DEVICE_COMPUTE_PCT + EPS
        and f.alloc_memory + job.memory_mib <= q.share * f.device.memory_mib + EPS
    )


def _place_gated(
    job: QueuedJob, lanes: _Lanes, index: FitIndex, takers: Allowed | None = None
) -> tuple[str, tuple[int, ...]] | None:
    now = lanes.now
    cands = [
        f
        for f, q in lanes.lane(job.queue)
        if fits_before_close(job, q.open_until, now)
        and _within_share(f, q, job)
        and (takers is None or takers.takes(f))
    ]
    best = fit.best_fit_scan(job, cands)
    if best is None:
        return None
    _spend(best, job, index)
    return best.device.node, (best.device.index,)


def _spend(f: Free, job: QueuedJob, index: FitIndex) -> None:
    f.compute -= job.compute_pct
    f.memory -= job.memory_mib
    f.alloc_compute += job.compute_pct
    f.alloc_memory += job.memory_mib
    f.offline_slices += 1
    index.refile(f)


def _room(job: QueuedJob, lanes: _Lanes | None) -> Callable[[list[Free]], bool]:
    """Whether a node's devices, as they are now, would take ``job`` were its owner not
    refused there (by the rules the placement applies)."""
    if job.gpus >= 1:
        allowed = lanes.allows(job) if lanes is not None else None
        return lambda frees: whole_pick(frees, job, allowed) is not None
    if lanes is not None and not lanes.plain(job):
        open_here = lanes.allows(job)
        return lambda frees: any(open_here(f) and fits(f, job) for f in frees)
    return lambda frees: any(fits(f, job) for f in frees)


def _nominated(queued: Iterable[QueuedJob]) -> Iterator[list[QueuedJob]]:
    """``queued`` by priority (high first), then submission order (a requeued job keeps
    its id), one priority at a time; jobs equal in both keep their given order.

    One stable sort on priority (linear on the store's list, which is in this order
    already), then the jobs of each priority by id, only once the pass reaches them: the
    same order as one sort on ``(-priority, id)``, but a pass that stops after a few
    thousand jobs reads the id of the first priorities' jobs only, and builds no key
    tuple per job.
    """
    jobs = sorted(queued, key=_PRIORITY, reverse=True)
    start = 0
    while start < len(jobs):
        end = bisect_right(jobs, -jobs[start].priority, lo=start, key=_minus_priority)
        yield sorted(jobs[start:end], key=_ID)
        start = end


def _minus_priority(job: QueuedJob) -> int:
    return -job.priority


def _place_fraction(
    job: QueuedJob, frees: Iterable[Free], index: FitIndex, search: FitIndex | None = None
) -> tuple[str, tuple[int, ...]] | None:
    """The best fit among ``frees``, found by ``search`` (an index of just those devices;
    None: ``index``, the pass's own, of every device) or by a scan; spent in ``index``."""
    search = index if search is None else search
    best = search.best_fit(job) if search.serves(job) else fit.best_fit_scan(job, frees)
    if best is None:
        return None
    _spend(best, job, index)
    return best.device.node, (best.device.index,)


def _place_whole(
    job: QueuedJob,
    by_node: dict[str, list[Free]],
    index: FitIndex,
    wholes: WholeFit,
    allowed: Callable[[Free], bool] | None = None,
    search: FitIndex | None = None,
) -> tuple[str, tuple[int, ...]] | None:
    """``gpus`` devices on one node of ``by_node`` with no offline slice, each with compute
    headroom of at least :data:`MIN_WHOLE_GPU_HEADROOM_PCT`; the job then holds all of that
    headroom.  ``wholes`` and ``search`` (None: ``index``) index ``by_node``'s devices;
    what the job takes is spent in ``index``, the pass's own."""
    best: list[Free] | None = None
    if allowed is None and (index if search is None else search).serves(job):
        best = wholes.best(job)
    else:
        best_score = 0.0
        for frees in by_node.values():
            picked = whole_pick(frees, job, allowed)
            if picked is not None and (best is None or picked[0] < best_score):
                best_score, best = picked
    if best is None:
        return None
    for f in best:
        f.compute = 0.0
        f.memory -= job.memory_mib
        f.alloc_compute += DEVICE_COMPUTE_PCT
        f.alloc_memory += job.memory_mib
        f.offline_slices += 1
        index.refile(f)
    return best[0].device.node, tuple(sorted(f.device.index for f in best))
