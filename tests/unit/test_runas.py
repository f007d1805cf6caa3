"""Whom an attempt runs as: the decision, table-driven on a fake password database, and
the environment an owner-mode attempt gets."""

from __future__ import annotations

import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.whose_jobs import refuses
from ebbtide.workers import shim
from ebbtide.workers.launch import env_for
from ebbtide.workers.runas import (
    DEFAULT_PATH,
    Identity,
    RunAsRefused,
    base_env,
    job_path,
    jobs_run_here,
    resolve,
    trims_path,
)
from tests.unit.builders import JobRow

USERS = {
    "alice": (1001, 1001, "/home/alice", "/bin/bash"),
    "bob": (1002, 1002, "/home/bob", "/bin/sh"),
    "root": (0, 0, "/root", "/bin/bash"),
}
GROUPS = {"alice": [1001, 27, 44], "bob": [1002], "root": [0]}


def getpwnam(name: str) -> pwd.struct_passwd:
    if "\0" in name:
        raise ValueError("embedded null byte")
    uid, gid, home, shell = USERS[name]  # KeyError: no such user
    return pwd.struct_passwd((name, "x", uid, gid, "", home, shell))


def getgrouplist(name: str, gid: int) -> list[int]:
    return GROUPS[name]


def decide(owner: str, *, run_as: str = "owner", agent_uid: int = 0, allow_root: bool = False):  # type: ignore[no-untyped-def]
    return resolve(
        owner,
        run_as=run_as,
        node="gpu-7",
        allow_root_jobs=allow_root,
        agent_uid=agent_uid,
        getpwnam=getpwnam,
        getgrouplist=getgrouplist,
    )


ALICE = Identity("alice", 1001, 1001, (1001, 27, 44), "/home/alice", "/bin/bash", switch=True)


@pytest.mark.parametrize(
    ("owner", "run_as", "agent_uid", "allow_root", "expected"),
    [
        # agent mode: whoever owns it, the agent's user runs it, as before
        ("alice", "agent", 0, False, None),
        ("root", "agent", 0, False, None),
        ("nobody-here", "agent", 1001, False, None),
        # owner mode, a root agent: the owner's uid, gid and groups
        ("alice", "owner", 0, False, ALICE),
        (
            "bob",
            "owner",
            0,
            False,
            Identity("bob", 1002, 1002, (1002,), "/home/bob", "/bin/sh", switch=True),
        ),
        # root's jobs only with allow_root_jobs
        ("root", "owner", 0, True, Identity("root", 0, 0, (0,), "/root", "/bin/bash", True)),
        # an agent that is not root runs its own user's jobs, without switching
        (
            "alice",
            "owner",
            1001,
            False,
            Identity("alice", 1001, 1001, (1001, 27, 44), "/home/alice", "/bin/bash", False),
        ),
    ],
)
def test_whom_an_attempt_runs_as(owner, run_as, agent_uid, allow_root, expected):  # type: ignore[no-untyped-def]
    assert decide(owner, run_as=run_as, agent_uid=agent_uid, allow_root=allow_root) == expected


@pytest.mark.parametrize(
    ("owner", "agent_uid", "allow_root", "says"),
    [
        ("carol", 0, False, "owner carol is not a user on node gpu-7"),
        ("bad\0name", 0, False, "is not a user on node gpu-7"),
        ("root", 0, False, "owner root is root, and node gpu-7 does not run root's jobs"),
        ("root", 0, False, "allow_root_jobs is false"),
        # a non-root agent: someone else's job, root's included even when allowed
        ("bob", 1001, False, "runs only alice's jobs, not bob's"),
        ("root", 1001, True, "runs only alice's jobs, not root's"),
        ("carol", 1001, False, "owner carol is not a user on node gpu-7"),
    ],
)
def test_jobs_that_cannot_run_as_their_owner_are_refused_with_the_reason(  # type: ignore[no-untyped-def]
    owner, agent_uid, allow_root, says, monkeypatch
):
    monkeypatch.setattr("ebbtide.workers.runas.user_name", lambda uid: "alice")
    with pytest.raises(RunAsRefused) as caught:
        decide(owner, agent_uid=agent_uid, allow_root=allow_root)
    assert says in str(caught.value)


def test_an_unknown_run_as_is_an_error() -> None:
    with pytest.raises(ValueError, match="not one of owner, agent"):
        decide("alice", run_as="nobody")


def test_the_shim_is_told_to_switch_only_when_the_agent_must() -> None:
    assert ALICE.shim_args() == [
        "--user",
        "alice",
        "--uid",
        "1001",
        "--gid",
        "1001",
        "--groups",
        "1001,27,44",
        "--home",
        "/home/alice",
    ]
    own = Identity("alice", 1001, 1001, (1001,), "/home/alice", "/bin/bash", switch=False)
    assert own.shim_args() == []


AGENT_ENV = {
    "PATH": "/opt/agent/bin:/usr/bin",
    "LANG": "C.UTF-8",
    "LC_TIME": "en_GB.UTF-8",
    "TZ": "Europe/Paris",
    "HOME": "/root",
    "USER": "root",
    "EBBTIDE_DB_URL": "postgresql://ebb:s3cret@db/ebbtide",
    "EBBTIDE_REDIS_URL": "redis://:s3cret@redis:6379/0",
    "PGPASSWORD": "s3cret",
    "AWS_SECRET_ACCESS_KEY": "s3cret",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "PYTHONPATH": "/opt/agent/lib",
}


def test_an_owner_mode_environment_holds_nothing_of_the_agents_but_path_and_locale() -> None:
    env = base_env(ALICE, {"MINE": "1"}, AGENT_ENV)
    assert env == {
        "PATH": "/opt/agent/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_TIME": "en_GB.UTF-8",
        "TZ": "Europe/Paris",
        "MINE": "1",
        "HOME": "/home/alice",
        "USER": "alice",
        "LOGNAME": "alice",
        "SHELL": "/bin/bash",
    }


def test_the_jobs_path_wins_and_its_login_variables_do_not() -> None:
    job = {"PATH": "/home/alice/bin:/usr/bin", "HOME": "/root", "USER": "root"}
    env = base_env(ALICE, job, AGENT_ENV)
    assert env["PATH"] == "/home/alice/bin:/usr/bin"
    assert (env["HOME"], env["USER"]) == ("/home/alice", "alice")
    assert base_env(ALICE, {}, {})["PATH"] == DEFAULT_PATH


def test_the_agents_path_goes_to_the_shim_whole_for_it_to_trim_as_the_owner() -> None:
    """Which of the agent's directories the owner can search is the kernel's to say, as
    the owner (ACLs, links, root squashed on NFS): the shim's child decides it just before
    the job's exec, never the agent from mode bits, nor in its loop."""
    agent_path = "/root/.venv/bin:bin:/usr/bin"
    assert base_env(ALICE, {}, {"PATH": agent_path})["PATH"] == agent_path
    assert trims_path(ALICE, {})
    mine = {"PATH": "/root/.venv/bin:bin"}  # the job's own PATH is kept as given
    assert base_env(ALICE, mine, {"PATH": agent_path})["PATH"] == "/root/.venv/bin:bin"
    assert not trims_path(ALICE, mine)
    assert not trims_path(None, {})  # agent mode: the agent's user, its PATH as before


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory under ``/tmp`` (which everyone can search), not pytest's 0700 one."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="ebbtest-") as d:
        yield Path(d)


def test_the_shim_keeps_the_absolute_directories_there_are_once_each(shared_tmp: Path) -> None:
    """Run as the test's own user (whom the kernel lets search what it lets it): what
    is not a directory, not absolute or a repeat goes; none left: the default."""
    a, b = shared_tmp / "a", shared_tmp / "b"
    a.mkdir()
    b.mkdir()
    (shared_tmp / "file").write_text("")
    given = f"{a}:bin:.::{shared_tmp / 'missing'}:{shared_tmp / 'file'}:{b}:{a}"
    assert shim.searchable_path(given) == f"{a}:{b}"
    assert shim.searchable_path("relative:") == DEFAULT_PATH
    assert shim.searchable_path("") == DEFAULT_PATH
    assert shim.DEFAULT_PATH == DEFAULT_PATH


def test_the_attempts_environment_as_its_owner(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("os.environ", dict(AGENT_ENV))
    env = env_for(
        JobSpec(command=["true"], env={"MINE": "1"}),
        JobRow(),
        1,
        node="n1",
        devices=[],
        ckpt_dir=tmp_path,
        status_path=tmp_path / "status.jsonl",
        identity=ALICE,
    )
    assert not any("s3cret" in v for v in env.values())
    assert not {"EBBTIDE_DB_URL", "EBBTIDE_REDIS_URL", "SSH_AUTH_SOCK", "PYTHONPATH"} & set(env)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/home/alice", "alice", "alice")
    assert env["MINE"] == "1" and env["EBBTIDE_JOB_ID"] == "7"
    assert env["EBBTIDE_CHECKPOINT_DIR"] == str(tmp_path)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/data/ckpt", "/data/ckpt"),
        ("~", "/home/alice"),
        ("~/ckpt", "/home/alice/ckpt"),
        ("runs/a", "/home/alice/runs/a"),
    ],
)
def test_a_path_the_job_names_is_its_owners(given: str, expected: str) -> None:
    assert job_path(given, ALICE) == Path(expected)


def test_a_path_the_job_names_is_the_agents_in_agent_mode(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOME", "/srv/agent")
    assert job_path("~/ckpt", None) == Path("/srv/agent/ckpt")
    assert job_path("runs/a", None) == Path("runs/a")


def test_a_root_agent_running_jobs_as_itself_runs_only_roots_jobs() -> None:
    """``ebb up``/``ebb worker --run-as agent`` as root: another user's job (which could
    reach its store through ``ebb server``) would be a root shell; it is refused."""

    def getpwnam(name: str) -> pwd.struct_passwd:
        uid = {"root": 0, "alice": 1000}[name]
        return pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", "/bin/sh"))

    common = dict(run_as="agent", node="n1", allow_root_jobs=False, getpwnam=getpwnam)
    assert resolve("root", agent_uid=0, others_as_agent=False, **common) is None
    with pytest.raises(RunAsRefused, match="runs only root's jobs, not alice's"):
        resolve("alice", agent_uid=0, others_as_agent=False, **common)
    with pytest.raises(RunAsRefused):
        resolve("ghost", agent_uid=0, others_as_agent=False, **common)
    assert resolve("alice", agent_uid=0, others_as_agent=True, **common) is None  # library
    assert resolve("alice", agent_uid=1000, others_as_agent=False, **common) is None


@pytest.mark.parametrize("run_as", ["owner", "agent"])
@pytest.mark.parametrize("agent_uid", [0, 1001])
@pytest.mark.parametrize("allow_root", [False, True])
@pytest.mark.parametrize("others_as_agent", [False, True])
def test_what_the_heartbeat_says_a_node_runs_agrees_with_what_it_runs(  # type: ignore[no-untyped-def]
    run_as, agent_uid, allow_root, others_as_agent, monkeypatch
):
    """The heartbeat's summary (``jobs_run_here``) refuses an owner exactly when the
    node's own decision at the start (``resolve``) would, for owners who are users there."""
    monkeypatch.setattr("ebbtide.workers.runas.user_name", lambda uid: "alice")
    runs = jobs_run_here(
        run_as, agent_uid=agent_uid, allow_root_jobs=allow_root, others_as_agent=others_as_agent
    )
    for owner in USERS:
        try:
            resolve(
                owner,
                run_as=run_as,
                node="gpu-7",
                allow_root_jobs=allow_root,
                agent_uid=agent_uid,
                others_as_agent=others_as_agent,
                getpwnam=getpwnam,
                getgrouplist=getgrouplist,
            )
            runs_it = True
        except RunAsRefused:
            runs_it = False
        assert (refuses(runs, owner) is None) == runs_it, (runs, owner)


def test_pods_run_anyones_jobs_and_an_older_agent_says_nothing() -> None:
    assert (
        jobs_run_here(
            "owner",
            agent_uid=1001,
            allow_root_jobs=False,
            others_as_agent=False,
            runs_processes=False,
        )
        == "any"
    )
    assert refuses(None, "root") is None
    assert refuses("", "alice") is None
    assert refuses("something-newer", "alice") is None
    assert refuses("user:bob", "alice") == "runs only bob's jobs"
    assert refuses("users", "root") == "does not run root's jobs (allow_root_jobs is false)"


def test_permission_denied_says_where_a_linked_program_cannot_be_reached(tmp_path: Path) -> None:
    """A trial's trap: a virtual environment made from root's own Python put a link into
    root's 0700 home on the agent's PATH, and each job said only "Permission denied"."""
    secret = tmp_path / "root-home" / ".pyenv" / "bin"
    secret.mkdir(parents=True)
    (secret / "python3.11").write_text("#!/bin/sh\n")
    (secret / "python3.11").chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(secret / "python3.11")
    locked = str(tmp_path / "root-home")

    def access(path: str, mode: int) -> bool:  # as the job's user: root's home is 0700
        return not (path == locked or path.startswith(locked + "/"))

    path = f"/nonexistent:{venv}"
    assert shim.denied_hint("python", path, access) == (
        f" ({venv / 'python'} is a link to {secret / 'python3.11'}, and this user cannot "
        f"pass {locked})"
    )
    assert shim.denied_hint(str(venv / "python"), "", access).endswith(f"cannot pass {locked})")
    (tmp_path / "plain").write_text("data\n")  # not a link, not executable to the user
    plain = str(tmp_path / "plain")
    hint = shim.denied_hint(plain, "", lambda p, m: not p.endswith("plain"))
    assert hint == f" ({plain}: this user may not execute {plain})"
    assert shim.denied_hint("python", path) == ""  # nothing refused: not that
