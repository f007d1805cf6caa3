"""``ebb logs -f``: what a job writes, as it comes, across its attempts, until it ends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ebbtide.attempt_logs import LogTail
from ebbtide.cli import logs_cmd
from ebbtide.errors import UserError


class GrowingJob:
    """A job whose state and logs move on one step each time it is looked at."""

    def __init__(self, steps: list[tuple[str, int, dict[int, str]]]) -> None:
        self.steps = steps  # (state, attempts, {attempt: log so far})
        self.now = 0

    def get(self, job_id: int) -> Any:
        self.now = min(self.now + 1, len(self.steps) - 1)
        state, attempts, _ = self.steps[self.now]
        return SimpleNamespace(state=state, attempts=attempts)

    def log_tail(self, job_id: int, *, attempt: int, stderr: bool, tail_bytes: int) -> LogTail:
        text = self.steps[self.now][2].get(attempt)
        if text is None:
            raise UserError(f"job {job_id} attempt {attempt} has no stdout log (no output yet)")
        data = text.encode()
        cut = data[max(0, len(data) - tail_bytes) :]
        return LogTail(job_id, attempt, "stdout", cut.decode(), len(data), len(cut) < len(data))


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs_cmd, "FOLLOW_POLL_S", 0)


def test_follow_prints_each_attempt_once_and_stops_when_the_job_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = GrowingJob(
        [
            ("queued", 0, {}),
            ("queued", 0, {}),
            ("running", 1, {}),
            ("running", 1, {1: "a1\n"}),
            ("running", 1, {1: "a1\na2\n"}),
            ("queued", 1, {1: "a1\na2\nwarned\n"}),  # evicted and requeued
            ("running", 2, {1: "a1\na2\nwarned\n", 2: "b1\n"}),
            ("succeeded", 2, {1: "a1\na2\nwarned\n", 2: "b1\ndone\n"}),
        ]
    )
    logs_cmd._follow(job, 12, {"stderr": False, "attempt": None})
    out, err = capsys.readouterr()
    assert out == "a1\na2\nwarned\nb1\ndone\n"
    assert "job 12 is queued; waiting for it to start" in err
    assert "--- job 12 attempt 2 ---" in err


def test_follow_of_one_attempt_stops_when_the_next_begins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = GrowingJob(
        [
            ("running", 1, {1: "a1\n"}),
            ("running", 1, {1: "a1\n"}),
            ("running", 2, {1: "a1\nend\n", 2: "b1\n"}),
            ("running", 2, {1: "a1\nend\n", 2: "b1\nb2\n"}),
        ]
    )
    logs_cmd._follow(job, 12, {"stderr": False, "attempt": 1})
    assert capsys.readouterr().out == "a1\nend\n"


def test_follow_of_a_job_that_never_started_is_the_error_logs_gives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As ``ebb logs`` says it, exit 1 (a trial's trap: a note and exit 0)."""
    with pytest.raises(UserError, match="job 3 attempt None has no stdout log"):
        logs_cmd._follow(
            GrowingJob([("queued", 0, {}), ("cancelled", 0, {})]), 3, {"stderr": False}
        )
    assert capsys.readouterr().out == ""


def test_follow_says_once_per_attempt_which_file_it_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dataclasses import replace

    class Named(GrowingJob):
        def log_tail(self, job_id: int, **kw: Any) -> LogTail:
            tail = super().log_tail(job_id, **kw)
            return replace(tail, path=f"/work/slurm-{job_id}.out")

    job = Named(
        [
            ("running", 1, {1: "a1\n"}),
            ("running", 1, {1: "a1\na2\n"}),
            ("running", 2, {1: "a1\na2\n", 2: "b1\n"}),
            ("succeeded", 2, {1: "a1\na2\n", 2: "b1\n"}),
        ]
    )
    logs_cmd._follow(job, 7, {"stderr": False, "attempt": None})
    out, err = capsys.readouterr()
    assert out == "a1\na2\nb1\n"
    assert err.count("ebb: job 7 attempt 1: stdout from /work/slurm-7.out") == 1
    assert err.count("ebb: job 7 attempt 2: stdout from /work/slurm-7.out") == 1


def test_follow_of_a_job_whose_file_is_gone_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from ebbtide.attempt_logs import NoLogYet

    class Gone(GrowingJob):
        def log_tail(self, job_id: int, **kw: Any) -> LogTail:
            raise NoLogYet(f"job {job_id} attempt 1 sent its stdout to /w/x.out, not there")

    logs_cmd._follow(Gone([("running", 1, {}), ("succeeded", 1, {})]), 5, {"stderr": False})
    out, err = capsys.readouterr()
    assert out == ""
    assert "ebb: note: job 5 attempt 1 sent its stdout to /w/x.out, not there" in err


class TwoStreams:
    """A finished attempt with a stdout and a stderr log."""

    def __init__(self, out: str, err: str) -> None:
        self.text = {False: out, True: err}

    def log_tail(self, job_id: int, *, attempt: int, stderr: bool, tail_bytes: int) -> LogTail:
        data = self.text[stderr].encode()
        return LogTail(job_id, attempt, "stderr" if stderr else "stdout", "", len(data), False)


def test_an_empty_stdout_says_so_and_points_at_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a job that failed at once (ModuleNotFoundError) wrote only to stderr: plain
    # `ebb logs 1` printed nothing at all
    logs_cmd._say_empty(TwoStreams("", "Traceback ...\n"), 1, 1, stderr=False)
    err = capsys.readouterr().err
    assert err == (
        "ebb: job 1 attempt 1 has written nothing to stdout; "
        "its stderr holds 14 bytes: ebb logs -e 1\n"
    )


def test_an_empty_stream_with_nothing_elsewhere_says_only_that(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs_cmd._say_empty(TwoStreams("", ""), 4, 2, stderr=True)
    assert capsys.readouterr().err == "ebb: job 4 attempt 2 has written nothing to stderr\n"
    logs_cmd._say_empty(TwoStreams("out\n", ""), 4, 2, stderr=True)
    assert capsys.readouterr().err == (
        "ebb: job 4 attempt 2 has written nothing to stderr; its stdout holds 4 bytes: ebb logs 4\n"
    )
    logs_cmd._say_empty(TwoStreams("", "err\n"), 4, 1, stderr=False, named=True)
    assert capsys.readouterr().err.endswith("holds 4 bytes: ebb logs -e --attempt 1 4\n")


def test_event_details_read_as_times_and_short_numbers() -> None:
    """A trial's trap: ``ebb events`` showed ``freed_at=1764619328.2345467`` and
    ``paused_s=12.345678``."""
    import datetime as dt

    at = dt.datetime(2026, 12, 1, 9, 30, 5, 250000).timestamp()
    assert logs_cmd._event_value("freed_at", at) == "09:30:05.250"
    assert logs_cmd._event_value("spike_at", at) == "09:30:05.250"
    assert logs_cmd._event_value("paused_s", 12.345678) == "12.35"
    assert logs_cmd._event_value("latency_s", 0.18421337) == "0.1842"
    assert logs_cmd._event_value("deadline_s", 30.0) == 30
    assert logs_cmd._event_value("memory_mib", 81920.5) == "81920.5"
    assert logs_cmd._event_value("pid", 4242) == 4242
    assert logs_cmd._event_value("final", False) is False
    assert logs_cmd._event_value("reason", "online compute") == "online compute"


def test_an_altered_event_s_changes_read_as_qalter_printed_them() -> None:
    """``ebb events`` showed ``changes={'gpu': '20%'}``, a Python dict."""
    changes = {"gpu": "20%", "depends": "afterok:3", "priority": 5.0}
    assert logs_cmd._event_value("changes", changes) == "(gpu=20%, depends=afterok:3, priority=5)"
    assert logs_cmd._event_value("devices", [0, 1]) == "0,1"
    assert logs_cmd._event_value("changes", {}) == "()"
