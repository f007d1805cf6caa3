"""Under ``ebb up`` (``own_python``), an attempt started by an agent that runs from a
virtual environment finds that environment's Python first, as if it were activated
(``ebb up`` started as ``.venv/bin/ebb up``: the README's first ``qsub`` example runs
``python`` and imports the SDK).  Other agents (``ebb worker``) leave PATH as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ebbtide.queue.spec import JobSpec
from ebbtide.workers.launch import env_for
from ebbtide.workers.runas import Identity
from tests.unit.builders import JobRow


def _env(tmp_path: Path, spec: JobSpec, **kw: object) -> dict[str, str]:
    return env_for(
        spec,
        JobRow(),
        1,
        node="n1",
        devices=[],
        ckpt_dir=tmp_path,
        status_path=tmp_path / "status.jsonl",
        **{"own_python": True, **kw},  # type: ignore[arg-type]
    )


@pytest.fixture
def venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    prefix = tmp_path / "venv"
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("PYTHONHOME", "/elsewhere")
    return prefix


def test_the_agents_virtual_environment_comes_first(venv: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, JobSpec(command=["python", "job.py"]))
    assert env["PATH"].split(os.pathsep) == [
        str(venv / "bin"),
        "/usr/local/bin",
        "/usr/bin",
        "/bin",
    ]
    assert env["VIRTUAL_ENV"] == str(venv)
    assert "PYTHONHOME" not in env


def test_a_path_already_holding_it_is_left_alone(
    venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"/usr/bin:{venv / 'bin'}")
    env = _env(tmp_path, JobSpec(command=["true"]))
    assert env["PATH"] == f"/usr/bin:{venv / 'bin'}"
    assert "VIRTUAL_ENV" not in env or env["VIRTUAL_ENV"] != str(venv)


def test_the_jobs_own_path_wins(venv: Path, tmp_path: Path) -> None:
    # qsub -V (or -v PATH=...) brings the submitter's PATH: it is what the job asked for
    env = _env(tmp_path, JobSpec(command=["true"], env={"PATH": "/opt/mine/bin:/usr/bin"}))
    assert env["PATH"] == "/opt/mine/bin:/usr/bin"


def test_an_agent_with_no_path_keeps_the_shells_search(
    venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a review's find: the job's PATH was the venv alone, and `ls` was not found
    monkeypatch.delenv("PATH")
    env = _env(tmp_path, JobSpec(command=["ls"]))
    assert env["PATH"] == os.pathsep.join((str(venv / "bin"), os.defpath))
    done = subprocess.run(["/bin/sh", "-c", "ls /"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr


def test_only_ebb_up_activates_it(venv: Path, tmp_path: Path) -> None:
    # ebb worker (a host's own Pythons, conda, a pipx install of ebbtide): PATH as it is
    env = _env(tmp_path, JobSpec(command=["true"]), own_python=False)
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and "VIRTUAL_ENV" not in env


def test_no_virtual_environment_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _env(tmp_path, JobSpec(command=["true"]))["PATH"] == "/usr/bin:/bin"


def test_a_pod_and_an_owner_get_nothing_of_the_agents(venv: Path, tmp_path: Path) -> None:
    pod = _env(tmp_path, JobSpec(command=["true"]), inherit_env=False)
    assert "PATH" not in pod and "VIRTUAL_ENV" not in pod
    me = Identity("alice", 1000, 1000, (1000,), "/home/alice", "/bin/sh", switch=True)
    owner = _env(tmp_path, JobSpec(command=["true"]), identity=me)
    assert str(venv / "bin") not in owner["PATH"].split(os.pathsep)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run outside a venv")
def test_python_on_the_jobs_path_imports_ebbtide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the trap itself: ebb up started without activating its environment
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = _env(tmp_path, JobSpec(command=["python", "-c", "import ebbtide"]))
    done = subprocess.run(["python", "-c", "import ebbtide"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("command", "own"), [("up", True), ("worker", False)])
def test_ebb_up_asks_for_it_and_ebb_worker_does_not(
    command: str, own: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    import ebbtide.runtime
    from ebbtide.cli.main import cli

    asked: dict[str, object] = {}

    def build(*args: object, **kwargs: object) -> None:
        asked.update(kwargs)
        raise SystemExit(0)  # no need to run it

    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ebbtide.runtime, "build", build)
    CliRunner().invoke(cli, [command, "--devices", "1x80GiB", "--node", "n1"])
    assert asked["own_python"] is own
