"""``ebbtide.job`` and the examples, run as real job processes with the agent's environment.

Each test plays the node agent: it sets the ``EBBTIDE_*`` variables, starts the job as a
subprocess, sends the warning signal, reads the status file, and starts the next attempt
with ``EBBTIDE_RESUME_FROM`` set to the last checkpoint the job reported.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"
#: The contract's "checkpointed, requeue me" exit code (ebbtide.queue.spec.REQUEUE_EXIT_CODE).
REQUEUE_EXIT_CODE = 99
#: How long a test waits for a job to reach a point before it fails, in seconds.
WAIT_S = 10.0

Spawn = Callable[..., subprocess.Popen[str]]


def agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of one attempt, as the node agent sets it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    env |= {
        "EBBTIDE_JOB_ID": "7",
        "EBBTIDE_ATTEMPT": "1",
        "EBBTIDE_CHECKPOINT_DIR": str(checkpoints),
        "EBBTIDE_STATUS_FILE": str(tmp_path / "status.jsonl"),
    }
    return env | extra


def local_env() -> dict[str, str]:
    """The environment of a local run: no ``EBBTIDE_*`` variables at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


def status_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "status.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def last_checkpoint(tmp_path: Path) -> str:
    return [s for s in status_lines(tmp_path) if s["type"] == "checkpoint"][-1]["path"]


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def run_py(
    code: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start job processes; every one still running at the end of the test is killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def python_job(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def expect_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != expected:
        _, err = proc.communicate(timeout=WAIT_S)
        pytest.fail(f"expected {expected!r} from the job, got {line!r}; stderr:\n{err}")


# ------------------------------------------------------------------ state and restore


def test_restore_gives_default_on_fresh_start(tmp_path: Path) -> None:
    result = run_py(
        """
        import ebbtide.job as job
        print(job.restore({"fresh": True}), job.job_id(), job.attempt(), job.array_index())
        """,
        agent_env(tmp_path, EBBTIDE_RESUME_FROM="", EBBTIDE_ARRAY_INDEX="3"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["{'fresh':", "True}", "7", "1", "3"]


def test_checkpoint_then_restore_in_a_new_process(tmp_path: Path) -> None:
    env = agent_env(tmp_path)
    saved = run_py(
        "import ebbtide.job as job; print(job.checkpoint({'step': 41, 'ids': {1, 2}}))", env
    )
    assert saved.returncode == 0, saved.stderr
    path = Path(saved.stdout.strip())
    assert path == tmp_path / "checkpoints" / "state.pkl"

    code = "import ebbtide.job as job; print(job.restore())"
    resumed = run_py(code, env | {"EBBTIDE_RESUME_FROM": str(path), "EBBTIDE_ATTEMPT": "2"})
    assert resumed.stdout.strip() == "{'step': 41, 'ids': {1, 2}}", resumed.stderr
    # Without RESUME_FROM the newest state.pkl in the checkpoint directory is used.
    assert run_py(code, env).stdout.strip() == "{'step': 41, 'ids': {1, 2}}"


def test_local_run_without_ebbtide_environment(tmp_path: Path) -> None:
    result = run_py(
        """
        import ebbtide.job as job
        assert (job.job_id(), job.attempt(), job.array_index(), job.resume_from()) == (
            None, 1, None, None)
        assert job.restore("fresh") == "fresh"
        job.progress(1, 2)
        print(job.checkpoint([1, 2, 3]))
        print(job.restore())
        """,
        local_env(),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    path, restored = result.stdout.splitlines()
    assert Path(path) == tmp_path / ".ebbtide-checkpoints" / "state.pkl"
    assert restored == "[1, 2, 3]"


def test_restore_refuses_a_checkpoint_it_did_not_write(tmp_path: Path) -> None:
    framework_file = tmp_path / "ckpt-10.pt"
    framework_file.write_bytes(b"PK\x03\x04 not ours")
    damaged = tmp_path / "state.pkl"
    damaged.write_bytes(b"garbage")
    given = [str(framework_file), str(damaged), str(tmp_path)]
    result = run_py(
        f"""
        import os
        import ebbtide.job as job
        for path in {given!r}:
            os.environ["EBBTIDE_RESUME_FROM"] = path
            try:
                job.restore()
            except ValueError as exc:
                print(exc)
        """,
        agent_env(tmp_path),
    )
    messages = result.stdout.splitlines()
    assert len(messages) == 3, result.stderr
    for message in messages:
        assert "not written by ebbtide.job.checkpoint()" in message
        assert "job.checkpoint_dir()" in message
        assert "job.resume_from()" in message


def test_status_lines_have_the_documented_fields(tmp_path: Path) -> None:
    framework_dir = tmp_path / "checkpoints" / "step-5"
    framework_dir.mkdir(parents=True)
    (framework_dir / "model.bin").write_bytes(b"x" * 300)
    (framework_dir / "optim.bin").write_bytes(b"y" * 200)
    before = time.time()
    result = run_py(
        f"""
        import ebbtide.job as job
        job.progress(3, 10)
        job.progress(4)
        job.checkpoint({{"step": 4}})
        job.checkpointed({str(framework_dir)!r})
        """,
        agent_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    first, second, saved, reported = status_lines(tmp_path)

    assert first.keys() == {"type", "done", "total", "time"}
    assert (first["type"], first["done"], first["total"]) == ("progress", 3.0, 10.0)
    assert (second["done"], second["total"]) == (4.0, None)

    assert saved.keys() == {"type", "path", "size_bytes", "duration_s", "time"}
    assert saved["type"] == "checkpoint"
    assert saved["path"] == str(tmp_path / "checkpoints" / "state.pkl")
    assert saved["size_bytes"] == Path(saved["path"]).stat().st_size
    assert isinstance(saved["duration_s"], float) and saved["duration_s"] >= 0

    assert reported["path"] == str(framework_dir)
    assert reported["size_bytes"] == 500
    assert reported["duration_s"] is None
    for line in (first, second, saved, reported):
        assert before <= line["time"] <= time.time()


# ----------------------------------------------------------------------- atomicity


def test_kill_while_writing_leaves_the_previous_checkpoint(tmp_path: Path, spawn: Spawn) -> None:
    env = agent_env(tmp_path)
    proc = spawn(
        python_job(
            """
            import os, time
            import ebbtide.job as job
            job.checkpoint({"v": "old"})
            def slow_fsync(fd):
                print("writing", flush=True)
                time.sleep(60)
            os.fsync = slow_fsync
            job.checkpoint({"v": "new", "blob": b"x" * 1_000_000})
            """
        ),
        env,
    )
    expect_line(proc, "writing")
    checkpoints = tmp_path / "checkpoints"
    assert list(checkpoints.glob(".state.pkl.*.tmp")), "the new state goes to a temp file"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT_S)

    assert pickle.loads((checkpoints / "state.pkl").read_bytes()) == {"v": "old"}
    result = run_py(
        "import ebbtide.job as job; print(job.restore()); job.checkpoint({'v': 'next'})", env
    )
    assert result.stdout.strip() == "{'v': 'old'}", result.stderr
    assert not list(checkpoints.glob(".state.pkl.*.tmp")), "leftover temp file swept"


def test_checkpoint_survives_sigkill_at_any_moment(tmp_path: Path, spawn: Spawn) -> None:
    state_file = tmp_path / "checkpoints" / "state.pkl"
    for delay_s in (0.03, 0.11):
        proc = spawn(
            python_job(
                """
                import itertools
                import ebbtide.job as job
                job.checkpoint({"i": 0, "blob": b""})
                print("ready", flush=True)
                for i in itertools.count(1):
                    job.checkpoint({"i": i, "blob": bytes([i % 256]) * 2_000_000})
                """
            ),
            agent_env(tmp_path),
        )
        expect_line(proc, "ready")
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
        state = pickle.loads(state_file.read_bytes())
        if state["i"]:
            blob = state["blob"]
            assert len(blob) == 2_000_000
            assert blob.count(state["i"] % 256) == len(blob)


# ----------------------------------------------------------------------- preemption


@pytest.mark.parametrize("configured", [None, "TERM", "USR1", "SIGUSR1"])
def test_preempted_flips_after_the_warning_signal(
    tmp_path: Path, spawn: Spawn, configured: str | None
) -> None:
    env = agent_env(tmp_path)
    if configured is not None:
        env["EBBTIDE_WARNING_SIGNAL"] = configured
    proc = spawn(
        python_job(
            """
            import sys, time
            import ebbtide.job as job
            assert not job.preempted()
            print("ready", flush=True)
            deadline = time.monotonic() + 10
            while not job.preempted():
                if time.monotonic() > deadline:
                    sys.exit(3)
                time.sleep(0.005)
            print("preempted", flush=True)
            """
        ),
        env,
    )
    expect_line(proc, "ready")
    proc.send_signal(signal.SIGUSR1 if configured and "USR1" in configured else signal.SIGTERM)
    expect_line(proc, "preempted")
    assert proc.wait(timeout=WAIT_S) == 0


def test_other_signals_keep_their_default_action(tmp_path: Path, spawn: Spawn) -> None:
    proc = spawn(
        python_job("import time, ebbtide.job; print('ready', flush=True); time.sleep(10)"),
        agent_env(tmp_path, EBBTIDE_WARNING_SIGNAL="USR1"),
    )
    expect_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT_S) == -signal.SIGTERM


def test_requeue_exits_99_and_runs_finally_blocks(tmp_path: Path) -> None:
    result = run_py(
        """
        import ebbtide.job as job
        from ebbtide.queue.spec import REQUEUE_EXIT_CODE
        assert job.REQUEUE_EXIT_CODE == REQUEUE_EXIT_CODE
        try:
            job.requeue()
        finally:
            print("cleaned up")
        """,
        agent_env(tmp_path),
    )
    assert result.returncode == REQUEUE_EXIT_CODE, result.stderr
    assert result.stdout.strip() == "cleaned up"


# ------------------------------------------------------------------------- examples


def count_py(*args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / "count.py"), *args]


def test_count_requeues_on_warning_and_resumes_to_exactly_n(tmp_path: Path, spawn: Spawn) -> None:
    out = tmp_path / "out.json"
    argv = count_py("60", "--step-s", "0.01", "--every", "7", "--out", str(out))
    env = agent_env(tmp_path, EBBTIDE_WARNING_SIGNAL="USR1")
    first = spawn(argv, env)
    expect_line(first, "attempt 1: starting at 0 of 60")
    wait_until(lambda: bool(status_lines(tmp_path)), "the first checkpoint")
    first.send_signal(signal.SIGUSR1)
    assert first.wait(timeout=WAIT_S) == REQUEUE_EXIT_CODE
    assert not out.exists()
    resume_from = last_checkpoint(tmp_path)
    stopped_at = pickle.loads(Path(resume_from).read_bytes())["count"]
    assert 7 <= stopped_at < 60

    second = spawn(argv, env | {"EBBTIDE_ATTEMPT": "2", "EBBTIDE_RESUME_FROM": resume_from})
    stdout, stderr = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, stderr
    assert stdout.splitlines() == [f"attempt 2: starting at {stopped_at} of 60", "counted to 60"]
    assert json.loads(out.read_text()) == {"count": 60, "attempts_seen": [1, 2]}


def test_count_ignoring_the_warning_is_killed_and_resumes_from_periodic_checkpoint(
    tmp_path: Path, spawn: Spawn
) -> None:
    out = tmp_path / "out.json"
    argv = count_py("80", "--step-s", "0.01", "--every", "5", "--ignore-warning", "--out", str(out))
    env = agent_env(tmp_path)
    first = spawn(argv, env)
    wait_until(lambda: len(status_lines(tmp_path)) >= 2, "two checkpoints")
    first.send_signal(signal.SIGTERM)  # the warning: ignored
    seen = len(status_lines(tmp_path))
    wait_until(lambda: len(status_lines(tmp_path)) >= seen + 2, "checkpoints after the warning")
    assert first.poll() is None, "the job ignored the warning and kept running"
    first.send_signal(signal.SIGKILL)  # the deadline
    assert first.wait(timeout=WAIT_S) == -signal.SIGKILL

    resume_from = last_checkpoint(tmp_path)
    second = spawn(argv, env | {"EBBTIDE_ATTEMPT": "2", "EBBTIDE_RESUME_FROM": resume_from})
    stdout, stderr = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, stderr
    assert stdout.splitlines()[-1] == "counted to 80"
    assert json.loads(out.read_text()) == {"count": 80, "attempts_seen": [1, 2]}


def test_count_sh_follows_the_contract_without_the_library(tmp_path: Path, spawn: Spawn) -> None:
    argv = ["bash", str(EXAMPLES / "count.sh"), "50", "0.01", "4"]
    env = agent_env(tmp_path, EBBTIDE_WARNING_SIGNAL="USR1")
    first = spawn(argv, env)
    expect_line(first, "attempt 1: starting at 0 of 50")
    wait_until(lambda: bool(status_lines(tmp_path)), "the first checkpoint")
    first.send_signal(signal.SIGUSR1)
    assert first.wait(timeout=WAIT_S) == REQUEUE_EXIT_CODE
    line = status_lines(tmp_path)[-1]
    assert line.keys() == {"type", "path", "size_bytes", "duration_s", "time"}
    stopped_at = int(Path(line["path"]).read_text())
    assert line["size_bytes"] == len(f"{stopped_at}\n")

    second = spawn(argv, env | {"EBBTIDE_ATTEMPT": "2", "EBBTIDE_RESUME_FROM": line["path"]})
    stdout, stderr = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, stderr
    assert stdout.splitlines() == [f"attempt 2: starting at {stopped_at} of 50", "counted to 50"]


def test_train_torch_style_resumes_to_the_same_model(tmp_path: Path, spawn: Spawn) -> None:
    argv = [sys.executable, str(EXAMPLES / "train_torch_style.py"), "--steps", "100"]
    fast = ["--step-s", "0.005", "--save-every", "10"]
    uninterrupted = subprocess.run(
        [*argv, "--step-s", "0"],
        env=local_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    env = agent_env(tmp_path)
    first = spawn([*argv, *fast], env)
    wait_until(lambda: bool(status_lines(tmp_path)), "the first checkpoint")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=WAIT_S) == REQUEUE_EXIT_CODE
    resume_from = last_checkpoint(tmp_path)
    assert Path(resume_from).name.startswith("ckpt-")

    second = spawn([*argv, *fast], env | {"EBBTIDE_RESUME_FROM": resume_from})
    stdout, stderr = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, stderr
    assert stdout.splitlines()[-1] == uninterrupted.stdout.splitlines()[-1]


def test_batch_inference_array_task_skips_done_batches(tmp_path: Path, spawn: Spawn) -> None:
    out_dir = tmp_path / "out"
    argv = [
        sys.executable, str(EXAMPLES / "batch_inference.py"), "--items", "200",
        "--shards", "2", "--batch-size", "10", "--item-s", "0.004", "--out-dir", str(out_dir),
    ]  # fmt: skip
    env = agent_env(tmp_path, EBBTIDE_ARRAY_INDEX="1")
    first = spawn(argv, env)
    wait_until(lambda: len(status_lines(tmp_path)) >= 2, "two batches")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=WAIT_S) == REQUEUE_EXIT_CODE

    second = spawn(argv, env | {"EBBTIDE_RESUME_FROM": last_checkpoint(tmp_path)})
    stdout, stderr = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, stderr
    already_done = int(stdout.split(" items, ")[1].split(" of ")[0])
    assert 2 <= already_done < 10
    rows = [
        json.loads(line)
        for part in sorted((out_dir / "shard-1").glob("batch-*.jsonl"))
        for line in part.read_text().splitlines()
    ]
    assert [row["item"] for row in rows] == list(range(1, 200, 2))


def test_progress_at_every_step_writes_a_few_lines_and_the_last_at_exit(tmp_path: Path) -> None:
    """A job may call ``job.progress`` at every step: the status file (which the agent
    parses, on the node the online service runs on) gets at most a line a period, and
    the last call's values when the process ends."""
    result = run_py(
        """
        import ebbtide.job as job
        for i in range(20_000):
            job.progress(i, 20_000)
        job.progress(20_000, 20_000)
        """,
        agent_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    lines = status_lines(tmp_path)
    assert 2 <= len(lines) <= 10, len(lines)
    assert lines[0]["done"] == 0.0  # the first at once
    assert (lines[-1]["done"], lines[-1]["total"]) == (20_000.0, 20_000.0)  # the last at exit


def test_held_back_progress_goes_out_before_a_checkpoint_a_result_and_a_requeue(
    tmp_path: Path,
) -> None:
    result = run_py(
        """
        import ebbtide.job as job
        job.progress(1, 9)
        job.progress(2, 9)  # held back: within a period of the first
        job.checkpoint({"step": 2})
        job.progress(3, 9)
        job.result("ok")
        job.progress(4, 9)
        job.requeue()
        """,
        agent_env(tmp_path),
    )
    assert result.returncode == 99, result.stderr
    seen = [(s["type"], s.get("done")) for s in status_lines(tmp_path)]
    assert seen == [
        ("progress", 1.0),
        ("progress", 2.0),
        ("checkpoint", None),
        ("progress", 3.0),
        ("result", None),
        ("progress", 4.0),
    ]


def test_progress_and_checkpoint_refuse_what_they_cannot_report_naming_it(
    tmp_path: Path,
) -> None:
    # (progress("a", 10) was float()'s bare ValueError; progress(1, 0) and (-1, 10) were
    # taken and shown as progress; an unpicklable state was pickle's own AttributeError)
    import ebbtide.job as job

    for done, total, error, says in (
        ("a", 10, TypeError, "progress: done must be a number, got 'a'"),
        (1, "lots", TypeError, "progress: total must be a number, got 'lots'"),
        (float("nan"), 10, ValueError, "progress: done must be a finite number, got nan"),
        (-1, 10, ValueError, "progress: done must be 0 or more, got -1"),
        (1, 0, ValueError, "progress: total must be more than 0 (None: not known), got 0"),
    ):
        with pytest.raises(error) as caught:
            job.progress(done, total)  # (refused before the job's handler is installed)
        assert str(caught.value) == says
    result = run_py(
        """
        import ebbtide.job as job
        job.progress(12, 10)  # an estimate that fell short is taken as it is
        job.progress(3)  # and a total not known
        try:
            job.checkpoint({"f": lambda: 1})
        except TypeError as exc:
            print(exc)
        """,
        agent_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("checkpoint: the state cannot be pickled (")
    assert list((tmp_path / "checkpoints").iterdir()) == []  # nothing half written
    assert [(s["done"], s["total"]) for s in status_lines(tmp_path)] == [(12.0, 10.0), (3.0, None)]
