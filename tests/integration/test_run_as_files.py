"""An attempt's files, made so that no job can turn them against the agent, and the shim
that runs a job as its owner: real files, real links, real Unix users (as root)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.errors import ConfigError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.workers import attempt_files, shim
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.attempt_files import UnsafeFile
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.executor import LocalExecutor
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.launch import launch_for
from ebbtide.workers.runas import Identity, base_env
from ebbtide.workers.status import StatusReader
from tests.unit.builders import JobRow
from tests.users import ALICE, BOB, User, real_user, require_root

PYTHON = "/usr/bin/python3"  # the test venv's python is in root's home: not for others


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


def identity(user: User) -> Identity:
    groups = tuple(os.getgrouplist(user.name, user.gid))
    return Identity(user.name, user.uid, user.gid, groups, user.home, "/bin/sh", switch=True)


@pytest.fixture
def alice() -> Identity:
    require_root()
    return identity(real_user(ALICE))


@pytest.fixture
def bob() -> Identity:
    require_root()
    return identity(real_user(BOB))


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A file of the agent's a job would love to have it write to."""
    t = tmp_path / "precious"
    t.write_text("untouched\n")
    t.chmod(0o600)
    return t


# -- the agent's own user (any user may run these) --------------------------------------


def test_attempt_directories_and_logs_are_private_to_the_agents_user(tmp_path: Path) -> None:
    d = attempt_files.attempt_dir(tmp_path, 4, 1, None)
    assert d == tmp_path / "logs" / "4" / "1"
    assert (mode(tmp_path / "logs"), mode(tmp_path / "logs" / "4"), mode(d)) == (
        0o711,
        0o711,
        0o700,
    )
    assert mode(attempt_files.checkpoint_dir(tmp_path, 4, None)) == 0o700
    assert mode(tmp_path / "checkpoints") == 0o711
    os.close(attempt_files.open_log(d / "stdout.log", None))
    assert mode(d / "stdout.log") == 0o600


def test_a_log_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, target) -> None:  # type: ignore[no-untyped-def]
    d = attempt_files.attempt_dir(tmp_path, 4, 1, None)
    (d / "stdout.log").symlink_to(target)
    with pytest.raises(UnsafeFile, match=r"stdout\.log"):
        attempt_files.open_log(d / "stdout.log", None)
    assert target.read_text() == "untouched\n" and mode(target) == 0o600


def test_a_planted_hard_link_or_fifo_is_refused_without_hanging(tmp_path, target) -> None:  # type: ignore[no-untyped-def]
    d = attempt_files.attempt_dir(tmp_path, 4, 1, None)
    os.link(target, d / "stdout.log")
    with pytest.raises(UnsafeFile, match="2 links"):
        attempt_files.open_log(d / "stdout.log", None)
    os.mkfifo(d / "stderr.log")
    with pytest.raises(UnsafeFile, match=r"stderr\.log"):  # no reader: ENXIO, not a hang
        attempt_files.open_log(d / "stderr.log", None)
    reader = os.open(d / "stderr.log", os.O_RDONLY | os.O_NONBLOCK)
    try:  # with a reader, it opens: and is refused for what it is
        with pytest.raises(UnsafeFile, match="not a regular file"):
            attempt_files.open_log(d / "stderr.log", None)
    finally:
        os.close(reader)
    assert target.read_text() == "untouched\n"


def test_the_script_replaces_a_planted_link_and_never_writes_through_it(tmp_path, target) -> None:  # type: ignore[no-untyped-def]
    d = attempt_files.attempt_dir(tmp_path, 4, 1, None)
    (d / "job.script").symlink_to(target)
    attempt_files.write_script(d / "job.script", "echo hi\n", None)
    assert not (d / "job.script").is_symlink()
    assert (d / "job.script").read_text() == "echo hi\n"
    assert target.read_text() == "untouched\n"
    assert [p.name for p in d.iterdir()] == ["job.script"]  # no temporary left


def test_a_directory_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "4").symlink_to(elsewhere)
    with pytest.raises(UnsafeFile, match="is not a directory"):
        attempt_files.attempt_dir(tmp_path, 4, 1, None)
    assert mode(elsewhere) == 0o755 and list(elsewhere.iterdir()) == []


def test_the_status_reader_follows_no_link_and_waits_on_no_fifo(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"type": "checkpoint", "path": "/leaked"}) + "\n")
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(secret)
    assert StatusReader(linked).read() == []
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    writer = threading.Timer(5, lambda: os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    writer.start()  # (a reader that waited would be freed by this, after 5 s)
    try:
        assert StatusReader(fifo).read() == []
    finally:
        writer.cancel()
    real = tmp_path / "status.jsonl"
    real.write_text(secret.read_text())
    assert [r.path for r in StatusReader(real).read()] == ["/leaked"]  # type: ignore[union-attr]


# -- other users (root only) ------------------------------------------------------------


def test_an_owners_attempt_directory_logs_and_script_are_the_owners(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    d = attempt_files.attempt_dir(tmp_path, 4, 1, alice)
    assert owner(d) == (alice.uid, alice.gid) and mode(d) == 0o700
    assert owner(tmp_path / "logs" / "4") == (0, 0) and mode(tmp_path / "logs" / "4") == 0o711
    os.close(attempt_files.open_log(d / "stdout.log", alice))
    assert owner(d / "stdout.log") == (alice.uid, alice.gid) and mode(d / "stdout.log") == 0o600
    attempt_files.write_script(d / "job.script", "echo hi\n", alice)
    assert owner(d / "job.script") == (alice.uid, alice.gid)
    c = attempt_files.checkpoint_dir(tmp_path, 4, alice)
    assert owner(c) == (alice.uid, alice.gid) and mode(c) == 0o700


def test_another_users_file_or_directory_is_never_taken_over(tmp_path, alice, bob) -> None:  # type: ignore[no-untyped-def]
    d = attempt_files.attempt_dir(tmp_path, 4, 1, alice)
    log = d / "stdout.log"
    log.write_text("bob's\n")
    os.chown(log, bob.uid, bob.gid)
    with pytest.raises(UnsafeFile, match=f"belongs to uid {bob.uid}"):
        attempt_files.open_log(log, alice)
    assert owner(log) == (bob.uid, bob.gid)
    # alice's attempt directory, for a job of bob's with that id (a store started afresh
    # on an old home): not handed over to bob
    with pytest.raises(UnsafeFile, match=f"belongs to uid {alice.uid}"):
        attempt_files.attempt_dir(tmp_path, 4, 1, bob)
    with pytest.raises(UnsafeFile, match=f"belongs to uid {alice.uid}"):
        attempt_files.checkpoint_dir(tmp_path, 4, alice) and attempt_files.checkpoint_dir(
            tmp_path, 4, bob
        )
    assert owner(d) == (alice.uid, alice.gid)


def test_the_home_lets_owners_through_but_lists_nothing(tmp_path: Path) -> None:
    require_root()
    home = tmp_path / "home"
    warnings = attempt_files.share_home(home)
    assert [mode(home / d) for d in ("", "logs", "checkpoints")] == [0o711] * 3
    assert all(owner(home / d) == (0, 0) for d in ("", "logs", "checkpoints"))
    # pytest's directories are root's alone: jobs of others could not reach this home
    assert any(f"cannot reach {home}" in w for w in warnings), warnings


def test_an_owner_mode_agent_does_not_start_on_a_home_someone_else_owns(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, alice.uid, alice.gid)  # alice could rename logs/ and plant her own
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    agent = NodeAgent(
        "n1", store, StaticSource(parse_devices("1x80GiB")), home=home, run_as="owner"
    )
    try:
        with pytest.raises(ConfigError, match=f"belongs to uid {alice.uid}"):
            agent.start()
    finally:
        agent.journal.close()
        store.close()


def test_an_owner_mode_agent_does_not_start_where_no_job_could_reach_its_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A trial's trap: a root agent on ``/root/.ebbtide`` only warned, then every job of
    every user failed at its start (``Permission denied``), root's being refused."""
    require_root()
    home = tmp_path / "home"  # pytest's directories are root's alone (0700)
    store = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}")
    agent = NodeAgent(
        "n1", store, StaticSource(parse_devices("1x80GiB")), home=home, run_as="owner"
    )
    try:
        with pytest.raises(ConfigError, match="No job could run here: root's are refused"):
            agent.start()
    finally:
        agent.journal.close()
    # with root's jobs allowed, they can run: it starts, and warns
    agent = NodeAgent(
        "n1",
        store,
        StaticSource(parse_devices("1x80GiB")),
        home=home,
        run_as="owner",
        allow_root_jobs=True,
    )
    try:
        agent.start()
    finally:
        agent.kill()
        store.close()


# -- the shim as another user (root only) -----------------------------------------------

PROBE = """\
import ctypes, json, os
libc = ctypes.CDLL(None)
sig = ctypes.c_int()
libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
print(json.dumps({"uids": os.getresuid(), "gids": os.getresgid(), "groups": os.getgroups(),
                  "cwd": os.getcwd(), "pdeathsig": sig.value}))
"""


def run_shim(tmp_path: Path, who: Identity, argv: list[str], *extra: str):  # type: ignore[no-untyped-def]
    status = tmp_path / "shim.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-I", shim.__file__, "--status", str(status)),
            *who.shim_args(),
            *extra,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return proc, json.loads(status.read_text())


def test_the_shim_runs_the_job_as_its_owner_for_good(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    proc, status = run_shim(tmp_path, alice, [PYTHON, "-c", PROBE])
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["uids"] == [alice.uid] * 3 and seen["gids"] == [alice.gid] * 3
    assert sorted(seen["groups"]) == sorted(set(alice.groups))
    assert seen["cwd"] == alice.home  # where a login starts
    assert seen["pdeathsig"] == 9  # set after the switch, which clears it
    assert status["cause"] == "job"
    assert owner(tmp_path / "shim.json") == (0, 0)  # the shim stayed root


def test_the_jobs_directory_is_made_by_its_owner(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    mine = Path(alice.home) / "ebbtest-ckpt" / "run-1"
    proc, _ = run_shim(tmp_path, alice, ["true"], "--mkdir", str(mine))
    try:
        assert proc.returncode == 0, proc.stderr
        assert owner(mine) == (alice.uid, alice.gid) and mode(mine) == 0o700
    finally:
        subprocess.run(["rm", "-rf", str(mine.parent)], check=True)


def test_a_directory_its_owner_could_not_make_is_not_made_and_says_why(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    forbidden = tmp_path / "root-only" / "ckpt"  # tmp_path is root's, 0700
    proc, status = run_shim(tmp_path, alice, ["true"], "--mkdir", str(forbidden))
    assert proc.returncode == shim.START_FAILED_EXIT
    assert status["cause"] == "start"
    assert f"could not make {forbidden} as {alice.user}: Permission denied" in status["error"]
    assert not forbidden.parent.exists()


def test_a_working_directory_its_owner_cannot_enter_is_refused(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    proc, status = run_shim(tmp_path, alice, ["true"], "--cwd", str(tmp_path))
    assert proc.returncode == shim.START_FAILED_EXIT
    assert f"could not enter {tmp_path} as {alice.user}: Permission denied" in status["error"]


def test_an_owner_inherits_no_path_directory_it_cannot_enter(tmp_path, alice) -> None:  # type: ignore[no-untyped-def]
    """An agent run from a virtual environment under root's 0700 home: a job with no
    ``PATH`` of its own found ``python`` there and got ``Permission denied``."""
    hidden = tmp_path / "venv" / "bin"  # tmp_path is root's, 0700
    hidden.mkdir(parents=True)
    tool = hidden / "ebbtest-tool"
    tool.write_text("#!/bin/sh\necho hidden\n")
    tool.chmod(0o755)
    env = base_env(alice, {}, {"PATH": f"{hidden}:/usr/bin:/bin"})
    assert env["PATH"] == f"{hidden}:/usr/bin:/bin"  # the shim's to trim, as alice
    env_r, env_w = os.pipe()
    os.write(env_w, json.dumps(env).encode())
    os.close(env_w)
    status = tmp_path / "shim.json"
    try:
        proc = subprocess.run(
            [
                *(sys.executable, "-I", shim.__file__, "--status", str(status)),
                *alice.shim_args(),
                *("--trim-path", "--env-fd", str(env_r), "--", "ebbtest-tool"),
            ],
            capture_output=True,
            text=True,
            timeout=20,
            pass_fds=(env_r,),
        )
    finally:
        os.close(env_r)
    error = json.loads(status.read_text())["error"]
    assert proc.returncode == shim.START_FAILED_EXIT
    assert "No such file or directory" in error and "Permission denied" not in error


def test_a_job_started_with_its_path_trimmed_holds_no_descriptor_of_the_shim(
    tmp_path, alice
) -> None:  # type: ignore[no-untyped-def]
    """With ``--trim-path`` the job is exec'd by the shim's child itself (subprocess's own
    ``close_fds`` never runs): the lease pipe must not reach it, or its user could read
    the agent's renewals and kills before the shim does."""
    lease_r, lease_w = os.pipe()
    os.dup2(lease_r, 57)  # a number no other descriptor of the shim's takes
    os.close(lease_r)
    env_r, env_w = os.pipe()
    os.write(env_w, json.dumps({"PATH": "/usr/bin:/bin"}).encode())
    os.close(env_w)
    try:
        proc = subprocess.run(
            [
                *(sys.executable, "-I", shim.__file__, "--status", str(tmp_path / "s.json")),
                *alice.shim_args(),
                *("--lease-fd", "57", "--lease-s", "60", "--trim-path"),
                *("--env-fd", str(env_r), "--", "ls", "/proc/self/fd"),
            ],
            capture_output=True,
            text=True,
            timeout=20,
            pass_fds=(57, env_r),
        )
    finally:
        for fd in (57, env_r, lease_w):
            os.close(fd)
    assert proc.returncode == 0, proc.stderr
    fds = set(proc.stdout.split())
    assert {"0", "1", "2"} <= fds and "57" not in fds, fds


PRINT_PATH = "import os; print(os.environ['PATH'])"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can pass through (in ``/tmp``, 0711), unlike pytest's."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="ebbtest-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d)


def path_as_owner(tmp_path: Path, who: Identity, spec: JobSpec) -> str:
    """The ``PATH`` that ``spec``'s job sees, started as the agent starts an owner's
    attempt: its launch (environment, shim arguments), the local executor, the shim."""
    home = Path(tempfile.mkdtemp(dir=tmp_path))
    launch = launch_for(
        spec, JobRow(), 1, home=home, node="n1", devices=[], lease_s=60, identity=who
    )
    executor = LocalExecutor(run_dir=home / "run")
    handle = executor.start(launch)
    try:
        handle.popen.wait(20)  # type: ignore[union-attr]
        ended = executor.poll(handle)
    finally:
        executor.sweep(handle)
    assert ended is not None and ended.code == 0, (ended, launch.stderr_path.read_text())
    return launch.stdout_path.read_text().strip()


def test_an_owner_gets_of_the_agents_path_what_the_kernel_lets_it_search(  # type: ignore[no-untyped-def]
    tmp_path, alice, shared, monkeypatch
) -> None:
    """Mode bits as root sees them are not the owner's view: a link into a 0700
    directory (whose ancestors were never checked) passed, as did anything a slow mount
    made the agent wait for; a job's own ``PATH`` is its business."""
    private = tmp_path / "private" / "bin"  # tmp_path is root's, 0700
    private.mkdir(parents=True, mode=0o755)
    linked = shared / "linked-bin"
    linked.symlink_to(private)  # the link is reachable; where it leads is not
    hidden = tmp_path / "venv" / "bin"
    hidden.mkdir(parents=True)
    public = shared / "bin"
    public.mkdir(mode=0o755)
    agents = [hidden, linked, public, "/usr/bin", "/bin", "/usr/bin", "bin", shared / "gone"]
    monkeypatch.setenv("PATH", ":".join(map(str, agents)))
    command = [PYTHON, "-c", PRINT_PATH]
    assert path_as_owner(tmp_path, alice, JobSpec(command=command)) == f"{public}:/usr/bin:/bin"
    own = f"{hidden}:{linked}:bin"  # -v PATH / -V: kept as given, however useless
    assert path_as_owner(tmp_path, alice, JobSpec(command=command, env={"PATH": own})) == own


#: POSIX ACL tags and the version of their extended attribute (``linux/posix_acl_xattr.h``)
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
ACL_XATTR_VERSION = 2
ACL_UNDEFINED_ID = 0xFFFFFFFF


def set_user_acl(directory: Path, uid: int, perm: int) -> None:
    """Give the user ``uid`` the permissions ``perm`` (``rwx`` bits) on ``directory`` by an
    ACL entry, with ``setfacl`` or, without it, the extended attribute the kernel reads;
    skip when neither can (a file system without ACLs)."""
    setfacl = shutil.which("setfacl")
    if setfacl is not None:
        bits = "".join(c for c, b in zip("rwx", (4, 2, 1), strict=True) if perm & b) or "-"
        proc = subprocess.run(
            [setfacl, "-m", f"u:{uid}:{bits}", str(directory)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"setfacl cannot set an ACL here: {proc.stderr.strip()}")
        return
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    group = (mode >> 3) & 7
    entries = [
        (ACL_USER_OBJ, (mode >> 6) & 7, ACL_UNDEFINED_ID),
        (ACL_USER, perm, uid),
        (ACL_GROUP_OBJ, group, ACL_UNDEFINED_ID),
        (ACL_MASK, group | perm, ACL_UNDEFINED_ID),
        (ACL_OTHER, mode & 7, ACL_UNDEFINED_ID),
    ]
    value = struct.pack("<I", ACL_XATTR_VERSION)
    value += b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(directory, "system.posix_acl_access", value)
    except OSError as exc:
        pytest.skip(f"no setfacl, and no ACL can be set here: {exc.strerror}")


def test_an_acl_grants_or_denies_an_owner_a_path_directory(  # type: ignore[no-untyped-def]
    tmp_path, alice, shared, monkeypatch
) -> None:
    """``drwx--x---+`` with ``user:alice:--x``: alice may search it, which mode bits alone
    denied; ``drwxr-xr-x+`` with ``user:alice:---``: she may not, which they allowed."""
    granted = shared / "granted"
    granted.mkdir()
    granted.chmod(0o710)
    set_user_acl(granted, alice.uid, 0o1)
    denied = shared / "denied"
    denied.mkdir()
    denied.chmod(0o755)
    set_user_acl(denied, alice.uid, 0)
    monkeypatch.setenv("PATH", f"{denied}:{granted}:/usr/bin:/bin")
    seen = path_as_owner(tmp_path, alice, JobSpec(command=[PYTHON, "-c", PRINT_PATH]))
    assert seen == f"{granted}:/usr/bin:/bin"
