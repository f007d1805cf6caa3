"""Submission in memory: a job (or an array's tasks) inserted with their ``submitted``
events, as the SQL store's module of that name does it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ebbtide.queue.dependencies import array_states, split_ids
from ebbtide.queue.lifecycle.submission import (
    check_dependencies,
    new_job_row,
    resolved_depends,
    submitted_data,
)
from ebbtide.queue.memory.actions import tasks_of
from ebbtide.queue.memory.queries import MemoryQueryMixin
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import (
    EventType,
)


class MemoryAttemptMixin(MemoryQueryMixin):
    """:meth:`submit` (dispatch to the end of an attempt is the shared
    :class:`~ebbtide.queue.lifecycle.attempts.AttemptLogic`)."""

    def _check_named(self, data: Any, depends: list[dict[str, Any]]) -> None:
        wanted, arrays = split_ids(depends)
        states = {i: data.jobs[i]["state"] for i in wanted & set(data.jobs)}
        tasks = tasks_of(data.jobs, arrays) if arrays else []
        check_dependencies(depends, states, array_states(tasks))

    def submit(
        self,
        spec: JobSpec,
        owner: str,
        *,
        defaults_deadline_s: float,
        grant: SliceGrant | None = None,
        pausable: bool | None = None,
        attribution: dict[str, Any] | None = None,
    ) -> list[int]:
        """Insert the job (or the tasks of an array); return their ids, first task first."""
        now = self.clock.time()
        indices: Iterable[int | None] = spec.array.indices() if spec.array else [None]
        base_name = spec.display_name()
        spec, depends = resolved_depends(self, spec)
        with self._tx() as data:
            self._check_named(data, depends)
            row = new_job_row(
                spec,
                owner,
                now=now,
                depends=depends,
                defaults_deadline_s=defaults_deadline_s,
                grant=grant,
                pausable=pausable,
            )
            ids: list[int] = []
            for index in indices:  # array indices ascend: ids follow them
                name = base_name if index is None else f"{base_name}[{index}]"
                array_id = ids[0] if ids else None  # the first task's id is the array's
                ids.append(
                    self._insert_job(
                        {**row, "name": name, "array_index": index, "array_id": array_id}
                    )
                )
            if spec.array:
                self._update_job(ids[0], {"array_id": ids[0]})
            submitted = submitted_data(row["state"], owner, grant, attribution)
            for job_id in ids:
                self._event(data, job_id, EventType.SUBMITTED, data=submitted, now=now)
        return ids
