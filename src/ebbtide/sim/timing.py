"""How long things take in the simulation: the live system's periods and measured latencies.

The periods mirror the live code (a unit test checks they match):
:data:`ebbtide.workers.agent.SAMPLE_PERIOD_S`, :data:`ebbtide.workers.agent.HEARTBEAT_PERIOD_S`,
and :data:`ebbtide.scheduling.loop.PLAN_PERIOD_S`; the kill lead is the enforcer's own
:data:`~ebbtide.preemption.enforcer.KILL_LEAD_S`.

The eviction latencies are calibrated on ``benchmarks/evict_latency.py`` (real processes
on the node agent's fast path, see ``benchmarks/README.md``): a cooperative job is out of
the way after a log-normal time with median 0.07 s and 99th percentile 0.17 s (plus its
checkpoint, when it takes one); a job that ignores the warning is killed at deadline −
0.15 s and reaped within a few milliseconds.  No step ever takes zero time.  Moving a
job's GPU memory to host and back takes the node agent's own estimate
(:func:`ebbtide.workers.suspend.suspend_time_s`: an assumed 10,000 MiB/s and 0.5 s a
toggle, until a GPU measures them).
"""

from __future__ import annotations

import math
import random

#: The node agent samples online usage this often, in seconds (a step is seen within it).
SAMPLE_PERIOD_S = 0.05
#: The node agent heartbeats this often; a fall in online usage reaches the scheduler at
#: most this late (a rise is reported at once), in seconds.
HEARTBEAT_PERIOD_S = 0.5
#: The scheduler plans at most this long after something changed, in seconds.
PLAN_PERIOD_S = 0.5
#: From a dispatch decision to the job's process running on the node, in seconds.
DISPATCH_LATENCY_S = 0.2
#: A resumed attempt (attempt 2, 3, …) spends this long on the GPU, holding its slice,
#: restoring its checkpoint and rebuilding its CUDA context before it makes progress, in
#: seconds (``--restart-overhead``; real jobs take 30-120 s).  The first attempt has none:
#: an openb pod's duration already includes its start-up.  A thaw after a pause costs none.
RESTART_OVERHEAD_S = 30.0
#: A GPU's share of its host's memory, in MiB: 2 TiB for 8 GPUs (a DGX H100).  The jobs
#: suspended to host on a device hold at most the policy's ``suspend_host_memory_pct`` of
#: it; nothing else is taken to use host memory.
HOST_MIB_PER_DEVICE = 256 * 1024.0
#: Cooperative exit after the warning (stop computing, exit, be reaped): log-normal median
#: and 99th percentile, in seconds (``evict_latency.py``: p50 0.072 s, p99 0.167 s).
EXIT_P50_S = 0.07
EXIT_P99_S = 0.17
#: No step is faster than this, in seconds.
MIN_STEP_S = 0.005
#: A killed process group is reaped within this long, in seconds.
REAP_MAX_S = 0.02

_Z99 = 2.3263478740408408
_EXIT_SIGMA = math.log(EXIT_P99_S / EXIT_P50_S) / _Z99


class Latencies:
    """Seeded draws of the random delays; one independent stream per kind of delay."""

    def __init__(self, seed: int) -> None:
        self._sample = random.Random(f"{seed}:sample")
        self._exit = random.Random(f"{seed}:exit")
        self._reap = random.Random(f"{seed}:reap")

    def sample_delay(self) -> float:
        """From an online step to the agent's sample that sees it."""
        return max(MIN_STEP_S, self._sample.random() * SAMPLE_PERIOD_S)

    def exit_latency(self) -> float:
        """From the warning to a cooperative job being out of the way (no checkpoint)."""
        draw = EXIT_P50_S * math.exp(_EXIT_SIGMA * self._exit.gauss(0.0, 1.0))
        return max(MIN_STEP_S, draw)

    def reap_latency(self) -> float:
        """From the kill to the slice being free."""
        return MIN_STEP_S + self._reap.random() * (REAP_MAX_S - MIN_STEP_S)
