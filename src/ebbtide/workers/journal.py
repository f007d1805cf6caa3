"""The node agent's journal: what its attempts did, kept on local disk until the store has it.

The agent's loop never waits for the store: it appends a report here (an attempt
started, was warned, checkpointed, ended) and goes on; the store thread
(:mod:`ebbtide.workers.sync`) delivers the reports in order, retrying while the store does
not answer.  Each report is written to ``journal.jsonl`` before it is queued, and marked
done once delivered, so an agent that crashes with reports undelivered delivers them when
it starts again (a job that succeeded just before a crash is not run again).

Reports are store calls by name with their keyword arguments (JSON).  A ``heartbeat``
entry carries no payload: it says "send the latest heartbeat here", which keeps a
heartbeat in order before the report that depends on it (a device's health before a
requeue from it).  Heartbeats are not written to disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("ebbtide.agent")

#: The store calls a journal may carry.
REPORTS = frozenset(
    {
        "mark_started",
        "begin_eviction",
        "record_checkpoint",
        "record_progress",
        "record_result",
        "record_pause",
        "record_thaw",
        "finish_attempt",
        "requeue_lost",
        "heartbeat",
    }
)
#: Reports nobody waits for: what an attempt has saved or done so far.  They may wait in
#: the journal for the next report that matters sooner, or for the reader's next round
#: (:meth:`Journal.peek`'s ``linger``), and go to the store together with it.
LINGERING = frozenset({"record_checkpoint", "record_progress"})
#: Rewrite the file once this many delivered entries have piled up in it.
COMPACT_AFTER = 1000


@dataclass
class Report:
    seq: int
    op: str
    kwargs: dict[str, Any] = field(default_factory=dict)


class Journal:
    """A FIFO of reports, on disk at ``path`` (``None``: in memory only).  Thread-safe."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Condition()
        self._queue: deque[Report] = deque()
        self._seq = 0
        self._done_in_file = 0
        #: a waiter of :meth:`peek` is to return (:meth:`wake`), report or not
        self._woken = False
        #: how many queued reports are not :data:`LINGERING`
        self._pressing = 0
        #: how many readers wait for any report (not lingering): a lingering report
        #: wakes only these (each wake-up of a thread costs the node CPU)
        self._eager = 0
        self._file: Any = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._recover(path)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def _recover(self, path: Path) -> None:
        """Queue the reports a previous agent journaled but did not deliver."""
        entries: dict[int, Report] = {}
        done: set[int] = set()
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                rec = json.loads(line)
                if "done" in rec:
                    done.add(int(rec["done"]))
                elif rec.get("op") in REPORTS:
                    entries[int(rec["seq"])] = Report(int(rec["seq"]), rec["op"], rec["kwargs"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash mid-write
        pending = [entries[s] for s in sorted(entries) if s not in done]
        self._seq = max([*entries, *done], default=0)
        if pending:
            log.warning("journal: %d report(s) of a previous run to deliver", len(pending))
        self._queue.extend(pending)
        self._pressing = sum(r.op not in LINGERING for r in pending)
        # start the file afresh with what is still owed
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(_line(r) for r in pending))
        os.replace(tmp, path)

    @property
    def seq(self) -> int:
        """The sequence number of the last report appended."""
        with self._lock:
            return self._seq

    def append(self, op: str, **kwargs: Any) -> int:
        """Journal a report; return its sequence number."""
        if op not in REPORTS:
            raise ValueError(f"not a report: {op}")
        with self._lock:
            if op == "heartbeat" and len(self._queue) > 1 and self._queue[-1].op == op:
                return self._queue[-1].seq  # one waiting heartbeat sends the latest figures
            self._seq += 1
            report = Report(self._seq, op, kwargs)
            if self._file is not None and op != "heartbeat":
                self._file.write(_line(report))
            self._queue.append(report)
            if op in LINGERING:
                if self._eager:  # a reader waits for any report
                    self._lock.notify_all()
            else:
                self._pressing += 1
                self._lock.notify_all()
            return report.seq

    def peek(self, timeout_s: float, *, linger: bool = False) -> Report | None:
        """The oldest undelivered report, waiting up to ``timeout_s`` for one (or until
        :meth:`wake`, also when it came before the wait).  With ``linger``, waits as long
        while every report queued is :data:`LINGERING`, and then returns the oldest."""
        with self._lock:
            if linger:
                self._lock.wait_for(lambda: self._pressing or self._woken, timeout_s)
            elif not self._queue and not self._woken:
                self._eager += 1
                try:
                    self._lock.wait(timeout_s)
                finally:
                    self._eager -= 1
            self._woken = False
            return self._queue[0] if self._queue else None

    def wake(self) -> None:
        """Have :meth:`peek` return now, or at once next time: its reader has other work
        than reports (the store thread: a start to prepare, a stop)."""
        with self._lock:
            self._woken = True
            self._lock.notify_all()

    def done(self, report: Report) -> None:
        """``report`` was delivered (or can never be): drop it."""
        with self._lock:
            if self._queue and self._queue[0] is report:
                self._queue.popleft()
                self._pressing -= report.op not in LINGERING
            if self._file is not None and report.op != "heartbeat":
                self._file.write(json.dumps({"done": report.seq}) + "\n")
                self._done_in_file += 1
                if self._done_in_file >= COMPACT_AFTER and self.path is not None:
                    self._compact(self.path)
            self._lock.notify_all()

    def _compact(self, path: Path) -> None:
        self._file.close()
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(_line(r) for r in self._queue if r.op != "heartbeat"))
        os.replace(tmp, path)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115
        self._done_in_file = 0

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def wait_empty(self, timeout_s: float) -> bool:
        """Wait until every report is delivered; False if ``timeout_s`` ran out first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue, timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


def _line(report: Report) -> str:
    return json.dumps({"seq": report.seq, "op": report.op, "kwargs": report.kwargs}) + "\n"
