"""End to end: ``ebb qsub`` and ``ebb qstat`` through ``ebb server`` on a Unix socket (the
thin client, :mod:`ebbtide.cli.fast`) do what they do with the store opened directly:
the same output, the same errors, the same jobs; and they load neither SQLAlchemy nor
pydantic, which is where a direct call's time goes.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ebbtide.queue.store import Store
from tests.e2e.helpers import EBB, ebb_env, start, stop, wait_for

pytestmark = pytest.mark.e2e

PBS_SCRIPT = """#!/bin/bash
#PBS -N thin-pbs
#PBS -l walltime=00:10:00
#PBS -l select=1:ncpus=4:ngpus=1:mem=8gb
#PBS -m abe
#PBS -o out-%j.txt
#PBS -J 1-3
echo "$PBS_ARRAY_INDEX"
"""

SLURM_SCRIPT = """#!/bin/bash
#SBATCH --job-name=thin-slurm
#SBATCH --time=5
#SBATCH --gres=gpu:1
srun python train.py
"""

EXPORTING_SCRIPT = """#!/bin/bash
#PBS -V
echo "$THIN_VAR"
"""


@dataclass
class Box:
    root: Path
    direct: dict[str, str]
    thin: dict[str, str]

    def run(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*EBB, *args], env=env, cwd=self.root, capture_output=True, text=True, timeout=60
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def both(self, *args: str) -> tuple[subprocess.CompletedProcess[str], ...]:
        return self.run(self.direct, *args), self.run(self.thin, *args)

    def store(self) -> Store:
        return Store(f"sqlite:///{self.root / 'home' / 'ebbtide.db'}")


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="ebb-thin-"))
    home = root / "home"
    home.mkdir()
    direct = ebb_env(home, THIN_VAR="from-the-client")
    sock = root / "api.sock"
    # the server's own environment differs: what a job copies must be the client's
    server = start(
        {**direct, "THIN_VAR": "from-the-server", "SERVER_ONLY": "server"},
        "server",
        "--socket",
        str(sock),
        log=root / "server.log",
    )
    try:
        wait_for(sock.exists, 30, "ebb server's socket")
        (root / "job.pbs").write_text(PBS_SCRIPT)
        (root / "job.sbatch").write_text(SLURM_SCRIPT)
        (root / "export.sh").write_text(EXPORTING_SCRIPT)
        yield Box(root, direct, {**direct, "EBBTIDE_URL": f"unix://{sock}"})
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


def _spec(box: Box, job_id: int) -> dict[str, object]:
    store = box.store()
    try:
        job = store.get(job_id)
        return {"spec": json.loads(job.spec_json), "queue": job.queue, "name": job.name}
    finally:
        store.close()


def _ids(out: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", out)]


@pytest.mark.parametrize(
    "args",
    [
        ["job.pbs"],
        ["job.sbatch"],
        ["-N", "cmd", "-l", "gpu=25%,gpumem=4GiB", "-p", "5", "-h", "--", "echo", "hi there"],
        ["-V", "-r", "y", "--", "env"],
        ["-v", "THIN_VAR,OTHER=1", "-J", "1-2%1", "export.sh", "arg1"],
        ["export.sh"],
    ],
    ids=["pbs-array", "slurm-script", "command", "export-all", "env-array", "directive-V"],
)
def test_qsub_makes_the_same_job_either_way(box: Box, args: list[str]) -> None:
    direct, thin = box.both("qsub", *args)
    assert direct.returncode == thin.returncode == 0, (direct.stderr, thin.stderr)
    assert direct.stderr == thin.stderr  # the same notes, word for word
    [first], [second] = _ids(direct.stdout), _ids(thin.stdout)
    assert direct.stdout.replace(str(first), "N") == thin.stdout.replace(str(second), "N")
    made, sent = _spec(box, first), _spec(box, second)
    assert made == sent
    env = made["spec"].get("env") or {}  # type: ignore[union-attr]
    assert env.get("THIN_VAR") in (None, "from-the-client")  # never the server's
    assert "SERVER_ONLY" not in env


@pytest.mark.parametrize(
    "args",
    [
        ["-l", "gpumem=4", "--", "true"],
        ["-J", "0-99999999999999999999", "--", "true"],
        ["-q", "nosuchqueue", "--", "true"],
        ["nosuch.sh"],
        ["/dev/null"],
        ["-v", "SERVER_ONLY", "--", "true"],  # set in the server's environment only
        ["-W", "depend=afterok:99999", "--", "true"],
    ],
)
def test_qsub_refuses_the_same_way_either_way(box: Box, args: list[str]) -> None:
    before = _count(box)
    direct, thin = box.both("qsub", *args)
    assert direct.returncode == thin.returncode == 1
    assert direct.stderr == thin.stderr and thin.stderr.startswith("ebb: error: ")
    assert thin.stderr.count("\n") == 1
    assert _count(box) == before  # nothing submitted


def _count(box: Box) -> int:
    store = box.store()
    try:
        return len(store.list_jobs())
    finally:
        store.close()


def test_qstat_shows_the_same_table_either_way(box: Box) -> None:
    box.run(box.direct, "qsub", "-J", "1-20", "-h", "--", "true")
    done = box.run(box.direct, "qsub", "-N", "gone", "-h", "--", "true").stdout.strip()
    box.run(box.direct, "qdel", done)  # finished: listed with -x only
    for args in (
        [],
        ["-t"],
        ["-x"],
        ["-s", "H"],
        ["-s", "QH", "-u", "nobody"],
        ["-s", "queued"],
        ["-s", "paused"],
    ):
        direct, thin = box.both("qstat", *args)
        assert direct.returncode == thin.returncode == 0, (direct.stderr, thin.stderr)
        assert direct.stdout == thin.stdout and direct.stdout.lstrip().startswith("ID NAME")
    assert re.search(r"\d+\[1-20\] true ", thin.stdout) is None  # -s queued: held left out
    assert re.search(r"\d+\[1-20\] true ", box.run(box.thin, "qstat").stdout)
    direct, thin = box.both("qstat", "-s", "X")
    assert direct.returncode == thin.returncode == 1 and direct.stderr == thin.stderr
    # a job queued with no reason and no scheduler: noted either way (a trial's trap:
    # through the server nothing said so)
    box.run(box.direct, "qsub", "--", "true")
    direct, thin = box.both("qstat")
    assert "note: no scheduler is running on this store" in direct.stderr
    assert direct.stderr == thin.stderr


LOADED = """
import sys
from ebbtide.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("sqlalchemy", "pydantic", "sqlmodel", "httpx") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "none", file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("args", [["qsub", "--", "true"], ["qsub", "job.pbs"], ["qstat"]])
def test_the_thin_client_loads_no_heavy_module(box: Box, args: list[str]) -> None:
    def loaded(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EBB[0], "-c", LOADED, *args],
            env=env,
            cwd=box.root,
            capture_output=True,
            text=True,
            timeout=60,
        )

    thin = loaded(box.thin)
    assert thin.returncode == 0, thin.stderr
    assert "HEAVY none" in thin.stderr
    assert "sqlalchemy" in loaded(box.direct).stderr  # what the thin client saves


def test_a_socket_with_no_server_is_one_line(box: Box) -> None:
    env = {**box.direct, "EBBTIDE_URL": f"unix://{box.root / 'nothing.sock'}"}
    for args in (["qsub", "--", "true"], ["qstat"]):
        proc = box.run(env, *args)
        assert proc.returncode == 1
        assert proc.stderr == (
            f"ebb: error: cannot reach the ebb server at unix://{box.root / 'nothing.sock'}: "
            "No such file or directory\n"
        )


class _OldServer(http.server.BaseHTTPRequestHandler):
    """A server from before the thin client's paths: they are not found."""

    def do_POST(self) -> None:
        self._not_found()

    def do_GET(self) -> None:
        self._not_found()

    def _not_found(self) -> None:
        # noted before the answer: the client's next request may be served by another
        # thread as soon as it has this one's
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        body = json.dumps({"detail": "Not Found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_without_the_thin_paths_is_asked_as_the_sdk_asks(tmp_path: Path) -> None:
    """The thin client steps aside for the SDK's remote client (here: its requests show
    it tried, and it failed the SDK's way, since this server knows nothing)."""
    from ebbtide.cli import fast

    sock = tmp_path / "old.sock"

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    server = Server(str(sock), _OldServer)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    saved = os.environ.get("EBBTIDE_URL")
    os.environ["EBBTIDE_URL"] = f"unix://{sock}"
    try:
        assert fast.qsub({}, ["true"], script=None, allow_future=False) is None
        assert fast.qstat_rows([], None) is None
        env = {**ebb_env(tmp_path / "home"), "EBBTIDE_URL": f"unix://{sock}"}
        proc = subprocess.run([*EBB, "qsub", "--", "true"], env=env, capture_output=True, text=True)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
    finally:
        if saved is None:
            os.environ.pop("EBBTIDE_URL", None)
        else:
            os.environ["EBBTIDE_URL"] = saved
        server.shutdown()
        server.server_close()
    paths = server.paths  # type: ignore[attr-defined]
    assert paths[:2] == ["/v1/qsub", "/v1/qstat"]
    assert "/v1/qsub" in paths[2:3] and len(paths) > 3  # the CLI tried, then the SDK
