"""Where a job's output goes when it names a file (``-o``/``-e``/``--output``), and
whom a warning reaches with Slurm's ``--signal=B:`` — with real shims and processes."""

from __future__ import annotations

import dataclasses
import os
import signal
import textwrap
from pathlib import Path

import psutil

from ebbtide.workers import shim
from ebbtide.workers.executor import Launch, LocalExecutor
from tests.e2e.helpers import wait_for


def launch(tmp_path: Path, argv: list[str], **fields: object) -> Launch:
    base = Launch(
        job_id=7,
        attempt=1,
        argv=argv,
        env=dict(os.environ),
        cwd=str(tmp_path),
        stdout_path=tmp_path / "attempt" / "stdout.log",
        stderr_path=tmp_path / "attempt" / "stderr.log",
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def run_to_end(ex: LocalExecutor, the_launch: Launch) -> int:
    handle = ex.start(the_launch)
    ended = wait_for(lambda: ex.poll(handle), 20, "the job to end", interval=0.02)
    return int(ended.code)


ECHO = ["/bin/sh", "-c", "echo out-$0; echo err-$0 >&2", "one"]


def test_named_files_get_the_output_and_the_attempt_log_says_where(tmp_path: Path) -> None:
    ex = LocalExecutor(run_dir=tmp_path / "run")
    code = run_to_end(
        ex, launch(tmp_path, ECHO, job_stdout="job.out", job_stderr="job.err", truncate_output=True)
    )
    assert code == 0
    assert (tmp_path / "job.out").read_text() == "out-one\n"  # relative to the job's cwd
    assert (tmp_path / "job.err").read_text() == "err-one\n"
    said = (tmp_path / "attempt" / "stdout.log").read_text()
    assert "the job's stdout goes to job.out" in said


def test_one_path_for_both_joins_them_and_later_attempts_append(tmp_path: Path) -> None:
    ex = LocalExecutor(run_dir=tmp_path / "run")
    out = str(tmp_path / "joined.log")
    (tmp_path / "joined.log").write_text("from an old job\n")
    first = launch(tmp_path, ECHO, job_stdout=out, job_stderr=out, truncate_output=True)
    assert run_to_end(ex, first) == 0
    second = dataclasses.replace(first, attempt=2, argv=[*ECHO[:-1], "two"], truncate_output=False)
    assert run_to_end(ex, second) == 0
    # the first attempt started the file afresh; the second appended (a resumed job's
    # output follows what it wrote before)
    assert (tmp_path / "joined.log").read_text() == "out-one\nerr-one\nout-two\nerr-two\n"


def test_an_output_file_that_cannot_be_opened_fails_the_start_with_the_reason(
    tmp_path: Path,
) -> None:
    ex = LocalExecutor(run_dir=tmp_path / "run")
    handle = ex.start(launch(tmp_path, ECHO, job_stdout=str(tmp_path / "missing" / "x.out")))
    ended = wait_for(lambda: ex.poll(handle), 20, "the start to fail", interval=0.02)
    assert ended.cause == "start"
    assert "could not open" in ended.detail and "missing/x.out" in ended.detail


# A bash script with a child, as Slurm scripts with --signal=B:USR1 are written: the
# shell's trap records the warning and, a second later (time for a warning sent to every
# process to reach the child too, on a loaded machine), ends the child; the child records
# whether it got the signal itself.
TRAPPED = textwrap.dedent(
    """\
    #!/bin/bash
    trap 'echo shell >> "$1/got"; sleep 1; kill -TERM $child; wait $child; exit 99' USR1
    python3 -c "
    import signal, sys, time, pathlib
    got = pathlib.Path(sys.argv[1]) / 'got'
    signal.signal(signal.SIGUSR1, lambda *a: got.open('a').write('child\\n'))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    (pathlib.Path(sys.argv[1]) / 'ready').touch()
    while True: time.sleep(0.02)
    " "$1" &
    child=$!
    wait $child
    """
)


def _warned(tmp_path: Path, shell_only: bool) -> tuple[list[str], int]:
    script = tmp_path / "job.sh"
    script.write_text(TRAPPED)
    script.chmod(0o755)
    ex = LocalExecutor(run_dir=tmp_path / "run")
    handle = ex.start(launch(tmp_path, [str(script), str(tmp_path)], signal_shell_only=shell_only))
    wait_for((tmp_path / "ready").exists, 20, "the job to start", interval=0.02)
    ex.signal(handle, signal.SIGUSR1)
    ended = wait_for(lambda: ex.poll(handle), 20, "the job to end", interval=0.02)
    return sorted((tmp_path / "got").read_text().split()), int(ended.code)


def test_a_shell_only_warning_reaches_the_scripts_shell_alone(tmp_path: Path) -> None:
    got, code = _warned(tmp_path, shell_only=True)
    assert got == ["shell"]  # the child was not signalled behind the trap's back
    assert code == 99  # the trap's word: checkpointed, requeue me


def test_by_default_a_warning_reaches_every_process_of_the_job(tmp_path: Path) -> None:
    got, _ = _warned(tmp_path, shell_only=False)
    assert got == ["child", "shell"]


def test_a_shell_only_job_is_still_paused_and_killed_whole(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(TRAPPED)
    script.chmod(0o755)
    ex = LocalExecutor(run_dir=tmp_path / "run")
    handle = ex.start(launch(tmp_path, [str(script), str(tmp_path)], signal_shell_only=True))
    wait_for((tmp_path / "ready").exists, 20, "the job to start", interval=0.02)
    tree = [psutil.Process(pid) for pid in shim.tree(handle.pid)]
    assert len(tree) == 2  # the shell and its child
    ex.pause(handle)
    wait_for(lambda: all(p.status() == psutil.STATUS_STOPPED for p in tree), 10, "all stopped")
    ex.thaw(handle)
    ex.signal(handle, signal.SIGKILL)
    ended = wait_for(lambda: ex.poll(handle), 20, "the job to end", interval=0.02)
    assert ended.code == 137 and not any(p.is_running() and p.status() != "zombie" for p in tree)
