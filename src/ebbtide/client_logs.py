"""The logs part of :class:`~ebbtide.client.Client`: the end of what an attempt wrote,
from the attempt's kept log or from the file the job named (``-o``, ``--output``), for
the job's owner and admins only.
"""

from __future__ import annotations

import dataclasses
import json
import os

from ebbtide.args import flag, whole
from ebbtide.attempt_logs import (
    DEFAULT_TAIL_BYTES,
    JOINED_LOG,
    MAX_TAIL_BYTES,
    LogTail,
    NoLogYet,
    is_kept_log,
    read_job_file,
    read_tail,
)
from ebbtide.client_admin import MAX_REASON_CHARS as MAX_REASON_CHARS
from ebbtide.client_base import ClientBase
from ebbtide.client_checks import pod_notes as pod_notes
from ebbtide.client_checks import published_policy as published_policy
from ebbtide.client_checks import queue_notes as queue_notes
from ebbtide.client_fields import SUBMITTED_FIELDS as SUBMITTED_FIELDS
from ebbtide.client_reports import MAX_RECOMMEND_JOBS as MAX_RECOMMEND_JOBS
from ebbtide.config.settings import Settings
from ebbtide.errors import PermissionDenied, SpecError, UserError
from ebbtide.queue.states import FINAL_STATES
from ebbtide.queue.store import Store


class ClientLogs(ClientBase):
    """:meth:`log_tail`, over the store and the settings of a
    :class:`~ebbtide.client.Client`."""

    store: Store
    settings: Settings
    #: the caller is this process's own user (not ``ebb server`` reading for someone)
    _reads_for_itself: bool

    def log_tail(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        stderr: bool = False,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> LogTail:
        """Like :meth:`logs`, with which attempt was read, the file's size and whether
        more of it was left unread."""
        job = self.store.get(whole(job_id, "job_id"))
        if not self.caller.may_act_on(job.owner):
            raise PermissionDenied(
                f"job {job.id} belongs to {job.owner}; only its owner or an admin may read its logs"
            )
        if job.attempts == 0:
            if job.state in FINAL_STATES:  # (cancelled before it ran: it never will)
                reason = job.reason or job.state  # "cancelled by root" says the state already
                why = reason if reason.startswith(job.state) else f"{job.state}: {reason}"
                raise UserError(f"job {job.id} never started ({why}), so it has no logs")
            raise NoLogYet(f"job {job.id} has not started yet, so it has no logs")
        number = job.attempts if attempt is None else whole(attempt, "attempt", 1)
        if number > job.attempts:
            runs = f"{job.attempts} attempt{'s' * (job.attempts > 1)}"
            raise SpecError("attempt", f"job {job.id} has had {runs} so far, not {number}")
        size = whole(tail_bytes, "tail_bytes", 1, MAX_TAIL_BYTES)
        stream = "stderr" if flag(stderr, "stderr") else "stdout"
        job_id = job.id or 0
        spec = json.loads(job.spec_json)
        if spec.get(stream):  # -o/--output: where this attempt's went
            row = next((a for a in self.store.attempts(job_id) if a.number == number), None)
            path = getattr(row, f"{stream}_path", None) if row is not None else None
            if path is None:
                raise NoLogYet(
                    f"job {job_id} attempt {number} has not started yet; its {stream} will "
                    "go to the file the job named"
                )
            if not is_kept_log(path, job_id, number, stream):  # (pods: kept as the log)
                reader = os.geteuid() if self._reads_for_itself else None
                try:
                    return read_job_file(
                        path, job_id, number, stream, size, owner=job.owner, reader_uid=reader
                    )
                except NoLogYet:
                    # a trial's trap: "which is not there (no output yet ...)" where the
                    # attempt never started, for want of that very file's directory
                    reason = job.reason or ""
                    if (
                        number == job.attempts
                        and job.state in FINAL_STATES
                        and (reason.startswith("could not start"))
                    ):
                        raise UserError(
                            f"job {job_id} attempt {number} never started ({reason}), so "
                            f"it wrote no {stream}"
                        ) from None
                    raise
        kept = JOINED_LOG.get(spec.get("join") or "", stream)  # -j oe: stderr in stdout's
        tail = read_tail(self.settings.home, job_id, number, kept, size, owner=job.owner)
        return tail if kept == stream else dataclasses.replace(tail, stream=stream)
