"""PBS and Slurm scripts as they are in the wild: the directives, what each maps to, the
notes for what has no effect here, and the variables and output paths of the job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ebbtide.cli.main import cli
from ebbtide.errors import SpecError
from ebbtide.queue.qsub import (
    QsubOptions,
    build_spec_kwargs,
    export_env,
    parse_directive_tokens,
    parse_script_directives,
)
from ebbtide.queue.slurm import parse_sbatch_tokens, slurm_time_s
from ebbtide.queue.spec import ArraySpec, JobSpec
from ebbtide.workers.launch import output_path, scheduler_env


def spec_of(text: str, dialect: str = "pbs", **cli: Any) -> tuple[JobSpec, list[str]]:
    notes: list[str] = []
    directives = parse_script_directives(text, source="job.sh", dialect=dialect)
    kwargs = build_spec_kwargs(
        QsubOptions(script=text, **cli), directives, environ={"HOME": "/h"}, notes=notes
    )
    return JobSpec(**kwargs), notes


# -- Slurm --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("15:00", 900),
        ("5:0", 300),
        ("02:00:00", 7200),
        ("1-00:00:00", 86400),
        ("0-0:1", 60),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("0-03:00", 3 * 3600),
    ],
)
def test_slurm_time_forms(text: str, seconds: float) -> None:
    assert slurm_time_s(text) == seconds


def test_slurm_unlimited_time_is_no_walltime_with_a_note() -> None:
    spec, notes = spec_of("#!/bin/sh\n#SBATCH --time=UNLIMITED\ntrue\n", "slurm")
    assert spec.walltime_s is None
    assert any("no walltime" in n for n in notes)


@pytest.mark.parametrize("text", ["1:2:3:4", "abc", "-5", "1-2-3"])
def test_slurm_time_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="expected minutes"):
        slurm_time_s(text)


def test_a_slurm_script_maps_its_directives() -> None:
    spec, notes = spec_of(
        "#!/bin/bash\n"
        "#SBATCH --job-name=train --gres=gpu:a100:2\n"
        "#SBATCH -t 2:00:00\n"
        "#SBATCH --array=0-15:4%2\n"
        "#SBATCH --output=logs/%x-%A_%a.out\n"
        "#SBATCH --signal=B:USR1@120\n"
        "#SBATCH -p default -A ml-team -c 8 --mem=16G\n"
        "#SBATCH --dependency=afterok:12:13,afterany:14\n"
        "#SBATCH -D /data/run --mail-type=END\n"
        "python train.py\n",
        "slurm",
    )
    assert (spec.name, spec.gpus, spec.walltime_s) == ("train", 2, 7200)
    assert spec.array == ArraySpec(start=0, end=15, step=4, limit=2)
    assert spec.stdout == spec.stderr == "logs/%x-%A_%a.out"  # stderr with stdout
    assert (spec.signal, spec.signal_shell_only, spec.deadline_s) == (10, True, 120)
    assert (spec.queue, spec.account, spec.cpus, spec.host_memory_mib) == (
        "default",
        "ml-team",
        8,
        16384,
    )
    assert [(d.kind, d.job_id) for d in spec.depends] == [
        ("afterok", 12),
        ("afterok", 13),
        ("afterany", 14),
    ]
    assert spec.cwd == "/data/run" and spec.compat == "slurm"
    assert any("GPU type 'a100'" in n for n in notes)
    assert any("line 9: --mail-type=END" in n for n in notes)


def test_slurm_defaults_output_to_slurm_jobid_out_and_exports_the_environment() -> None:
    spec, _ = spec_of("#!/bin/sh\n#SBATCH -t 5\ntrue\n", "slurm")
    assert spec.stdout == spec.stderr == "slurm-%j.out"
    assert spec.env == {"HOME": "/h"}  # --export=ALL, Slurm's default
    spec, _ = spec_of("#!/bin/sh\n#SBATCH -a 1-3\n#SBATCH --export=NONE\ntrue\n", "slurm")
    assert spec.stdout == "slurm-%A_%a.out" and spec.env == {}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--nodes=2", "line 2: --nodes: asks for '2' nodes; a job runs as one task on one node"),
        ("-n 4", "line 2: --ntasks: asks for '4' tasks"),
        ("--array=1,3,5", "line 2: --array: index lists ('1,3,5') are not supported"),
        ("--dependency=singleton", "line 2: --dependency: 'singleton' is not supported"),
        ("--dependency=afterok:1?afterok:2", "'?' (any of) is not supported"),
        ("--gres=mps:50", "only GPUs (gpu[:TYPE]:N) can be asked for here"),
        ("--bogus=1", "line 2: unknown sbatch option --bogus"),
        ("--time", "line 2: --time needs a value"),
        ("--hold=yes", "line 2: --hold takes no value"),
        ("--signal=KILL@60", "line 2: --signal: KILL cannot be a warning signal"),
        ("--signal=USR1@7200", "line 2: --signal @SECS: must be at most 3600s"),
        # the option as given, not the -l gpus it becomes (a trial's trap)
        ("--gpus=0", "line 2: --gpus: expected a whole number of GPUs from 1 to 64, got '0'"),
        ("-G 0", "line 2: --gpus: expected a whole number of GPUs from 1 to 64"),
        ("--gres=gpu:0", "line 2: --gres: expected a whole number of GPUs from 1 to 64"),
        ("--gpus-per-node=a100:x", "--gpus-per-node: expected a whole number of GPUs"),
        ("--input=data.txt", "standard input is /dev/null here"),
    ],
)
def test_slurm_refusals_name_the_line(line: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_of(f"#!/bin/sh\n#SBATCH {line}\ntrue\n", "slurm")
    assert message in str(info.value)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "--time",
                    "-t",
                    "--gres",
                    "--gpus",
                    "--array",
                    "--signal",
                    "--mem",
                    "-c",
                    "--export",
                    "-o",
                    "--dependency",
                    "-N",
                    "--hold",
                    "--mail-type",
                    "-J",
                ]
            ),
            st.text(max_size=12),
            st.from_regex(r"[0-9:\-%,@BUSR]{1,12}", fullmatch=True),
        ),
        max_size=6,
    )
)
def test_any_sbatch_line_is_a_clean_error_or_a_valid_job(tokens: list[str]) -> None:
    try:
        opts = parse_sbatch_tokens(tokens, "job.sh line 2")
        JobSpec(
            **build_spec_kwargs(QsubOptions(command=["true"], compat="slurm"), opts, environ={})
        )
    except SpecError as exc:
        assert str(exc)


# -- PBS ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mem", "mib"),
    [("32gb", 32768), ("512MB", 512), ("1tb", 1024 * 1024), ("1.5gb", 1536), ("8GiB", 8192)],
)
def test_pbs_mem_units_are_powers_of_1024_as_in_pbs(mem: str, mib: int) -> None:
    spec, _ = spec_of(f"#PBS -l select=1:ngpus=1:mem={mem}\ntrue\n")
    assert spec.host_memory_mib == mib


@pytest.mark.parametrize(
    ("gpumem", "mib"), [("32gb", 32768), ("512mb", 512), ("32GB", 32768), ("30GiB", 30720)]
)
@pytest.mark.parametrize("directive", ["#PBS", "#EBB"])
def test_gpumem_in_an_l_list_reads_sizes_as_mem_does(directive: str, gpumem: str, mib: int) -> None:
    """``-l gpumem=32gb`` beside ``mem=32gb`` is 32 GiB, as PBS reads ``mem`` (it was 32
    decimal GB, 30,518 MiB: a slice 1.5 GiB smaller than the job asked for)."""
    spec, _ = spec_of(f"{directive} -l gpu=25%,gpumem={gpumem},mem={gpumem}\ntrue\n")
    assert spec.memory_mib == mib == spec.host_memory_mib


def test_pbs_in_the_wild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    spec, notes = spec_of(
        "#PBS -N train\n"
        "#PBS -l select=1:ncpus=8:ngpus=2:mem=32gb\n"
        "#PBS -l walltime=1:00:00:00,place=scatter\n"
        "#PBS -j oe -o logs/\n"
        "#PBS -m abe -M me@example.com\n"
        "#PBS -A proj -r n -W group_list=ml\n"
        "#PBS -S /bin/bash\n"
        "python train.py\n"
    )
    assert (spec.name, spec.gpus, spec.cpus, spec.walltime_s) == ("train", 2, 8, 86400)
    assert spec.host_memory_mib == 32 * 1024  # PBS's gb is 1024**3 bytes
    assert spec.stdout == spec.stderr == "logs/%x.o%j"  # a directory: PBS's name in it
    assert spec.account == "proj" and spec.compat == "pbs"
    assert spec.script is not None and spec.script.startswith("#!/bin/bash\n#PBS -N train")
    said = "\n".join(notes)
    for word in ("place=scatter", "-m abe", "-M me@example.com", "-r n", "group_list=ml"):
        assert word in said


def test_torque_nodes_and_arrays() -> None:
    spec, notes = spec_of(
        "#PBS -l nodes=1:ppn=4:gpus=1:shared\n#PBS -t 1-20%5\n#PBS -l pmem=2gb\ntrue\n"
    )
    assert (spec.gpus, spec.cpus) == (1, 4)
    assert spec.array == ArraySpec(start=1, end=20, limit=5)
    assert any("shared" in n for n in notes) and any("pmem=2gb" in n for n in notes)


def test_pbs_output_on_a_named_host_is_written_where_the_job_runs() -> None:
    spec, notes = spec_of("#PBS -o login1:/home/u/out.txt\ntrue\n")
    assert spec.stdout == "/home/u/out.txt" and spec.stderr is None
    assert any("login1" in n for n in notes)


def test_pbs_join_without_a_path_joins_the_attempts_own_log() -> None:
    # (it once kept the two streams apart, with a note, where PBS users expect one)
    spec, notes = spec_of("#PBS -j oe\ntrue\n")
    assert (spec.stdout, spec.stderr, spec.join) == (None, None, "oe")
    assert notes == []


@pytest.mark.parametrize(
    ("flags", "stdout", "unused"),
    [
        (["-j", "oe", "-e", "err.txt"], None, "-e err.txt"),  # -e unused, as in PBS
        (["-j", "oe", "-o", "out.txt", "-e", "err.txt"], "out.txt", "-e err.txt"),
        (["-j", "eo", "-o", "out.txt", "-e", "err.txt"], "err.txt", "-o out.txt"),
        (["-j", "eo", "-o", "out.txt"], None, "-o out.txt"),
        (["-j", "oe", "-o", "out.txt"], "out.txt", None),
        (["-j", "OE", "-o", "both.txt", "-e", "both.txt"], "both.txt", None),
    ],
)
def test_pbs_join_sends_both_streams_one_way_and_names_the_path_it_leaves_unused(
    flags: list[str], stdout: str | None, unused: str | None
) -> None:
    notes: list[str] = []
    args = dict(zip(flags[::2], flags[1::2], strict=True))
    cli = QsubOptions(
        command=["true"], join=args["-j"], stdout=args.get("-o"), stderr=args.get("-e")
    )
    spec = JobSpec(**build_spec_kwargs(cli, None, environ={}, notes=notes))
    assert spec.stdout == spec.stderr == stdout
    assert spec.join == args["-j"].lower()
    if unused is None:
        assert notes == []
    else:
        [note] = notes
        assert note.startswith(f"{unused}: not used: -j {spec.join} sends")
        assert ("to the attempt's log (ebb logs ID)" in note) == (stdout is None)


def test_pbs_join_n_keeps_the_streams_apart() -> None:
    spec, notes = spec_of("#PBS -j n -o o.txt -e e.txt\ntrue\n")
    assert (spec.stdout, spec.stderr, spec.join, notes) == ("o.txt", "e.txt", None, [])


def test_pbs_copy_environment_leaves_out_ebbtides_settings_and_credentials() -> None:
    environ = {
        "PATH": "/usr/bin",
        "CONDA_PREFIX": "/opt/conda",
        "EBBTIDE_DB_URL": "postgresql://u:secret@db/x",
        "EBBTIDE_TOKEN": "t0ken",
        "PGPASSWORD": "secret",
        "SLURM_JOB_ID": "5",
        "BASH_FUNC_f%%": "() { :; }",
        "SHLVL": "2",
    }
    assert export_env("ALL", environ) == {"PATH": "/usr/bin", "CONDA_PREFIX": "/opt/conda"}
    assert export_env("NONE", environ) == {}
    assert export_env("ALL,X=1", environ)["X"] == "1"
    assert export_env("PATH,Y=2", environ) == {"PATH": "/usr/bin", "Y": "2"}


def test_a_script_with_both_kinds_is_read_by_the_command_that_submits_it() -> None:
    text = "#!/bin/sh\n#PBS -N from-pbs\n#SBATCH -J from-slurm\ntrue\n"
    as_pbs, notes = spec_of(text)
    assert as_pbs.name == "from-pbs" and any("#SBATCH lines not read" in n for n in notes)
    as_slurm, notes = spec_of(text, "slurm")
    assert as_slurm.name == "from-slurm" and any("#PBS lines not read" in n for n in notes)
    # only #SBATCH lines: ebb qsub reads it as Slurm's too
    only, _ = spec_of("#!/bin/sh\n#SBATCH -J s\ntrue\n")
    assert only.compat == "slurm" and only.name == "s"


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["-j", "x"], "-j: expected oe"),
        (["-S", "bash"], "-S: expected an absolute path"),
        (["-l", "select=1:ngpus=1:mem=lots"], "-l mem: expected a size"),
    ],
)
def test_pbs_refusals_name_the_line(tokens: list[str], message: str) -> None:
    opts = parse_directive_tokens(tokens, "job.sh line 4")
    with pytest.raises(SpecError) as info:
        build_spec_kwargs(QsubOptions(script="true\n"), opts, environ={})
    assert "job.sh line 4" in str(info.value) and message in str(info.value)


# -- the job's side ---------------------------------------------------------------------------


def _job(**fields: Any) -> SimpleNamespace:
    base = {"id": 42, "array_id": None, "array_index": None, "owner": "alice", "queue": "default"}
    base["gpus"] = 0
    return SimpleNamespace(**{**base, **fields})


def test_pbs_variables() -> None:
    spec = JobSpec(
        command=["true"], name="train", cwd="/work/u", submit_host="login1", cpus=4,
        array=ArraySpec(start=1, end=4),
    )  # fmt: skip
    env = scheduler_env(spec, _job(id=43, array_id=42, array_index=2), 1, node="gpu-a",
                        devices=[], nodefile=Path("/run/nf"))  # fmt: skip
    assert env["PBS_JOBID"] == "42[2]" and env["PBS_JOBNAME"] == "train"
    assert env["PBS_O_WORKDIR"] == "/work/u" and env["PBS_O_HOST"] == "login1"
    assert env["PBS_ARRAY_INDEX"] == env["PBS_ARRAYID"] == "2"
    assert env["PBS_ARRAY_ID"] == "42[]" and env["PBS_NODEFILE"] == "/run/nf"
    assert env["NCPUS"] == "4" and not any(k.startswith("SLURM_") for k in env)


def test_slurm_variables_and_no_task_count_that_frameworks_would_take_for_srun() -> None:
    spec = JobSpec(command=["true"], name="t", cwd="/w", compat="slurm",
                   array=ArraySpec(start=0, end=15, step=4))  # fmt: skip
    env = scheduler_env(spec, _job(id=44, array_id=43, array_index=4), 3, node="n1", devices=[])
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == "44"
    assert env["SLURM_ARRAY_JOB_ID"] == "43" and env["SLURM_ARRAY_TASK_ID"] == "4"
    assert (env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"]) == ("0", "12")
    assert env["SLURM_ARRAY_TASK_COUNT"] == "4" and env["SLURM_RESTART_COUNT"] == "2"
    assert env["SLURM_SUBMIT_DIR"] == "/w"
    # PyTorch Lightning takes SLURM_NTASKS for a job it should requeue with scontrol
    assert "SLURM_NTASKS" not in env and not any(k.startswith("PBS_") for k in env)


def test_output_paths_expand_and_resolve_against_the_jobs_directory() -> None:
    spec = JobSpec(command=["true"], name="train")
    job = _job(id=7, array_id=5, array_index=3)
    assert (
        output_path("logs/%x-%A_%a.%j.%u.%N.100%%", spec, job, node="n1", cwd="/w")
        == "/w/logs/train-5_3.7.alice.n1.100%"
    )
    assert output_path("/abs/%j.out", spec, job, node="n1", cwd="/w") == "/abs/7.out"
    assert output_path("%q.out", spec, job, node="n1", cwd="/w") == "/w/%q.out"


# -- the commands -------------------------------------------------------------------------


def test_sbatch_prints_what_slurm_prints(home: Path) -> None:
    result = CliRunner().invoke(cli, ["sbatch", "-H", "-t", "10", "--wrap", "echo hi"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Submitted batch job 1"
    result = CliRunner().invoke(cli, ["sbatch", "--parsable", "-H", "--wrap=echo hi"])
    assert result.stdout.strip() == "2"
    # a wrapped command is named "wrap", as Slurm names it, unless -J says otherwise
    named = CliRunner().invoke(cli, ["sbatch", "--json", "-H", "--wrap", "true", "-J", "mine"])
    listed = json.loads(CliRunner().invoke(cli, ["qstat", "--json"]).stdout)
    assert [j["name"] for j in listed] == ["wrap", "wrap", "mine"], named.output


def test_sbatch_options_on_the_command_line_win_over_the_script(home: Path) -> None:
    script = home.parent / "job.sbatch"
    script.write_text("#!/bin/sh\n#SBATCH -J inscript -t 5\n#SBATCH --mail-type=ALL\ntrue\n")
    result = CliRunner().invoke(
        cli, ["sbatch", "--json", "-J", "oncli", "--hold", str(script), "arg1"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert any("--mail-type=ALL" in n for n in out["notes"])
    result = CliRunner().invoke(cli, ["qstat", "--json", "-f", str(out["id"])])
    job = json.loads(result.stdout)
    assert job["name"] == "oncli" and job["state"] == "held"


def test_bad_sbatch_input_is_one_clear_line_and_no_job(home: Path) -> None:
    result = CliRunner().invoke(cli, ["sbatch", "--nodes=3", "--wrap", "true"])
    assert result.exit_code == 1
    assert "ebb: error:" in result.output and "one node" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["sbatch", "-t", "10"])
    assert result.exit_code == 1 and "needs a SCRIPT" in result.output
    assert (
        not (home / "ebbtide.db").exists()
        or "[]" in CliRunner().invoke(cli, ["qstat", "--json"]).stdout
    )


def test_qsub_pbs_flags_on_the_command_line(home: Path) -> None:
    os.makedirs("out")
    result = CliRunner().invoke(
        cli,
        ["qsub", "-h", "--json", "-o", "out/", "-j", "oe", "-A", "acct", "-m", "abe",
         "--", "echo", "hi"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert any("-m abe" in n and "mail is not sent" in n for n in out["notes"])
    job = json.loads(CliRunner().invoke(cli, ["qstat", "--json", "-f", str(out["id"])]).stdout)
    assert job["submitted"]["stdout"] == job["submitted"]["stderr"] == "out/%x.o%j"
    assert job["submitted"]["account"] == "acct"
    text = CliRunner().invoke(cli, ["qstat", "-f", str(out["id"])]).stdout
    assert "account" in text and "acct" in text and "signal: TERM (15)" in text


# -- one unit rule ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["-l gpumem=4", "-l mem=4", "#PBS -l mem=4"])
def test_a_bare_size_is_refused_never_read_as_bytes(where: str) -> None:
    text = f"{where.removeprefix('#PBS ')}"
    opts = parse_directive_tokens(text.split(), "job.sh line 2")
    with pytest.raises(SpecError) as info:
        build_spec_kwargs(QsubOptions(command=["true"]), opts, environ={})
    assert "'4' needs a unit, like 4GiB" in str(info.value)


def test_a_bare_size_is_refused_in_the_sdk_and_in_policy_files(tmp_path: Path) -> None:
    from ebbtide.config.policy import load_policy

    with pytest.raises(SpecError, match="needs a unit"):
        JobSpec(command=["true"], gpumem=4)
    assert JobSpec(command=["true"], memory_mib=4096).memory_mib == 4096  # the name says MiB
    policy = tmp_path / "p.yaml"
    policy.write_text("defaults:\n  margin_memory_mib: '4'\n")
    with pytest.raises(Exception, match="needs a unit") as info:
        load_policy(policy)
    assert "p.yaml" in str(info.value)
    policy.write_text("defaults:\n  margin_memory_mib: 4096\n")  # a number: MiB, by its name
    load_policy(policy)
