"""What one attempt used of its GPUs, summarised while it runs, in a record of fixed size.

The node agent feeds each attempt's :class:`UsageSummary` at most once per
:data:`USAGE_SAMPLE_PERIOD_S` with what the headroom source attributed to the attempt's
processes (:class:`~ebbtide.workers.headroom.base.JobUsage`): compute in percent of a
device's SMs and GPU memory in MiB, the largest over the attempt's devices (a slice is
per device, so its fullest device is what the slice must hold).  Only a source that
attributes GPU use per process (NVML) feeds it; where none does, an attempt has no summary
and nothing is recorded.

Each figure is counted in a histogram of fixed bins — compute in
:data:`COMPUTE_BIN_PCT` bins over 0–100 %, memory in :data:`MEMORY_BIN_MIB` bins up to the
device's size — so a summary's size is set by the device when the attempt starts, never
by how long it runs.  The peak is kept exactly; the p95 is the top of the bin that holds
it (the nearest-rank 95th percentile, rounded up to its bin, never past the peak).

At the attempt's end :meth:`UsageSummary.report` is what the store records on the
attempt's row (:data:`~ebbtide.queue.models.USAGE_COLUMNS`).
"""

from __future__ import annotations

import math
from array import array

#: How often an attempt's usage is sampled, in seconds: the agent ticks at 20 Hz, and a
#: GPU takes per-process samples only every 1/6 s to 1 s, so 1 Hz keeps the tick cheap.
USAGE_SAMPLE_PERIOD_S = 1.0
#: Width of a compute bin, in percent of a device.
COMPUTE_BIN_PCT = 1.0
#: Width of a memory bin, in MiB.
MEMORY_BIN_MIB = 256.0
#: The percentile kept beside the peak, in percent.
PERCENTILE_PCT = 95.0
#: Slack when ranking (95 % of n samples is not n·0.95 + a rounding error).
_EDGE = 1e-9


class Histogram:
    """Counts of values in fixed bins of ``width``: bin ``k`` holds values in
    ``((k - 1) · width, k · width]`` (bin 0: zero and below), up to ``top``; a value above
    ``top`` counts in the last bin.  The largest value is kept exactly."""

    __slots__ = ("counts", "peak", "total", "width")

    def __init__(self, width: float, top: float) -> None:
        if width <= 0 or top < 0:
            raise ValueError(f"a histogram needs a positive width and a top >= 0, got {width}")
        self.width = width
        #: samples per bin (a fixed-size array of unsigned 64-bit counts)
        self.counts = array("Q", [0]) * (math.ceil(top / width) + 1)
        self.total = 0
        self.peak: float | None = None

    def add(self, value: float) -> None:
        k = math.ceil(value / self.width)
        if k * self.width < value:  # (a quotient rounded down to the bin below)
            k += 1
        k = max(0, min(len(self.counts) - 1, k))
        self.counts[k] += 1
        self.total += 1
        self.peak = value if self.peak is None else max(self.peak, value)

    def percentile(self, pct: float) -> float | None:
        """The nearest-rank ``pct``-th percentile, to the top of its bin and no more than
        the peak; ``None`` with no value yet."""
        if self.peak is None:
            return None
        rank = max(1, math.ceil(pct / 100 * self.total - _EDGE))
        seen = 0
        last = len(self.counts) - 1
        for k, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return self.peak if k == last else min(k * self.width, self.peak)
        return self.peak  # (not reached: the counts sum to the total)


class UsageSummary:
    """One attempt's measured compute and memory: samples, peaks and p95s."""

    __slots__ = ("compute", "memory", "samples")

    def __init__(self, device_memory_mib: float) -> None:
        """For an attempt on devices of at most ``device_memory_mib`` each."""
        self.compute = Histogram(COMPUTE_BIN_PCT, 100.0)
        self.memory = Histogram(MEMORY_BIN_MIB, max(0.0, device_memory_mib))
        #: samples with at least one figure measured
        self.samples = 0

    def add(self, compute_pct: float | None, memory_mib: float | None) -> None:
        """One sample: what the attempt used (``None``: the source could not tell)."""
        if compute_pct is not None and not math.isfinite(compute_pct):
            compute_pct = None
        if memory_mib is not None and not math.isfinite(memory_mib):
            memory_mib = None
        if compute_pct is None and memory_mib is None:
            return
        self.samples += 1
        if compute_pct is not None:
            self.compute.add(min(100.0, max(0.0, compute_pct)))
        if memory_mib is not None:
            self.memory.add(max(0.0, memory_mib))

    def report(self) -> dict[str, float | int | None] | None:
        """The store's columns for the attempt (:data:`~ebbtide.queue.models.USAGE_COLUMNS`);
        ``None`` when nothing was measured."""
        if not self.samples:
            return None
        return {
            "usage_samples": self.samples,
            "used_compute_p95_pct": self.compute.percentile(PERCENTILE_PCT),
            "used_compute_peak_pct": self.compute.peak,
            "used_memory_p95_mib": self.memory.percentile(PERCENTILE_PCT),
            "used_memory_peak_mib": self.memory.peak,
        }
