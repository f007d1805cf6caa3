"""Forecasting headroom: how much online usage may grow within an eviction deadline.

A slice handed out now must be free again within its deadline once the online tenant
needs the room.  Admission therefore keeps back, per device, the growth the online side
is expected to show within that deadline: a high quantile of its recent *rises* over
deadline-long windows.  The reserve goes into :attr:`DeviceView.reserve_compute_pct` and
:attr:`DeviceView.reserve_memory_mib`; the planner subtracts it from the headroom.

The rise at time τ over a window of ``D`` seconds is ``x(τ) − min x over [τ − D, τ]``:
how far usage climbed within the last ``D`` seconds.  Usage is a step function between
samples, and the distribution of rises is weighted by *time*, not by sample count, so
feeding every 50 ms sample (the node agent) or only the samples where usage changed (the
simulator) gives the same forecast.  Only the last ``history_s`` seconds count.

Pure: no clock, no I/O; the caller passes each sample's time.  :meth:`Forecaster.observe`
is O(1) amortised (a monotonic deque per window and metric, a histogram in time buckets);
:meth:`Forecaster.reserve` is O(bins) and cached until the next observation.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: Default window over which rises are measured: the default eviction deadline, in seconds.
DEFAULT_WINDOW_S = 30.0
#: Default span of history the quantile is taken over, in seconds.
DEFAULT_HISTORY_S = 3600.0
#: Default quantile of the time-weighted distribution of compute rises kept in reserve:
#: a compute rise beyond it costs the online side a moment of contention until the
#: eviction completes.
DEFAULT_COMPUTE_QUANTILE = 0.9
#: Default quantile for memory: a memory rise beyond the reserve and the margin is an
#: online OOM, so the reserve covers the largest rise in the history.
DEFAULT_MEMORY_QUANTILE = 1.0
#: Width of one compute histogram bin, in percent (the reserve is rounded up to a bin).
COMPUTE_BIN_PCT = 0.5
#: Width of one memory histogram bin, in MiB (the reserve is rounded up to a bin).
MEMORY_BIN_MIB = 64.0
#: How many time buckets the history is kept in (memory and expiry granularity).
HISTORY_BUCKETS = 12
#: Histogram weights below this are dropped as float noise, in seconds.
_NOISE_S = 1e-9


@dataclass(slots=True)
class _Held:
    """One sample in a monotonic deque: ``value`` holds from ``t`` until ``end``."""

    t: float
    value: float
    end: float | None = None


class _Histogram:
    """Time-weighted histogram of rises (in bins) over the last ``history_s`` seconds."""

    def __init__(self, history_s: float, buckets: int) -> None:
        self.bucket_s = history_s / buckets
        self.buckets = buckets
        self.history_s = self.bucket_s * buckets
        self.ring: deque[tuple[int, dict[int, float]]] = deque()
        self.total: dict[int, float] = {}
        #: the bins of ``total``, in ascending order (kept as bins come and go)
        self.bins: list[int] = []
        self.weight = 0.0
        self.version = 0

    def add(self, t: float, duration: float, b: int) -> None:
        """Add ``duration`` seconds of rise bin ``b`` starting at time ``t``.  (It runs at
        every sample of every device: the bucket's update is written out here.)"""
        history = self.history_s
        if duration > history:  # only the last ``history_s`` seconds can still count
            t, duration = t + duration - history, history
        bucket_s = self.bucket_s
        ring, total, bins = self.ring, self.total, self.bins
        while duration > 0:
            k = math.floor(t / bucket_s)
            edge = (k + 1) * bucket_s - t
            piece = duration if duration <= edge else edge  # min(duration, edge)
            if piece <= 0:  # float edge: t sits on a bucket boundary
                piece = duration if duration <= bucket_s else bucket_s
            if not ring or ring[-1][0] < k:
                ring.append((k, {}))
                while ring[0][0] <= k - self.buckets:
                    self._expire(ring.popleft()[1])
            bucket = ring[-1][1]
            bucket[b] = bucket.get(b, 0.0) + piece
            was = total.get(b)
            if was is None:
                insort(bins, b)
                total[b] = 0.0 + piece
            else:
                total[b] = was + piece
            self.weight += piece
            self.version += 1
            t += piece
            duration -= piece

    def _expire(self, old: dict[int, float]) -> None:
        """Take a bucket that fell out of the history off the totals."""
        total = self.total
        for ob, ow in old.items():
            held = total.pop(ob, None)
            left = (0.0 if held is None else held) - ow
            if left > _NOISE_S:
                total[ob] = left
                if held is None:
                    insort(self.bins, ob)
            elif held is not None:
                del self.bins[bisect_left(self.bins, ob)]
            self.weight -= ow

    def quantile_bin(self, q: float) -> int:
        """The smallest bin with at least ``q`` of the weight at or below it."""
        total = self.total
        if not total:
            return 0
        bins = self.bins
        if q == 1.0:  # no tail: the highest bin with weight (the sum is not needed)
            top = bins[-1]
            if total[top] > _NOISE_S:
                return top
            tail = 0.0
        else:
            tail = (1.0 - q) * sum(total.values())
        above = 0.0
        for b in reversed(bins):
            above += total[b]
            if above > tail + _NOISE_S:
                return b
        return 0


class _RiseTracker:
    """Rises of one metric over windows of ``window_s``: sliding minimum + histogram."""

    def __init__(self, window_s: float, bin_width: float, history_s: float, buckets: int) -> None:
        self.window_s = window_s
        self.bin_width = bin_width
        self.minima: deque[_Held] = deque()
        self.hist = _Histogram(history_s, buckets)
        self.last_t: float | None = None

    def observe(self, t: float, value: float) -> None:
        minima = self.minima
        last_t = self.last_t
        if last_t is not None:
            if t < last_t:
                raise ValueError(f"samples must come in time order: {t} after {last_t}")
            self._integrate(last_t, t)
            minima[-1].end = t
        while minima and minima[-1].value >= value:
            minima.pop()
        minima.append(_Held(t, value))
        self.last_t = t

    def _integrate(self, start: float, stop: float) -> None:
        """Account the rises of ``[start, stop)``, during which the last value held."""
        minima = self.minima
        current = minima[-1].value
        d, width, add = self.window_s, self.bin_width, self.hist.add
        tau = start
        while tau < stop:
            front = minima[0]
            end = front.end
            if end is not None and end + d <= tau:
                minima.popleft()
                continue
            if end is None:
                seg_end = stop
            else:
                reach = end + d
                seg_end = stop if stop <= reach else reach  # min(stop, end + d)
            rise = current - front.value
            add(tau, seg_end - tau, math.ceil(rise / width - 1e-9) if rise > 0 else 0)
            tau = seg_end

    def reserve(self, quantile: float) -> float:
        return self.hist.quantile_bin(quantile) * self.bin_width

    @property
    def covered_s(self) -> float:
        return self.hist.weight


class _Peak:
    """The highest value of a step function over the last ``span_s`` seconds."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.maxima: deque[_Held] = deque()

    def observe(self, t: float, value: float) -> None:
        maxima = self.maxima
        if maxima:
            maxima[-1].end = t
        while maxima and maxima[-1].value <= value:
            maxima.pop()
        maxima.append(_Held(t, value))
        horizon = t - self.span_s
        while (end := maxima[0].end) is not None and end <= horizon:
            maxima.popleft()

    @property
    def value(self) -> float:
        return self.maxima[0].value if self.maxima else 0.0


class Forecaster:
    """Expected online growth of one device within an eviction deadline.

    Feed it samples with :meth:`observe` (in time order, any spacing); ask
    :meth:`reserve` for the compute (percent) and memory (MiB) to keep back.

    ``windows_s`` are the window lengths rises are measured over (one per typical
    deadline); ``reserve(deadline_s)`` uses the shortest window at least as long as the
    deadline, and for a deadline longer than every window scales the longest one's reserve
    up by ``deadline_s / window`` (rises add up).  Until ``warmup_s`` seconds of history
    have been seen, :meth:`reserve` returns ``cold_reserve``.

    With ``memory_to_peak`` (the default) the memory reserve is also at least the way
    back up to the highest online memory of the history: memory the online tenant held
    recently (a model it unloaded, a cache it dropped) it may take again at once, and
    a memory rise that does not fit is an OOM, not a slowdown.
    """

    def __init__(
        self,
        windows_s: Sequence[float] = (DEFAULT_WINDOW_S,),
        *,
        history_s: float = DEFAULT_HISTORY_S,
        compute_quantile: float = DEFAULT_COMPUTE_QUANTILE,
        memory_quantile: float = DEFAULT_MEMORY_QUANTILE,
        warmup_s: float = 0.0,
        cold_reserve: tuple[float, float] = (0.0, 0.0),
        compute_bin_pct: float = COMPUTE_BIN_PCT,
        memory_bin_mib: float = MEMORY_BIN_MIB,
        buckets: int = HISTORY_BUCKETS,
        memory_to_peak: bool = True,
    ) -> None:
        if not windows_s or any(not (w > 0 and math.isfinite(w)) for w in windows_s):
            raise ValueError(f"windows_s must be positive durations, got {windows_s!r}")
        for name, q in (
            ("compute_quantile", compute_quantile),
            ("memory_quantile", memory_quantile),
        ):
            if not 0.0 < q <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {q!r}")
        if not history_s > 0:
            raise ValueError(f"history_s must be positive, got {history_s!r}")
        self.windows_s = tuple(sorted(set(windows_s)))
        self.compute_quantile = compute_quantile
        self.memory_quantile = memory_quantile
        self.warmup_s = warmup_s
        self.cold_reserve = cold_reserve
        self._compute = {
            w: _RiseTracker(w, compute_bin_pct, history_s, buckets) for w in self.windows_s
        }
        self._memory = {
            w: _RiseTracker(w, memory_bin_mib, history_s, buckets) for w in self.windows_s
        }
        self._peak = _Peak(history_s) if memory_to_peak else None
        #: the window each deadline asked for uses (see :meth:`reserve`)
        self._window_for: dict[float, float] = {}
        self._memory_now = 0.0
        self._cache: dict[float, tuple[int, tuple[float, float]]] = {}
        self._observed = 0

    def observe(self, t: float, compute_pct: float, memory_mib: float) -> None:
        """Online usage ``compute_pct`` % and ``memory_mib`` MiB from time ``t`` (seconds) on."""
        for tracker in self._compute.values():
            tracker.observe(t, compute_pct)
        for tracker in self._memory.values():
            tracker.observe(t, memory_mib)
        if self._peak is not None:
            self._peak.observe(t, memory_mib)
        self._memory_now = memory_mib
        self._observed += 1

    def reserve(self, deadline_s: float = DEFAULT_WINDOW_S) -> tuple[float, float]:
        """Compute (percent) and memory (MiB) the online side may grow by within ``deadline_s``."""
        window = self._window_for.get(deadline_s)
        if window is None:
            window = self._window_for[deadline_s] = self._window(deadline_s)
        scale = max(1.0, deadline_s / window)
        cached = self._cache.get(window)
        if cached is not None and cached[0] == self._observed:
            c, m = cached[1]
        else:
            ct, mt = self._compute[window], self._memory[window]
            if ct.covered_s < self.warmup_s:
                c, m = self.cold_reserve
            else:
                c = ct.reserve(self.compute_quantile)
                m = mt.reserve(self.memory_quantile)
                if self._peak is not None:
                    m = max(m, self._peak.value - self._memory_now)
            self._cache[window] = (self._observed, (c, m))
        return c * scale, m * scale

    def warmup_left_s(self, deadline_s: float = DEFAULT_WINDOW_S) -> float:
        """Seconds of history still to be seen before :meth:`reserve` is the forecast
        rather than the cold reserve (0 once warm)."""
        window = self._window(deadline_s)
        return max(0.0, self.warmup_s - self._compute[window].covered_s)

    def _window(self, deadline_s: float) -> float:
        """The shortest window at least ``deadline_s`` long, else the longest."""
        return next((w for w in self.windows_s if w >= deadline_s), self.windows_s[-1])

    def covered_s(self) -> float:
        """Seconds of history the forecast currently rests on."""
        return self._compute[self.windows_s[0]].covered_s
