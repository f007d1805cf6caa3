"""The reports part of :class:`~ebbtide.client.Client`: what was harvested
(:meth:`~ClientReports.report`) and the slice to ask for
(:meth:`~ClientReports.recommend`), both readable by anyone, as ``qstat``.
"""

from __future__ import annotations

import json
from typing import Any

from ebbtide.args import filter_name, whole
from ebbtide.client_base import ClientBase
from ebbtide.errors import SpecError
from ebbtide.queue.rightsizing import NO_MEASUREMENT, RECENT_JOBS, recommend
from ebbtide.queue.states import FINAL_STATES
from ebbtide.queue.store import Store

#: Most of a user's or a queue's latest jobs :meth:`Client.recommend` looks at.
MAX_RECOMMEND_JOBS = 1000


class ClientReports(ClientBase):
    """:meth:`report` and :meth:`recommend`, over the store of a
    :class:`~ebbtide.client.Client`."""

    store: Store

    def report(
        self,
        since: float,
        until: float,
        *,
        queue: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        """What was harvested in ``[since, until)`` (Unix seconds, at most 366 days) and
        what it cost, for everything, each queue and each user, or only ``queue`` and
        ``user`` (``ebb report``; :mod:`ebbtide.report` says how each figure is counted).
        Anyone may read it, as ``qstat``."""
        from ebbtide.report import report_from_rows, window_error

        error = window_error(since, until)
        if error:
            raise SpecError("since", error)
        queue, user = filter_name(queue, "queue"), filter_name(user, "user")
        rows = self.store.report_rows(float(since), float(until))
        now = self.store.clock.time()
        return report_from_rows(rows, since=since, until=until, now=now, queue=queue, user=user)

    def recommend(
        self,
        job_id: int | None = None,
        *,
        user: str | None = None,
        queue: str | None = None,
        last: int = RECENT_JOBS,
    ) -> dict[str, Any]:
        """The slice to ask for (``-l gpu=…,gpumem=…``), from what attempts used as their
        node agents measured it (``ebb recommend``; :mod:`ebbtide.queue.rightsizing` says
        how): for job ``job_id``, or for each job name among the latest ``last`` finished
        jobs of ``user`` and/or in ``queue`` that were measured.  ``recommendations`` is
        empty, and ``note`` says why, when nothing was measured.  Anyone may read it, as
        ``qstat``."""
        if job_id is not None and (user is not None or queue is not None):
            raise SpecError("job_id", "give a job id, or a user and/or a queue, not both")
        if job_id is None and user is None and queue is None:
            raise SpecError("job_id", "give a job id, a user or a queue")
        note = None
        if job_id is not None:
            job = self.store.get(whole(job_id, "job_id"))
            scope: dict[str, Any] = {"job_id": job.id}
            measured = self.store.measured_attempts(job_id=job.id)
            if not measured:
                ended = [a for a in self.store.attempts(job.id or 0) if a.ended_at is not None]
                if job.attempts == 0:
                    note = f"job {job.id} has not run yet: nothing was measured"
                elif not ended:
                    note = (
                        f"job {job.id} has not ended an attempt yet: what an attempt used is "
                        "recorded when it ends"
                    )
        else:
            user, queue = filter_name(user, "user"), filter_name(queue, "queue")
            last = whole(last, "last", 1, MAX_RECOMMEND_JOBS)
            scope = {"user": user, "queue": queue, "last": last}
            measured = self.store.measured_attempts(owner=user, queue=queue, jobs=last)
            if not measured and not self.store.list_jobs(
                states=FINAL_STATES, owner=user, queue=queue, limit=1, ran=True
            ):  # a mistyped name, or nothing has run to its end (a job cancelled in the
                # queue ran nowhere): not the headroom source
                whose = " and ".join(
                    w for w in (user and f"of user {user}", queue and f"in queue {queue}") if w
                )
                note = f"no job {whose} has finished yet: there is nothing to learn from"
        largest = max(
            (
                int(d.get("memory_mib") or 0)
                for n in self.store.nodes()
                for d in json.loads(n.devices_json or "[]")
            ),
            default=0,
        )
        found = recommend(measured, largest or None)
        return {
            "scope": scope,
            "recommendations": [r.to_dict() for r in found],
            "note": None if found else note or NO_MEASUREMENT,
        }
