"""The scheduler's housekeeping in memory: dependencies, reasons, holds for evictions,
node heartbeats and the published policy, as the SQL store's modules of those names do
them."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ebbtide.queue.lifecycle.housekeeping import HousekeepingLogic
from ebbtide.queue.memory.purge import FINAL
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.states import JobState


def tasks_of(jobs: dict[int, dict[str, Any]], array_ids: Collection[int]) -> list[tuple[int, str]]:
    """``(array_id, state)`` of every task of these arrays."""
    return [(j["array_id"], j["state"]) for j in jobs.values() if j.get("array_id") in array_ids]


class MemoryActionMixin(MemoryQueryMixin, HousekeepingLogic):
    """Dependencies, reasons, holds for evictions; nodes and the published policy (the
    user actions are the shared :class:`~ebbtide.queue.lifecycle.user_actions.UserActionLogic`)."""

    # -- housekeeping ---------------------------------------------------------------------

    def _states_of(self, job_ids: Collection[int]) -> dict[int, str]:
        with self._data.lock:
            jobs = self._data.jobs
            return {i: jobs[i]["state"] for i in job_ids if i in jobs}

    def _tasks_of(self, array_ids: Collection[int]) -> list[tuple[int, str]]:
        with self._data.lock:
            return tasks_of(self._data.jobs, array_ids)

    def _task_ids(self, array_ids: Collection[int]) -> dict[tuple[int, int], int]:
        with self._data.lock:
            return {
                (j["array_id"], j["array_index"]): j["id"]
                for j in self._data.jobs.values()
                if j.get("array_id") in array_ids
            }

    def _waiting_on(self) -> list[tuple[int, int | None, list[dict[str, Any]]]]:
        with self._data.lock:
            return [
                (j["id"], j.get("array_id"), json.loads(j["depends_json"]))
                for j in self._data.jobs.values()
                if j["state"] not in FINAL and j["depends_json"] != "[]"
            ]

    def set_reasons(self, reasons: dict[int, str]) -> int:
        """Record why queued jobs wait; only rows whose reason changed are written.
        Returns how many changed."""
        if not reasons:
            return 0
        changed = 0
        with self._tx() as data:
            for job_id, reason in reasons.items():
                row = data.jobs.get(job_id)
                if row is None or row["state"] != JobState.QUEUED.value or row["reason"] == reason:
                    continue
                self._update_job(job_id, {"reason": reason})
                changed += 1
        return changed

    def _overpreempted(self, queue: str, max_preemptions: int) -> list[int]:
        with self._data.lock:
            return [
                r["id"]
                for r in self._rows([JobState.QUEUED], None, queue=queue)
                if r["evictions"] - r["evictions_forgiven"] >= max_preemptions
            ]

    # -- nodes and the published policy ---------------------------------------------------

    def heartbeat(
        self,
        node: str,
        *,
        started_at: float,
        devices: list[dict[str, Any]],
        stopping: bool = False,
        runs_jobs_of: str | None = None,
    ) -> None:
        row = {
            "name": node,
            "started_at": started_at,
            "heartbeat_at": self.clock.time(),
            "devices_json": json.dumps(devices),
            "stopping": stopping,
            "runs_jobs_of": runs_jobs_of,
        }
        with self._tx() as data:
            data.nodes[node] = row

    def forget_node(self, node: str) -> None:
        with self._tx() as data:
            data.nodes.pop(node, None)

    def publish_policy(self, text: str, source: str) -> None:
        """The leading scheduler's policy, for clients to check jobs against; fenced."""
        with self._tx() as data:
            data.leadership.update(
                policy_text=text, policy_source=source, policy_at=self.clock.time()
            )
