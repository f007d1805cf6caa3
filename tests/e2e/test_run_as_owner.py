"""End to end: ``ebb worker --run-as owner`` as root runs each job as its owner, a real
Unix user — its processes have the owner's uid, its files are the owner's alone, and it
sees nothing of the agent's environment; another user's job can read none of it; a job of
an unknown user fails at once with the reason, and one of root's, which the node's
heartbeat says it does not run, is never placed there but waits, saying why; and no link
a job plants makes the root agent write or read anything else."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import ebb, ebb_env, ebb_json, job, start, stop, wait_final, wait_for
from tests.users import ALICE, BOB, User, real_user, require_root

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

PYTHON = "/usr/bin/python3"  # the test venv's python is in root's home: not for others
POLICY = """\
apiVersion: ebbtide/v1
defaults:
  heartbeat_timeout_s: 3s
  dispatch_timeout_s: 10s
"""

#: Alice's job: notes who and where it is, keeps a secret, plants links where a root agent
#: might write or read, and runs until told to stop (so that Bob's job can probe it).
ALICES_JOB = textwrap.dedent(
    """\
    import json, os, sys, time
    target, leak = sys.argv[1:3]
    ckpt = os.environ["EBBTIDE_CHECKPOINT_DIR"]
    status = os.environ["EBBTIDE_STATUS_FILE"]
    with open(os.path.join(ckpt, "secret.txt"), "w") as f:
        f.write("alice's secret\\n")
    print("alice's log line", flush=True)
    # where an older shim wrote its status as root, and where the agent reads status lines
    os.symlink(target, os.path.join(os.path.dirname(status), "shim.json"))
    os.symlink(leak, status)
    me = {"uids": os.getresuid(), "gids": os.getresgid(), "groups": os.getgroups(),
          "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid()}
    with open(os.path.join(ckpt, "me.tmp"), "w") as f:
        json.dump(me, f)
    os.rename(os.path.join(ckpt, "me.tmp"), os.path.join(ckpt, "me.json"))
    while not os.path.exists(os.path.join(ckpt, "go")):
        time.sleep(0.05)
    """
)

#: Bob's job: tries to read Alice's job's environment, log and checkpoint, to list the
#: shared directories and to signal her job; prints what happened.
BOBS_JOB = textwrap.dedent(
    """\
    import json, os, sys
    pid, log, secret, home = sys.argv[1:5]
    def attempt(fn):
        try:
            fn()
            return "allowed"
        except PermissionError:
            return "denied"
        except OSError as exc:
            return f"error {exc.errno}"
    print(json.dumps({
        "environ": attempt(lambda: open(f"/proc/{pid}/environ", "rb").read()),
        "log": attempt(lambda: open(log).read()),
        "secret": attempt(lambda: open(secret).read()),
        "list_home": attempt(lambda: os.listdir(home)),
        "list_logs": attempt(lambda: os.listdir(os.path.join(home, "logs"))),
        "list_checkpoints": attempt(lambda: os.listdir(os.path.join(home, "checkpoints"))),
        "signal": attempt(lambda: os.kill(int(pid), 0)),
        "uids": os.getresuid(),
        "env": dict(os.environ),
    }))
    """
)


def mode_owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid


def proc_uids(pid: int) -> list[int]:
    """The real, effective, saved and filesystem uids of ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(u) for u in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


@pytest.fixture
def users() -> tuple[User, User]:
    require_root()
    return real_user(ALICE), real_user(BOB)


@pytest.fixture
def node(tmp_path, redis_url, postgres_url, users) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A scheduler and a root ``ebb worker --run-as owner`` on a home its jobs' users can
    pass through (pytest's own directories are root's alone)."""
    home = Path(tempfile.mkdtemp(prefix="ebbtest-home-", dir="/tmp"))
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text(POLICY)
    env = ebb_env(
        home,
        EBBTIDE_DB_URL=postgres_url,
        EBBTIDE_REDIS_URL=redis_url,
        EBBTIDE_NAMESPACE=f"ebbtest-{uuid.uuid4().hex[:8]}",
        EBBTIDE_POLICY=str(policy),
    )
    procs = [start(env, "scheduler", log=tmp_path / "scheduler.log")]
    procs.append(
        start(
            env,
            *("worker", "--node", "n1", "--devices", "1x80GiB", "--run-as", "owner"),
            log=tmp_path / "worker.log",
        )
    )
    try:
        yield env, home, tmp_path
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(home, ignore_errors=True)


def submit(env: dict[str, str], owner: str | None, *args: str) -> int:
    """``ebb qsub`` as root, acting for ``owner`` (an admin may): the job is ``owner``'s."""
    as_owner = dict(env, EBBTIDE_USER=owner) if owner else env
    return int(ebb_json(as_owner, "qsub", "-l", "gpu=10%,gpumem=1GiB", *args)["id"])


def logs(tmp_path: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("*.log")))


def test_jobs_run_as_their_owners_and_cannot_reach_each_other(node, users) -> None:  # type: ignore[no-untyped-def]
    env, home, tmp = node
    alice, bob = users
    target = tmp / "precious"  # root's: what a planted link would have root overwrite
    target.write_text("untouched\n")
    leak = tmp / "leak.jsonl"  # root's: what a planted link would have root read
    leak.write_text(json.dumps({"type": "checkpoint", "path": "/leaked"}) + "\n")
    for f in (target, leak):
        f.chmod(0o600)

    a = submit(env, alice.name, "--", PYTHON, "-c", ALICES_JOB, str(target), str(leak))
    ckpt_a = home / "checkpoints" / str(a)
    me = wait_for(
        lambda: (ckpt_a / "me.json").exists() and json.loads((ckpt_a / "me.json").read_text()),
        30,
        "alice's job to run",
    )
    assert job(env, a)["state"] == "running", logs(tmp)
    # every id of its process is alice's; its shim (the agent's) stays root
    pid = me["pid"]
    assert proc_uids(pid) == [alice.uid] * 4
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert proc_uids(parent) == [0] * 4
    assert me["uids"] == [alice.uid] * 3 and me["gids"] == [alice.gid] * 3
    assert sorted(me["groups"]) == sorted(set(os.getgrouplist(alice.name, alice.gid)))
    assert me["cwd"] == os.getcwd()  # where it was submitted from, entered as alice
    environment = me["env"]
    assert (environment["HOME"], environment["USER"], environment["LOGNAME"]) == (
        alice.home,
        alice.name,
        alice.name,
    )
    assert environment["SHELL"] == "/bin/sh" and environment["PATH"]
    for secret in ("EBBTIDE_DB_URL", "EBBTIDE_REDIS_URL", "EBBTIDE_POLICY", "PGPASSWORD"):
        assert secret not in environment
    values = " ".join(environment.values())
    assert "postgresql" not in values and "redis://" not in values

    attempt_a = home / "logs" / str(a) / "1"
    b = submit(
        env,
        bob.name,
        *("--", PYTHON, "-c", BOBS_JOB, str(pid), str(attempt_a / "stdout.log")),
        *(str(ckpt_a / "secret.txt"), str(home)),
    )
    [done] = wait_final(env, [b], timeout=60).values()
    assert done["state"] == "succeeded", logs(tmp)
    seen = json.loads((home / "logs" / str(b) / "1" / "stdout.log").read_text())
    assert seen["uids"] == [bob.uid] * 3
    assert {k: seen[k] for k in ("environ", "log", "secret", "signal")} == dict.fromkeys(
        ("environ", "log", "secret", "signal"), "denied"
    )
    assert {k: seen[k] for k in ("list_home", "list_logs", "list_checkpoints")} == dict.fromkeys(
        ("list_home", "list_logs", "list_checkpoints"), "denied"
    )
    assert seen["env"]["HOME"] == bob.home and "EBBTIDE_DB_URL" not in seen["env"]

    (ckpt_a / "go").touch()
    [done] = wait_final(env, [a], timeout=60).values()
    assert done["state"] == "succeeded", logs(tmp)

    # the files: each attempt's directory, logs and checkpoints are its owner's alone ...
    for j, user in ((a, alice), (b, bob)):
        attempt = home / "logs" / str(j) / "1"
        assert mode_owner(attempt) == (0o700, user.uid)
        assert mode_owner(attempt / "stdout.log") == (0o600, user.uid)
        assert mode_owner(attempt / "stderr.log") == (0o600, user.uid)
        assert mode_owner(home / "checkpoints" / str(j)) == (0o700, user.uid)
        assert mode_owner(home / "logs" / str(j)) == (0o711, 0)
    # ... the way to them is root's, passable but not listable; the agent's own is root's
    for shared in (home, home / "logs", home / "checkpoints"):
        assert mode_owner(shared) == (0o711, 0)
    assert mode_owner(home / "run" / "n1") == (0o700, 0)
    assert "alice's log line" in (attempt_a / "stdout.log").read_text()
    # and the links alice's job planted led the root agent nowhere
    assert target.read_text() == "untouched\n"
    assert job(env, a)["checkpoint"] in (None, "")
    assert not any(e.get("path") == "/leaked" for e in ebb_json(env, "events", str(a)))


def test_a_job_that_cannot_run_as_its_owner_fails_at_once_with_the_reason(node, users) -> None:  # type: ignore[no-untyped-def]
    env, _home, tmp = node
    alice, _bob = users
    forbidden = Path("/root") / f"ebbtest-{uuid.uuid4().hex[:8]}"
    unknown = submit(env, "ebbtest-nosuchuser", "--", "true")
    # the node's heartbeat says it runs no root's job: refused at submission, with why
    refused = ebb(env, "qsub", "-l", "gpu=10%,gpumem=1GiB", "--", "true", check=False)
    assert refused.returncode == 1, refused.stderr
    assert "no node runs root's jobs: node n1 does not run root's jobs" in refused.stderr
    # taken anyway (for a node still to join): the scheduler places it on no node that
    # refuses it, so it waits, saying why, rather than fail at its start
    root = submit(env, None, "--allow-future", "--", "true")
    no_room = submit(env, alice.name, "--checkpoint-dir", str(forbidden), "--", "true")
    try:
        jobs = wait_final(env, [unknown, no_room], timeout=60)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(forbidden)
    assert {j["state"] for j in jobs.values()} == {"failed"}, logs(tmp)
    assert jobs[unknown]["attempts"] == 1
    reason = job(env, unknown)["reason"]
    assert "owner ebbtest-nosuchuser is not a user on node n1" in reason
    waiting = "waiting: no node runs root's jobs (n1: every user's but root's)"
    wait_for(lambda: job(env, root)["reason"] == waiting, 30, "root's job's reason")
    assert job(env, root)["state"] == "queued" and job(env, root)["attempts"] == 0
    # a checkpoint directory alice could not make is not made by root for her either
    reason = job(env, no_room)["reason"]
    assert f"could not make {forbidden} as {alice.name}: Permission denied" in reason
    assert not forbidden.exists()
