"""The agent's journal: reports kept in order on disk until delivered, and delivered
again by the next agent when one crashed first."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ebbtide.workers.journal import COMPACT_AFTER, Journal


def test_reports_come_out_in_order_and_leave_when_done(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.jsonl")
    a = j.append("mark_started", job_id=1, attempt=1, pid=5, stdout_path="o", stderr_path="e")
    b = j.append("finish_attempt", job_id=1, attempt=1, exit_code=0)
    assert (a, b) == (1, 2) and j.seq == 2 and j.pending() == 2
    first = j.peek(0)
    assert first is not None and first.op == "mark_started" and first.kwargs["pid"] == 5
    j.done(first)
    second = j.peek(0)
    assert second is not None and second.seq == b
    j.done(second)
    assert j.peek(0) is None and j.wait_empty(0)
    j.close()


def test_a_crashed_agents_undelivered_reports_are_delivered_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    before = Journal(path)
    before.append("begin_eviction", job_id=3, attempt=2, reason="r", deadline_s=1.0)
    before.done(before.peek(0))  # type: ignore[arg-type]
    before.append("finish_attempt", job_id=3, attempt=2, exit_code=0)
    before.append("heartbeat")  # not kept: a new agent sends its own
    with open(path, "a") as f:
        f.write('{"seq": 9, "op": "finish_att')  # torn by the crash
    before.close()

    after = Journal(path)
    owed = after.peek(0)
    assert owed is not None and (owed.op, owed.kwargs["exit_code"]) == ("finish_attempt", 0)
    after.done(owed)
    assert after.pending() == 0
    assert after.append("record_progress", job_id=3, attempt=3, done=1.0, total=None) == 3
    after.close()


def test_waiting_heartbeats_collapse_into_one(tmp_path: Path) -> None:
    j = Journal(None)
    j.append("heartbeat")  # in flight at the head
    j.append("heartbeat")
    j.append("heartbeat")
    assert j.pending() == 2


def test_the_file_is_compacted(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    for k in range(COMPACT_AFTER + 5):
        j.append("record_progress", job_id=1, attempt=1, done=float(k), total=None)
        j.done(j.peek(0))  # type: ignore[arg-type]
    j.append("record_progress", job_id=1, attempt=1, done=-1.0, total=None)
    assert len(path.read_text().splitlines()) < 20
    j.close()
    again = Journal(path)
    assert again.peek(0).kwargs["done"] == -1.0  # type: ignore[union-attr]
    again.close()


def test_only_reports_are_journaled(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a report"):
        Journal(None).append("drop_table")


def test_a_wake_ends_a_wait_for_a_report_even_one_not_begun_yet() -> None:
    j = Journal(None)
    j.wake()  # before the wait: remembered, not lost
    started = time.monotonic()
    assert j.peek(10.0) is None
    assert time.monotonic() - started < 1.0
    timer = threading.Timer(0.1, j.wake)  # during the wait
    timer.start()
    started = time.monotonic()
    assert j.peek(10.0) is None
    assert time.monotonic() - started < 5.0
    timer.join()
    # once taken, a wake is gone: the next wait runs its course
    started = time.monotonic()
    assert j.peek(0.05) is None
    assert time.monotonic() - started >= 0.04


def _peek_in_thread(j: Journal, timeout_s: float) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(j.peek(timeout_s, linger=True)))
    t.start()
    return t, got


def test_lingering_reports_wait_for_a_pressing_one_and_go_first() -> None:
    j = Journal(None)
    waiter, got = _peek_in_thread(j, 30.0)
    j.append("record_progress", job_id=1, attempt=1, done=3.0, total=None)
    j.append("record_checkpoint", job_id=1, attempt=1, path="/ck", at=1.0)
    waiter.join(0.3)
    assert waiter.is_alive()  # progress and checkpoints wait
    j.append("finish_attempt", job_id=1, attempt=1, exit_code=0)
    waiter.join(5.0)
    assert not waiter.is_alive()
    [oldest] = got
    assert oldest is not None and oldest.op == "record_progress"  # type: ignore[attr-defined]


def test_lingering_reports_come_out_when_the_wait_ends() -> None:
    j = Journal(None)
    j.append("record_checkpoint", job_id=1, attempt=1, path="/ck", at=1.0)
    started = time.monotonic()
    report = j.peek(0.05, linger=True)
    assert time.monotonic() - started >= 0.04
    assert report is not None and report.op == "record_checkpoint"
    # and a wake ends the wait at once, as without lingering
    waiter, got = _peek_in_thread(j, 30.0)
    j.wake()
    waiter.join(5.0)
    assert not waiter.is_alive() and got == [report]


def test_a_delivered_pressing_report_no_longer_ends_a_lingering_wait(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append("mark_started", job_id=1, attempt=1, pid=7, stdout_path="o", stderr_path="e")
    j.append("record_progress", job_id=1, attempt=1, done=1.0, total=None)
    j.close()
    j = Journal(path)  # a crashed agent's reports, counted again
    first = j.peek(0.0, linger=True)
    assert first is not None and first.op == "mark_started"
    j.done(first)
    waiter, _ = _peek_in_thread(j, 30.0)
    waiter.join(0.3)
    assert waiter.is_alive()  # only the progress is left: it waits
    j.wake()
    waiter.join(5.0)
    j.close()


def test_a_reader_that_does_not_linger_gets_a_lingering_report_at_once() -> None:
    j = Journal(None)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(j.peek(30.0)))
    waiter.start()
    time.sleep(0.1)  # (most likely) waiting by now; either way it must get the report
    j.append("record_progress", job_id=1, attempt=1, done=3.0, total=None)
    waiter.join(5.0)
    assert not waiter.is_alive()
    [report] = got
    assert report is not None and report.op == "record_progress"  # type: ignore[attr-defined]
