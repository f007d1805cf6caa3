"""What the framework callbacks share, without importing a framework.

* :func:`resume_path`: which checkpoint an attempt resumes from (the one the agent
  passes, else the newest complete one on disk);
* :class:`ProgressThrottle`: progress lines at most every ``interval_s`` seconds;
* :func:`say`: one line in the job's log, from the first process only.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import ebbtide.job as job
from ebbtide import status_lines

#: How often a callback reports progress by default, in seconds (each report is a status
#: line the node agent reads).
PROGRESS_INTERVAL_S = 1.0


def resume_path(complete: Callable[[], list[Path]], what: str) -> Path | None:
    """The checkpoint this attempt resumes from, or ``None`` for a fresh start.

    ``EBBTIDE_RESUME_FROM`` when set (the last checkpoint the job reported); without it,
    the newest of ``complete()`` (the complete checkpoints on disk, oldest first), as
    ``ebbtide.job.restore`` does, so a local run that was stopped resumes too.

    Raises:
      FileNotFoundError: ``EBBTIDE_RESUME_FROM`` names a path that does not exist and
        there is no other checkpoint to resume from: starting over would silently lose
        the work done.
    """
    given = job.resume_from()
    found = complete()
    if given is None:
        return found[-1] if found else None
    if given.exists():
        return given
    if found:
        warnings.warn(
            f"EBBTIDE_RESUME_FROM={given} does not exist; resuming from the newest "
            f"{what} in {found[-1].parent} instead: {found[-1].name}",
            stacklevel=3,
        )
        return found[-1]
    raise FileNotFoundError(
        f"EBBTIDE_RESUME_FROM={given}: no such checkpoint, and no {what} in "
        f"{job.checkpoint_dir()}. On a fleet the checkpoint directory must be on storage "
        "every node sees (ebb qsub --checkpoint-dir)."
    )


class ProgressThrottle:
    """Reports ``done`` of ``total`` steps to the agent, at most every ``interval_s``."""

    def __init__(
        self,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"progress_interval_s must be >= 0, not {interval_s}")
        self.interval_s = interval_s
        self._clock = clock
        self._last_at: float | None = None
        self._last_done: float | None = None

    def report(self, done: float, total: float | None, *, force: bool = False) -> None:
        """Report now if ``interval_s`` passed since the last report (or ``force``)."""
        now = self._clock()
        if done == self._last_done:
            return
        due = self._last_at is None or now - self._last_at >= self.interval_s
        if not (due or force):
            return
        status_lines.write_progress(done, total)  # throttled here, at the interval asked
        self._last_at, self._last_done = now, done


def say(message: str) -> None:
    """One line in the job's log (stderr), prefixed so it is easy to find."""
    print(f"ebbtide: {message}", file=sys.stderr, flush=True)
