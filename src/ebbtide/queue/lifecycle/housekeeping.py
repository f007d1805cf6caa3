"""What a scheduler does to the queue besides dispatching and evicting: waiting jobs
whose dependencies are met (or never will be), holds for jobs evicted too often, and
retention's whole purge (its batches are each store's: ``purge_batches``)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from ebbtide.errors import InvalidTransition, StaleState
from ebbtide.queue.dependencies import array_states, dependencies_verdict, split_ids
from ebbtide.queue.lifecycle.backend import Shared
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, PURGE_PAUSE_S, PurgeResult
from ebbtide.queue.states import EventType, JobState


class HousekeepingLogic(Shared):
    """:meth:`promote_waiting`, :meth:`hold_overpreempted` and :meth:`purge`."""

    def promote_waiting(self) -> list[int]:
        """Move waiting jobs whose dependencies are met to queued; cancel the hopeless."""
        waiting = self.list_jobs(states=[JobState.WAITING])
        if not waiting:
            return []
        dep_ids, array_ids = split_ids(d for j in waiting for d in json.loads(j.depends_json))
        dep_state = self._states_of(dep_ids)
        arrays = array_states(self._tasks_of(array_ids)) if array_ids else {}
        changed = []
        for job in waiting:
            verdict, why = dependencies_verdict(json.loads(job.depends_json), dep_state, arrays)
            try:
                if verdict == "met":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.QUEUED,
                        event=EventType.DEPENDENCIES_MET,
                        changes={"reason": ""},
                    )
                elif verdict == "never":
                    self.transition(
                        job.id or 0,
                        JobState.WAITING,
                        JobState.CANCELLED,
                        event=EventType.CANCELLED,
                        data={"reason": why},
                        changes={"reason": why, "finished_at": self.clock.time()},
                    )
                else:
                    continue
            except (StaleState, InvalidTransition):
                continue
            changed.append(job.id or 0)
        return changed

    def hold_overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        """Hold the queue's queued jobs evicted ``max_preemptions`` times or more."""
        held = []
        for job_id in self._overpreempted(queue, max_preemptions):
            why = (
                f"held: evicted {max_preemptions} or more times (queue {queue!r} allows "
                f"max_preemptions {max_preemptions}); qrls to try again"
            )
            try:
                self.transition(
                    job_id,
                    JobState.QUEUED,
                    JobState.HELD,
                    event=EventType.HELD,
                    data={"by": "policy", "reason": why},
                    changes={"reason": why},
                )
                held.append(job_id)
            except StaleState:
                continue
        return held

    def purge(
        self,
        older_than_s: float,
        *,
        batch: int = DEFAULT_BATCH_JOBS,
        dry_run: bool = False,
        now: float | None = None,
        pause_s: float = PURGE_PAUSE_S,
    ) -> PurgeResult:
        """Remove the jobs that finished (succeeded, failed, cancelled) more than
        ``older_than_s`` seconds before ``now`` (default: the clock's), with their
        attempts and events, ``batch`` jobs per transaction and ``pause_s`` seconds
        apart; ``dry_run``: count them, remove nothing.  Never a job in another state,
        one that a job not yet finished depends on, or part of an array not all
        finished that long ago (:mod:`ebbtide.queue.purge`)."""
        started = time.perf_counter()
        at = self.clock.time() if now is None else now
        total = PurgeResult(cutoff=at - older_than_s, dry_run=dry_run)

        def pause() -> bool:
            time.sleep(pause_s)
            return True

        for step in self.purge_batches(
            older_than_s, batch=batch, dry_run=dry_run, now=at, pause=pause
        ):
            total += step
        return replace(
            total,
            oldest_kept_finished_at=self._oldest_finished_at(),
            elapsed_s=time.perf_counter() - started,
        )
