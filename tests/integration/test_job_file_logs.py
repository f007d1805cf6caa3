"""``Client.logs`` and ``GET /v1/jobs/{id}/logs`` of a job that sent its output to files
it named (``-o``/``-e``, ``--output``): read from the file each attempt wrote, only if it
is a plain file of the job's owner; a missing file is a note, never a traceback.

Giving files to other users needs root; these tests skip without it."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ebbtide.api.app import create_app
from ebbtide.attempt_logs import NoLogYet
from ebbtide.client import Client
from ebbtide.clock import FakeClock
from ebbtide.config.settings import Settings
from ebbtide.errors import UserError
from ebbtide.identity import Caller
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from tests.serving import serving

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other users needs root")

NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'ebbtide.db'}", clock=FakeClock())
    yield s
    s.close()


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"EBBTIDE_HOME": str(tmp_path / "home")})


def _job(store: Store, owner: str, out: Path | None, err: Path | None = None) -> int:
    """A job whose output went to ``out``/``err`` (as its agent records them), started."""
    spec = JobSpec(command=["x"], stdout="out-%j.log", stderr="err-%j.log" if err else None)
    [job_id] = store.submit(spec, owner, defaults_deadline_s=30.0)
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
    )
    kept = f"/var/lib/ebbtide/logs/{job_id}/{attempt}"  # the agent's home, not ours
    store.mark_started(
        job_id,
        attempt,
        pid=1,
        stdout_path=str(out) if out else f"{kept}/stdout.log",
        stderr_path=str(err) if err else f"{kept}/stderr.log",
    )
    return job_id


def test_the_file_the_job_named_is_read_and_named(store: Store, tmp_path: Path) -> None:
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    out.write_text("step 1\nstep 2\n")
    err.write_text("a warning\n")
    job_id = _job(store, "root", out, err)
    with Client(_settings(tmp_path), store=store) as client:
        tail = client.log_tail(job_id)
        assert (tail.text, tail.path, tail.size) == ("step 1\nstep 2\n", str(out), 14)
        assert client.logs(job_id, stderr=True) == "a warning\n"
        assert client.log_tail(job_id, tail_bytes=7).text == "step 2\n"
        assert client.handle(job_id).logs() == "step 1\nstep 2\n"  # JobHandle.logs()


def test_stderr_with_stdout_reads_the_one_file(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "slurm-1.out"
    out.write_text("both\n")
    job_id = _job(store, "root", out, out)  # -j oe, or Slurm's default
    with Client(_settings(tmp_path), store=store) as client:
        assert client.log_tail(job_id, stderr=True).path == str(out)


def test_a_missing_file_or_an_attempt_not_started_is_nothing_yet(
    store: Store, tmp_path: Path
) -> None:
    job_id = _job(store, "root", tmp_path / "never-written.log")
    [waiting] = store.submit(JobSpec(command=["x"], stdout="o.log"), "root", defaults_deadline_s=1)
    store.dispatch(
        waiting, expected_attempts=0, node="n", devices=(0,), compute_pct=1, memory_mib=1
    )
    with Client(_settings(tmp_path), store=store) as client:
        with pytest.raises(NoLogYet, match=r"never-written.log, which is not there \(no output"):
            client.logs(job_id)
        with pytest.raises(NoLogYet, match="attempt 1 has not started yet; its stdout will go"):
            client.logs(waiting)


def test_dev_null_says_nothing_was_kept(store: Store, tmp_path: Path) -> None:
    job_id = _job(store, "root", Path(os.devnull))
    with (
        Client(_settings(tmp_path), store=store) as client,
        pytest.raises(UserError, match="sent its stdout to /dev/null: nothing was kept"),
    ):
        client.logs(job_id)


def test_links_fifos_and_other_users_files_are_not_shown(store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("someone else's\n")
    os.chown(secret, 54321, 54321)
    link = tmp_path / "link.log"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with Client(_settings(tmp_path), store=store) as client:
        for path, says in (
            (link, "not a plain file now"),
            (fifo, "not a plain file now"),  # never opened: that would block
            (secret, "belongs to uid 54321, not root"),
        ):
            job_id = _job(store, "root", path)
            with pytest.raises(UserError, match=says) as err:
                client.logs(job_id)
            assert "someone else" not in str(err.value)


def test_a_server_shows_only_the_owners_files_not_its_own(store: Store, tmp_path: Path) -> None:
    """``ebb server`` runs as root: a file of root's the job's owner (here ``nobody``)
    points its output at is refused, though a client of root's own would read it."""
    mine = tmp_path / "nobodys.log"
    mine.write_text("nobody's output\n")
    os.chown(mine, NOBODY, NOBODY)
    roots = tmp_path / "roots.log"
    roots.write_text("root's file\n")
    theirs, not_theirs = _job(store, "nobody", mine), _job(store, "nobody", roots)
    settings = Settings.from_env(
        {"EBBTIDE_HOME": str(tmp_path / "home"), "EBBTIDE_DB_URL": store.url}
    )
    token = store.tokens.create("nobody", by="root")[1]
    headers = {"Authorization": f"Bearer {token}"}
    with (
        serving(create_app(settings, store=store), tmp_path) as served,
        httpx.Client(base_url=served.url, headers=headers) as http,
    ):
        ok = http.get(f"/v1/jobs/{theirs}/logs").json()
        assert (ok["text"], ok["path"]) == ("nobody's output\n", str(mine))
        refused = http.get(f"/v1/jobs/{not_theirs}/logs")
        assert refused.status_code == 400, refused.text
        assert "belongs to root, not nobody" in refused.json()["detail"]
        assert "root's file" not in refused.text
    as_nobody = Caller("nobody")  # as the server makes its clients
    with (
        Client(settings, store=store, caller=as_nobody) as client,
        pytest.raises(UserError, match="belongs to root, not nobody"),
    ):
        client.logs(not_theirs)
    with Client(settings, store=store) as client:  # root, on this host: reads as itself
        assert client.logs(not_theirs) == "root's file\n"


def test_a_pods_output_is_its_kept_log(store: Store, tmp_path: Path) -> None:
    """Under Kubernetes the agent records the attempt's own log even for ``-o``: its
    pod's log is kept there."""
    job_id = _job(store, "root", None)
    kept = tmp_path / "home" / "logs" / str(job_id) / "1"
    kept.mkdir(parents=True)
    (kept / "stdout.log").write_text("from the pod\n")
    with Client(_settings(tmp_path), store=store) as client:
        tail = client.log_tail(job_id)
        assert (tail.text, tail.path) == ("from the pod\n", None)
