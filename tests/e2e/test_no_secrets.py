"""End to end with passworded Redis and PostgreSQL URLs: no password reaches a job, a log
line, an event or a message of a full run — including its failures (Redis restarted
mid-run, a wrong password, a store that is not there)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.helpers import ebb, ebb_env, ebb_json, start, stop, wait_final, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

REDIS_SECRET = "r3dis-Secr3t-" + uuid.uuid4().hex[:8]
PG_SECRET = "pg-Secr3t-" + uuid.uuid4().hex[:8]
POLICY = """\
defaults:
  heartbeat_timeout_s: 3s
  dispatch_timeout_s: 10s
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--requirepass", REDIS_SECRET),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("redis-server did not start")


@pytest.fixture
def redis_port(redis_url):  # type: ignore[no-untyped-def]
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed to run a passworded Redis")
    port = _free_port()
    procs = [_redis(port)]
    yield port, procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _with_password(url: str, password: str) -> str:
    """``url`` with ``password`` for its user (PostgreSQL here trusts local users, so the
    password is carried and never checked: enough to see where it leaks)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{password}@{host}"


def _everything_written(root: Path, outputs: list[str]) -> str:
    texts = list(outputs)
    for path in root.rglob("*"):
        if path.is_file() and path.suffix not in {".db", ".sock"}:
            texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def test_no_password_in_any_log_job_event_or_message(tmp_path, redis_port, postgres_url):  # type: ignore[no-untyped-def]
    port, redis_procs = redis_port
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text(POLICY)
    env = ebb_env(
        tmp_path / "home",
        EBBTIDE_DB_URL=_with_password(postgres_url, PG_SECRET),
        EBBTIDE_REDIS_URL=f"redis://:{REDIS_SECRET}@127.0.0.1:{port}/0",
        EBBTIDE_POLICY=str(policy),
    )
    outputs: list[str] = []

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = ebb(env, *args, check=check)
        outputs.extend([proc.stdout, proc.stderr])
        return proc

    scheduler = start(env, "scheduler", "--log-level", "debug", log=tmp_path / "scheduler.log")
    worker = start(
        env,
        "worker",
        "--node",
        "n1",
        "--devices",
        "1x80GiB",
        "--log-level",
        "debug",
        log=tmp_path / "worker.log",
    )
    try:
        printer = json_id(run("qsub", "--json", "--", "sh", "-c", "env; cat /proc/self/environ"))
        failing = json_id(run("qsub", "--json", "--", "sh", "-c", "echo oops >&2; exit 3"))
        sleeper = json_id(
            run("qsub", "--json", "-l", "gpu=10%", "--", sys.executable, "-c", _SLEEP)
        )
        wait_for(
            lambda: ebb_json(env, "qstat", "-f", str(sleeper))["state"] == "running",
            60,
            "the sleeper to run",
        )
        # Redis restarted under the running cluster: every reconnect error is logged
        redis_procs[0].kill()
        redis_procs[0].wait()
        time.sleep(1.5)
        redis_procs.append(_redis(port))
        run("qdel", str(sleeper))
        jobs = wait_final(env, [printer, failing, sleeper], 90)
        assert jobs[printer]["state"] == "succeeded", jobs[printer]
        assert jobs[failing]["state"] == "failed"
        for job_id in (printer, failing, sleeper):
            run("events", "--json", str(job_id))
            run("qstat", "--json", "-f", str(job_id))
        run("qstat", "--json")
        run("nodes", "--json")
    finally:
        stop(worker)
        stop(scheduler)

    # failures that name the store or the broker
    wrong = dict(env, EBBTIDE_REDIS_URL=f"redis://:{REDIS_SECRET}x@127.0.0.1:{port}/0")
    proc = ebb(wrong, "worker", "--node", "n2", "--devices", "1x80GiB", check=False)
    outputs.extend([proc.stdout, proc.stderr])
    assert proc.returncode != 0
    gone = dict(env, EBBTIDE_DB_URL=f"postgresql://me:{PG_SECRET}@127.0.0.1:1/nope")
    proc = ebb(gone, "qstat", check=False)
    outputs.extend([proc.stdout, proc.stderr])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr

    # a trial's trap: the startup lines named the store but not Redis or the namespace
    for log in ("scheduler.log", "worker.log"):
        text = (tmp_path / log).read_text()
        assert f"Redis redis://:***@127.0.0.1:{port}/0 (namespace " in text, log
    everything = _everything_written(tmp_path, outputs)
    assert "redis" in everything.lower()  # the run did write about its broker
    assert REDIS_SECRET not in everything
    assert PG_SECRET not in everything
    job_out = (tmp_path / "home" / "logs" / str(printer) / "1" / "stdout.log").read_text()
    assert "EBBTIDE_JOB_ID=" in job_out  # the job did print its environment
    for leak in ("EBBTIDE_DB_URL", "EBBTIDE_REDIS_URL", "postgresql", "redis://"):
        assert leak not in job_out


_SLEEP = "import time\nwhile True: time.sleep(0.1)"


def json_id(proc: subprocess.CompletedProcess[str]) -> int:
    import json

    return int(json.loads(proc.stdout)["id"])
