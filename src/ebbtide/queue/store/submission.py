"""Submission: a job, or the tasks of an array, inserted with their ``submitted`` events."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ebbtide.queue.dependencies import array_states, split_ids
from ebbtide.queue.lifecycle.submission import (
    check_dependencies,
    new_job_row,
    resolved_depends,
    submitted_data,
)
from ebbtide.queue.spec import JobSpec, SliceGrant
from ebbtide.queue.states import EventType
from ebbtide.queue.store.base import EVENTS, JOBS, StoreBase
from ebbtide.queue.store.queries import array_tasks


class SubmissionMixin(StoreBase):
    """:meth:`submit`."""

    def _check_named(self, conn: Any, depends: list[dict[str, Any]]) -> None:
        wanted, arrays = split_ids(depends)
        named = sa.select(JOBS.c.id, JOBS.c.state).where(JOBS.c.id.in_(wanted))
        if conn.dialect.name == "postgresql":
            # a purge locks the jobs it removes before it reads who depends on them: one
            # of the two waits for the other (queue/purge.py; a task depended on keeps
            # its array's tasks not yet gone)
            named = named.with_for_update(read=True)
        states = {r[0]: r[1] for r in conn.execute(named)}
        tasks = array_tasks(conn, arrays) if arrays else []
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
        """Insert the job (or the tasks of an array); return their ids, first task first.

        ``pausable``: whether an online compute spike may pause it rather than evict it
        (default: what its spec says, else yes; the client applies its queue's default).

        ``grant``: what the fleet's resource profile really grants for the spec's slice
        request; the rows' slice (what the planner packs) is the grant, ``spec_json``
        keeps what was asked, and the submitted event records the grant.

        ``attribution``: who submitted and from where (:meth:`Caller.attribution
        <ebbtide.identity.Caller.attribution>`), recorded in the submitted event.
        """
        now = self.clock.time()
        indices: Iterable[int | None] = spec.array.indices() if spec.array else [None]
        base_name = spec.display_name()
        spec, depends = resolved_depends(self, spec)
        with self._tx() as conn:
            if depends:
                self._check_named(conn, depends)
            row = new_job_row(
                spec,
                owner,
                now=now,
                depends=depends,
                defaults_deadline_s=defaults_deadline_s,
                grant=grant,
                pausable=pausable,
            )
            # the first task alone: its id is the array's id; the other tasks in one
            # executemany (one statement compiled for all, not one per task), their ids
            # read back in task order (array indices ascend, whatever order ids were given)
            task_indices: list[int | None] = list(indices)
            first_index = task_indices[0]
            first = dict(
                row,
                name=base_name if first_index is None else f"{base_name}[{first_index}]",
                array_index=first_index,
                array_id=None,
            )
            first_id = int(conn.execute(JOBS.insert(), first).inserted_primary_key[0])  # type: ignore[index]
            ids = [first_id]
            if spec.array:
                conn.execute(JOBS.update().where(JOBS.c.id == first_id).values(array_id=first_id))
                rest = [
                    dict(row, name=f"{base_name}[{index}]", array_index=index, array_id=first_id)
                    for index in task_indices[1:]
                ]
                if rest:
                    conn.execute(JOBS.insert(), rest)
                    ids = list(
                        conn.execute(
                            sa.select(JOBS.c.id)
                            .where(JOBS.c.array_id == first_id)
                            .order_by(JOBS.c.array_index)
                        ).scalars()
                    )
            data = submitted_data(row["state"], owner, grant, attribution)
            data_json = json.dumps(data)
            conn.execute(
                EVENTS.insert(),
                [
                    {
                        "job_id": jid,
                        "attempt": None,
                        "type": EventType.SUBMITTED.value,
                        "time": now,
                        "data_json": data_json,
                    }
                    for jid in ids
                ],
            )
        return ids
