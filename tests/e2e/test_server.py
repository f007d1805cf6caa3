"""End to end: real ``ebb server`` processes, called by real Unix users.

Two servers share one store: one on a Unix socket (callers known by the kernel), one on
TCP (callers known by their tokens).  ``ebbtest-alice`` owns a running job (with output,
and a secret in its environment); ``ebbtest-bob`` may not cancel, hold or release it,
read its environment or its logs — through the CLI, the SDK, the HTTP API with his token,
or the socket; alice may, and so may ``ebbtest-carol``, an admin by the policy.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from tests.e2e.helpers import REPO, ebb, ebb_env, start, stop, wait_for
from tests.users import ALICE, BOB, CAROL, User, _unavailable, real_user, require_root

pytestmark = pytest.mark.e2e

SECRET = "hunter2-e2e"
DENIED = f"belongs to {ALICE}"

#: run by each user through the SDK: every action on the jobs given, and what came of it
SDK_SCRIPT = """
import json, sys
from ebbtide import Client
running, queued = int(sys.argv[1]), int(sys.argv[2])
out = {}
def attempt(name, action):
    try:
        out[name] = ["ok", action()]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
with Client() as c:
    attempt("user", lambda: c.user)
    attempt("env", lambda: json.loads(c.get(running).spec_json)["env"])
    attempt("logs", lambda: c.logs(running))
    attempt("hold", lambda: c.hold(queued).state)
    attempt("release", lambda: c.release(queued).state)
    attempt("cancel", lambda: c.cancel(queued).state)
print(json.dumps(out))
"""

#: run by each user on the socket itself, no SDK, no token: the status of each request
SOCKET_SCRIPT = """
import json, sys
import httpx
running, queued = sys.argv[2], sys.argv[3]
transport = httpx.HTTPTransport(uds=sys.argv[1])
with httpx.Client(transport=transport, base_url="http://ebbtide/v1") as http:
    job = http.get(f"/jobs/{running}").json()
    out = {
        "whoami": http.get("/whoami").json()["user"],
        "env": job["spec"]["env"],
        "logs": http.get(f"/jobs/{running}/logs").status_code,
        "hold": http.post(f"/jobs/{queued}/hold").status_code,
        "release": http.post(f"/jobs/{queued}/release").status_code,
        "cancel": http.post(f"/jobs/{queued}/cancel").status_code,
    }
print(json.dumps(out))
"""


@dataclass
class Fleet:
    root: Path
    home: Path
    socket: Path
    url: str
    tokens: dict[str, str]
    users: dict[str, User]
    python: list[str]
    python_env: dict[str, str]
    #: alice's running job, with output and a secret in its environment
    running: int = 0

    def env_of(self, user: User, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
        return {**user.env(base), **self.python_env, "PYTHONUNBUFFERED": "1", **extra}

    def run_as(self, name: str, argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
        user = self.users[name]
        return subprocess.run(
            argv,
            env=self.env_of(user, **extra),
            cwd=self.root,
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def ebb_as(self, name: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """``ebb ARGS`` as ``name``, through the Unix socket."""
        argv = [*self.python, "-m", "ebbtide.cli.main", *args]
        proc = self.run_as(name, argv, EBBTIDE_URL=f"unix://{self.socket}", **extra)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def submit_as(self, name: str, *args: str) -> int:
        proc = self.ebb_as(name, "qsub", "--json", *args, "--", "sleep", "1000")
        assert proc.returncode == 0, proc.stderr
        return int(json.loads(proc.stdout)["id"])

    def http(self, name: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[name]}"}
        return httpx.Client(base_url=self.url + "/v1", headers=headers, timeout=30)


def _python_for(user: User) -> tuple[list[str], dict[str, str]]:
    """A Python the test users can run with this checkout's packages: the one running
    the tests where they may run it (as in CI), else the system's of the same version
    with the packages on PYTHONPATH (a virtual environment made from a Python under a
    private home, as /root/.pyenv, is not theirs to run)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = f"{sysconfig.get_paths()['purelib']}{os.pathsep}{REPO / 'src'}"
    candidates = [([sys.executable], {})]
    candidates += [([p], {"PYTHONPATH": path}) for p in (f"/usr/bin/python{version}",)]
    for argv, env in candidates:
        try:
            proc = subprocess.run(
                [*argv, "-c", "import ebbtide.cli.main, httpx"],
                env={**os.environ, **env},
                user=user.uid,
                group=user.gid,
                extra_groups=[],
                cwd="/",
                capture_output=True,
                timeout=60,
            )
        except OSError:
            continue
        if proc.returncode == 0:
            return argv, env
    _unavailable(f"no Python {version} with ebbtide's packages that {user.name} may run")
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    require_root()
    users = {name: real_user(name) for name in (ALICE, BOB, CAROL)}
    python, python_env = _python_for(users[BOB])
    # under /tmp, reachable by the test users (pytest's own tmp dirs may be 0700)
    root = Path(tempfile.mkdtemp(prefix="ebb-server-", dir="/tmp"))
    os.chmod(root, 0o755)
    home = root / "home"
    (root / "policy.yaml").write_text(f"admins: [{CAROL}]\n")
    env = ebb_env(home, EBBTIDE_POLICY=str(root / "policy.yaml"))
    sock, port = root / "api.sock", _free_port()
    servers = [
        start(env, "server", "--socket", str(sock), log=root / "socket-server.log"),
        start(env, "server", "--listen", f"127.0.0.1:{port}", log=root / "tcp-server.log"),
    ]
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: sock.exists() and _answers(url), 30, "both servers")
        # a trial's trap: a mistyped EBBTIDE_HOME served an empty store, unnamed
        assert (
            f"ebb server: store sqlite:///{home}/ebbtide.db"
            in (root / "tcp-server.log").read_text()
        )
        tokens = {}
        for name in users:
            made = json.loads(ebb(env, "token", "create", name, "--json", "--note", "e2e").stdout)
            tokens[name] = made["token"]
        fleet = Fleet(root, home, sock, url, tokens, users, python, python_env)
        fleet.running = _running_job_with_output(fleet)
        yield fleet
    finally:
        for server in servers:
            stop(server)
        shutil.rmtree(root, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/whoami").status_code == 401
    except httpx.TransportError:
        return False


def _running_job_with_output(fleet: Fleet) -> int:
    """Alice submits a job; the test plays the scheduler and the node agent: it runs, and
    has written to its log."""
    job_id = fleet.submit_as(ALICE, "-v", f"SECRET={SECRET}")
    store = Store(f"sqlite:///{fleet.home / 'ebbtide.db'}")
    try:
        attempt = store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
        )
        store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    finally:
        store.close()
    logs = fleet.home / "logs" / str(job_id) / str(attempt)
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text("step 1\n")
    return job_id


# -- the CLI, through the socket -------------------------------------------------------


def test_the_cli_refuses_another_users_job(fleet: Fleet) -> None:
    job = str(fleet.running)
    for command in ("qdel", "qhold", "qrls"):
        proc = fleet.ebb_as(BOB, command, job)
        assert proc.returncode == 1 and DENIED in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1
    proc = fleet.ebb_as(BOB, "logs", job)
    assert proc.returncode == 1 and "read its logs" in proc.stderr and "step" not in proc.stdout
    for args in (["qstat", "--json"], ["events", job], ["qstat", "-f", job, "--json"]):
        proc = fleet.ebb_as(BOB, *args)
        assert proc.returncode == 0 and SECRET not in proc.stdout
    assert json.loads(proc.stdout)["state"] == "running"  # as it was


@pytest.mark.parametrize("actor", [ALICE, CAROL])
def test_the_cli_lets_the_owner_and_an_admin(fleet: Fleet, actor: str) -> None:
    assert fleet.ebb_as(actor, "logs", str(fleet.running)).stdout == "step 1\n"
    queued = str(fleet.submit_as(ALICE))
    for command, state in (("qhold", "held"), ("qrls", "queued"), ("qdel", "cancelled")):
        proc = fleet.ebb_as(actor, command, "--json", queued)
        assert proc.returncode == 0, proc.stderr
        [result] = json.loads(proc.stdout)
        assert (result["id"], result["ok"], result["state"]) == (int(queued), True, state)
    [*_, cancelled] = json.loads(fleet.ebb_as(BOB, "events", queued, "--json").stdout)
    assert cancelled["by"] == actor
    assert cancelled["via"].startswith(f"socket uid {fleet.users[actor].uid} pid ")


def test_the_cli_submits_as_the_caller_and_runs_where_it_was_submitted(fleet: Fleet) -> None:
    job = fleet.submit_as(BOB)
    data = json.loads(fleet.ebb_as(BOB, "qstat", "-f", str(job), "--json").stdout)
    assert data["owner"] == BOB
    with fleet.http(BOB) as http:
        assert http.get(f"/jobs/{job}").json()["spec"]["cwd"] == str(fleet.root)


def test_only_an_admin_acts_for_another_user(fleet: Fleet) -> None:
    refused = fleet.ebb_as(BOB, "qsub", "--", "true", EBBTIDE_USER=ALICE)
    assert refused.returncode == 1 and "only admins may act for another user" in refused.stderr
    proc = fleet.ebb_as(CAROL, "qsub", "--json", "--", "true", EBBTIDE_USER=ALICE)
    job = json.loads(proc.stdout)["id"]
    [submitted] = json.loads(fleet.ebb_as(ALICE, "events", str(job), "--json").stdout)
    assert (submitted["owner"], submitted["by"], submitted["for"]) == (ALICE, CAROL, ALICE)


def test_only_admins_issue_tokens(fleet: Fleet) -> None:
    proc = fleet.ebb_as(BOB, "token", "create", BOB)
    assert proc.returncode == 1 and "only admins may manage tokens" in proc.stderr
    assert not Path(fleet.users[BOB].home, ".ebbtide").exists()  # refused before any store


# -- the SDK, through the socket -------------------------------------------------------


def _sdk(fleet: Fleet, name: str, queued: int) -> dict[str, Any]:
    argv = [*fleet.python, "-c", SDK_SCRIPT, str(fleet.running), str(queued)]
    proc = fleet.run_as(name, argv, EBBTIDE_URL=f"unix://{fleet.socket}")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_the_sdk_refuses_another_users_job(fleet: Fleet) -> None:
    out = _sdk(fleet, BOB, fleet.running)
    assert out["user"] == ["ok", BOB]
    assert out["env"] == ["ok", {"SECRET": "***"}]
    for action in ("logs", "hold", "release", "cancel"):
        assert out[action][0] == "PermissionDenied", out


@pytest.mark.parametrize("actor", [ALICE, CAROL])
def test_the_sdk_lets_the_owner_and_an_admin(fleet: Fleet, actor: str) -> None:
    out = _sdk(fleet, actor, fleet.submit_as(ALICE))
    assert out["env"] == ["ok", {"SECRET": SECRET}]
    assert out["logs"] == ["ok", "step 1\n"]
    assert [out[a] for a in ("hold", "release", "cancel")] == [
        ["ok", "held"],
        ["ok", "queued"],
        ["ok", "cancelled"],
    ]


# -- the HTTP API, with tokens ---------------------------------------------------------


def test_the_api_with_a_token_refuses_another_users_job(fleet: Fleet) -> None:
    job = fleet.running
    with fleet.http(BOB) as bob:
        assert bob.get("/whoami").json()["user"] == BOB
        assert bob.get(f"/jobs/{job}").json()["spec"]["env"] == {"SECRET": "***"}
        assert SECRET not in bob.get("/jobs").text
        for method, path in [
            ("POST", f"/jobs/{job}/cancel"),
            ("POST", f"/jobs/{job}/hold"),
            ("POST", f"/jobs/{job}/release"),
            ("GET", f"/jobs/{job}/logs"),
        ]:
            response = bob.request(method, path)
            assert response.status_code == 403, (path, response.text)
            assert "step 1" not in response.text
    with httpx.Client(base_url=fleet.url + "/v1") as anonymous:
        assert anonymous.get(f"/jobs/{job}").status_code == 401  # TCP: no token, no entry


@pytest.mark.parametrize("actor", [ALICE, CAROL])
def test_the_api_with_a_token_lets_the_owner_and_an_admin(fleet: Fleet, actor: str) -> None:
    queued = fleet.submit_as(ALICE)
    with fleet.http(actor) as http:
        assert http.get(f"/jobs/{fleet.running}").json()["spec"]["env"] == {"SECRET": SECRET}
        assert http.get(f"/jobs/{fleet.running}/logs").json()["text"] == "step 1\n"
        for action, state in (("hold", "held"), ("release", "queued"), ("cancel", "cancelled")):
            response = http.post(f"/jobs/{queued}/{action}")
            assert response.status_code == 200 and response.json()["state"] == state
        [*_, last] = http.get(f"/jobs/{queued}/events").json()
        assert last["by"] == actor and last["via"].startswith("token ")


# -- the socket itself -----------------------------------------------------------------


def _on_socket(fleet: Fleet, name: str, queued: int) -> dict[str, Any]:
    argv = [*fleet.python, "-c", SOCKET_SCRIPT, str(fleet.socket), str(fleet.running)]
    proc = fleet.run_as(name, [*argv, str(queued)])
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_the_socket_knows_each_user(fleet: Fleet) -> None:
    bob = _on_socket(fleet, BOB, fleet.running)
    assert bob == {
        "whoami": BOB,
        "env": {"SECRET": "***"},
        "logs": 403,
        "hold": 403,
        "release": 403,
        "cancel": 403,
    }
    for actor in (ALICE, CAROL):
        out = _on_socket(fleet, actor, fleet.submit_as(ALICE))
        assert out == {
            "whoami": actor,
            "env": {"SECRET": SECRET},
            "logs": 200,
            "hold": 200,
            "release": 200,
            "cancel": 200,
        }


def test_the_running_job_survived_everything_bob_tried(fleet: Fleet) -> None:
    with fleet.http(ALICE) as alice:
        job = alice.get(f"/jobs/{fleet.running}").json()
    assert job["state"] == "running" and job["owner"] == ALICE


def test_a_server_that_cannot_listen_says_why_in_one_line(tmp_path: Path) -> None:
    env = ebb_env(tmp_path / "home")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = ebb(env, "server", "--listen", f"127.0.0.1:{port}", check=False)
    assert busy.returncode == 1 and "address is in use" in busy.stderr
    (tmp_path / "file").write_text("")
    for path, says in [(tmp_path / "file", "is not a socket"), (tmp_path / "no/a.sock", "cannot")]:
        proc = ebb(env, "server", "--socket", str(path), check=False)
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_logs_of_a_file_the_job_named_are_its_owners_alone(fleet: Fleet) -> None:
    """Alice's job sent its output to a file in a directory of hers (``-o``): the root
    server shows it to her, says which file, and shows nothing when she swaps the file
    for a link to root's, or the directory for one of root's."""
    alice = fleet.users[ALICE]
    mine = fleet.root / "alices-dir"
    mine.mkdir()
    os.chown(mine, alice.uid, alice.gid)
    store = Store(f"sqlite:///{fleet.home / 'ebbtide.db'}")
    try:  # submitted with -o; the node agent records where the attempt's output went
        spec = JobSpec(command=["true"], stdout="alices-dir/out-%j.log", cwd=str(fleet.root))
        [job] = store.submit(spec, ALICE, defaults_deadline_s=30)
        out = mine / f"out-{job}.log"
        attempt = store.dispatch(
            job, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
        )
        store.mark_started(job, attempt, pid=1, stdout_path=str(out), stderr_path="e")
    finally:
        store.close()
    missing = fleet.ebb_as(ALICE, "logs", str(job))
    assert missing.returncode == 1 and f"{out}, which is not there" in missing.stderr
    out.write_text("alice's output\n")
    os.chown(out, alice.uid, alice.gid)
    shown = fleet.ebb_as(ALICE, "logs", str(job))
    assert shown.stdout == "alice's output\n"
    assert f"ebb: job {job} attempt 1: stdout from {out}" in shown.stderr
    assert fleet.ebb_as(BOB, "logs", str(job)).returncode == 1

    secret = fleet.root / "roots-dir"
    secret.mkdir()
    (secret / out.name).write_text("root's secret\n")  # root's, as the server is
    out.unlink()
    out.symlink_to(secret / out.name)  # a link at the end
    refused = fleet.ebb_as(ALICE, "logs", str(job))
    assert refused.returncode == 1 and "not a plain file now" in refused.stderr
    out.unlink()
    mine.rmdir()
    mine.symlink_to(secret)  # the directory swapped for root's
    for proc in (fleet.ebb_as(ALICE, "logs", str(job)), fleet.ebb_as(CAROL, "logs", str(job))):
        assert proc.returncode == 1 and f"belongs to root, not {ALICE}" in proc.stderr
        assert "secret" not in proc.stdout
    with fleet.http(ALICE) as http:
        response = http.get(f"/jobs/{job}/logs")
    assert response.status_code == 400 and "root's secret" not in response.text
