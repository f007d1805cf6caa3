"""How one eviction plays out in the simulation: warning → checkpoint if it fits the
deadline → exit → free, or a kill at the deadline.

Timed as the node agent does it (see :mod:`ebbtide.sim.timing`): the deadline counts from
the warning; a job that ignores it is killed at deadline − :data:`KILL_LEAD_S` and reaped
within milliseconds, so no slice is ever freed past its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ebbtide.preemption.enforcer import KILL_LEAD_S
from ebbtide.sim.state import CHECKPOINTING, RESTORING, STARTING, SimAttempt
from ebbtide.sim.timing import Latencies


@dataclass(frozen=True)
class Outcome:
    #: when the job stops computing (its compute leaves the device), in seconds
    release_at: float
    #: when its slice is free (its memory leaves too), in seconds
    free_at: float
    #: the progress it keeps, in seconds at the full slice
    saved_s: float
    killed: bool


def outcome(
    att: SimAttempt, was: int, now: float, lat: Latencies, deadline_s: float | None = None
) -> Outcome:
    """What happens to ``att``, warned at ``now`` while in phase ``was``:

    - not started yet, or still restoring its checkpoint: exits at once (an exit latency),
      keeping what it had saved;
    - cooperative: stops computing within an exit latency; if it has progress to save and
      the checkpoint (or the rest of one under way) fits before deadline − kill lead, it
      checkpoints and then exits, else it exits without one;
    - stubborn: keeps its slice until killed at deadline − kill lead, and keeps only what
      its last finished checkpoint saved;
    - suspended to host: it cannot take the warning (its CUDA calls block), so it is
      killed at deadline − kill lead and keeps what its last checkpoint saved.

    ``deadline_s``: the eviction's deadline when it is not the job's own (a drain before a
    window closes may give less).
    """
    spec = att.job.spec
    budget = (spec.deadline_s if deadline_s is None else deadline_s) - KILL_LEAD_S
    if att.suspended_at is not None:  # its CUDA calls block until a restore: no warning
        free = now + budget + lat.reap_latency()
        return Outcome(free, free, att.saved_s, killed=True)
    if was in (STARTING, RESTORING):
        free = now + lat.exit_latency()
        return Outcome(free, free, att.saved_s, killed=False)
    if spec.cooperative:
        stop = now + lat.exit_latency()
        need = att.ckpt_end - now if was == CHECKPOINTING else spec.ckpt_cost_s
        if att.progress_s > att.saved_s and stop - now + need <= budget:
            return Outcome(stop, stop + need, att.progress_s, killed=False)
        return Outcome(stop, stop, att.saved_s, killed=False)
    free = now + budget + lat.reap_latency()
    saved = att.saved_s
    if was == CHECKPOINTING and att.ckpt_end <= now + budget:
        saved = att.ckpt_progress_s
    return Outcome(free, free, saved, killed=True)
