"""Published PBS Pro, Torque and Slurm example scripts (``tests/fixtures/scripts``, with
their sources in ``SOURCES.md``) submitted as they are: held, with their names,
walltimes, arrays, GPU counts, queues, accounts and output paths honoured; multi-node
ones refused with the reason; and every PBS or Slurm variable each script reads is in
the environment its job gets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.client import Client
from ebbtide.queue.spec import ArraySpec, JobSpec
from ebbtide.workers.launch import scheduler_env

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
EXPECTED: dict[str, dict[str, Any]] = json.loads((SCRIPTS / "expected.json").read_text())
#: Placeholders the documentation leaves for the reader to fill in.
PLACEHOLDERS = {"[budget code]": "budget1"}
#: Scripts that need more than one node or task: refused, as a job runs on one node.
MULTI = {name for name, want in EXPECTED.items() if want.get("nodes", 1) > 1}
MULTI.add("slurm_fasrc-mpi-hello.sh")  # --ntasks=3 on one node


def _policy(path: Path) -> Path:
    queues = {want["queue"] for want in EXPECTED.values() if "queue" in want}
    path.write_text("queues:\n  default: {}\n" + "".join(f"  {q}: {{}}\n" for q in sorted(queues)))
    return path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        "EBBTIDE_HOME": str(tmp_path / "home"),
        "EBBTIDE_POLICY": str(_policy(tmp_path / "policy.yaml")),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _submit(name: str, tmp_path: Path, env: dict[str, str]) -> Any:
    text = (SCRIPTS / name).read_text()
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    script = tmp_path / name
    script.write_text(text)
    args = ["sbatch", "-H"] if name.startswith("slurm_") else ["qsub", "-h"]
    return CliRunner().invoke(cli, [*args, "--json", str(script)], env=env)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_published_script_submits_as_written(
    name: str, tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = _submit(name, tmp_path, env)
    want = EXPECTED[name]
    if name in MULTI:
        assert result.exit_code == 1, result.output
        assert re.search(r"one (node|task)", result.output), result.output
        assert "Traceback" not in result.output
        return
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.stdout)
    with Client() as client:
        job = client.get(submitted["id"])
    spec = JobSpec.model_validate_json(job.spec_json)
    assert job.state == "held"
    if "name" in want:
        assert spec.name == want["name"]
    if "walltime_s" in want:
        assert spec.walltime_s == want["walltime_s"]
    if "gpus" in want:
        assert spec.gpus == want["gpus"]
    if "array" in want:
        first, _, limit = want["array"].partition("%")
        start, _, rest = first.partition("-")
        end, _, step = rest.partition(":")
        assert spec.array is not None
        assert (spec.array.start, spec.array.end) == (int(start), int(end or start))
        assert spec.array.step == int(step or 1)
        assert spec.array.limit == (int(limit) if limit else None)
        assert len(submitted["tasks"]) == len(spec.array.indices())
    for key in ("queue", "account"):
        if key in want:
            assert getattr(spec, key) == PLACEHOLDERS.get(want[key], want[key])
    if "cpus" in want and name.startswith(("pbspro_", "torque_")):
        assert spec.cpus == want["cpus"]
    if "stdout" in want:
        assert spec.stdout is not None and spec.stdout.startswith(want["stdout"])
    if "stderr" in want:
        assert spec.stderr is not None and spec.stderr.startswith(want["stderr"])
    if want.get("join") == "oe":  # stderr with stdout: to its file, else the attempt's log
        assert spec.join == "oe" and spec.stderr == spec.stdout
    if name.startswith("slurm_"):
        assert spec.compat == "slurm"
        assert spec.stdout is not None  # slurm-%j.out unless it says
    # a directive with no effect here is never dropped silently
    for key, word in (("mail_user", "mail"), ("qos", "--qos"), ("group_list", "group_list")):
        if key in want:
            assert any(word in note for note in submitted.get("notes", [])), submitted


@pytest.mark.parametrize(
    "name", sorted(n for n in EXPECTED if n not in MULTI and EXPECTED[n]["vars_read"])
)
def test_the_job_sees_every_scheduler_variable_its_script_reads(
    name: str, tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = _submit(name, tmp_path, env)
    assert result.exit_code == 0, result.output
    with Client() as client:
        job = client.get(json.loads(result.stdout)["id"])
    spec = JobSpec.model_validate_json(job.spec_json)
    if job.array_index is None and spec.array is None:
        # the range is given on the command line (IT4I, VSC, klust): a task as it would be
        job = SimpleNamespace(**{**job.model_dump(), "array_index": 3, "array_id": job.id})
        spec = spec.model_copy(update={"array": ArraySpec(start=1, end=5)})
    env_vars = scheduler_env(spec, job, 1, node="gpu-a", devices=[], nodefile=tmp_path / "nf")
    wanted = [v for v in EXPECTED[name]["vars_read"] if v.startswith(("PBS_", "SLURM_"))]
    missing = [v for v in wanted if not env_vars.get(v)]
    assert not missing, f"{name} reads {missing}, which its job would not have"
