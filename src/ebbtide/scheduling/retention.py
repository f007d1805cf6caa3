"""The leading scheduler's retention: old finished jobs leave the store on their own.

With the policy's ``retention.finished_jobs`` set, the scheduler that leads purges the
jobs that finished longer ago than that (:meth:`Store.purge_batches
<ebbtide.queue.store.Store.purge_batches>`), at most every ``retention.every``: in a
thread of its own, one batch (one short transaction) at a time with a pause between
two, so a scheduling pass waits for one batch at most.  It stops between two batches
when the scheduler stops or stops leading; its writes are fenced like the scheduler's,
so a deposed leader removes nothing more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ebbtide.clock import Clock
from ebbtide.config.policy import Policy
from ebbtide.errors import NotLeader
from ebbtide.queue.purge import PurgeResult
from ebbtide.queue.store import Store

log = logging.getLogger("ebbtide.retention")

#: Pause between two batches of an automatic purge, in seconds: the scheduler's and the
#: agents' transactions get the store between them.
BATCH_PAUSE_S = 0.1
#: How often the thread looks whether a purge is due, in seconds.
POLL_S = 1.0


class Retention:
    """Purges old finished jobs while ``leading()`` (see the module doc).

    ``store`` and ``policy`` are read at each purge: the scheduler's store as it writes
    now (fenced by its epoch) and the policy in effect (reloads apply)."""

    def __init__(
        self,
        store: Callable[[], Store],
        policy: Callable[[], Policy],
        *,
        clock: Clock,
        leading: Callable[[], bool],
        pause_s: float = BATCH_PAUSE_S,
        poll_s: float = POLL_S,
    ) -> None:
        self._store = store
        self._policy = policy
        self.clock = clock
        self._leading = leading
        self.pause_s = pause_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: when the last purge began (clock time); None: none yet
        self.last_run_at: float | None = None
        #: what the last purge removed
        self.last_result: PurgeResult | None = None

    def due(self, now: float) -> bool:
        """Whether a purge is due at ``now``: retention is on, this scheduler leads, and
        the last purge began ``retention.every`` ago or more (or there was none)."""
        rules = self._policy().retention
        if rules.finished_jobs is None or not self._leading():
            return False
        return self.last_run_at is None or now - self.last_run_at >= rules.every

    def run_due(self) -> PurgeResult | None:
        """Purge now if a purge is due, batch by batch, pausing between two; the result,
        or None when none was due.  Stops early when told to stop or when this
        scheduler no longer leads."""
        now = self.clock.time()
        if not self.due(now):
            return None
        rules = self._policy().retention
        assert rules.finished_jobs is not None
        self.last_run_at = now
        store = self._store()

        def pause() -> bool:
            self.clock.wait(self._stop, self.pause_s)
            return not self._stop.is_set() and self._leading()

        total = PurgeResult(cutoff=now - rules.finished_jobs)
        for step in store.purge_batches(
            rules.finished_jobs, batch=rules.batch, now=now, pause=pause
        ):
            total += step
        self.last_result = total
        if total.jobs or total.kept:
            log.info(
                "retention: purged %s finished jobs (%s attempts, %s events) that finished "
                "over %gs ago, in %s %s; kept %s that a job not yet finished depends "
                "on or whose array has not all finished",
                total.jobs,
                total.attempts,
                total.events,
                rules.finished_jobs,
                total.batches,
                "batch" if total.batches == 1 else "batches",
                total.kept,
            )
        return total

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, after the batch in progress if there is one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self.clock.wait(self._stop, self.poll_s):
            try:
                self.run_due()
            except NotLeader as exc:
                log.info("retention: stopped, this scheduler no longer leads (%s)", exc)
            except Exception:
                log.exception("retention: the purge failed; trying again in retention.every")
