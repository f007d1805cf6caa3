"""``ebb sim``'s bad input: one line on stderr that names the flag, and no run.

A trial's traps: ``--device-memory 80`` and ``--jobs openb:/nope.csv`` were refused
without naming their flag, and ``--hours 0`` got click's three-line usage error."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "online.csv"
    path.write_text("t_s,device,online_compute_pct,online_memory_mib\n0,0,10,1024\n60,0,10,1024\n")
    return path


@pytest.mark.parametrize(
    ("args", "code", "start"),
    [
        (["--device-memory", "80"], 1, "ebb: error: --device-memory: '80' needs a unit"),
        (["--job-gpu-memory", "x"], 1, "ebb: error: --job-gpu-memory: expected a size"),
        (["--history", "1q"], 1, "ebb: error: --history: expected a duration"),
        (["--jobs", "openb:/nope.csv"], 1, "ebb: error: --jobs: /nope.csv: cannot read"),
        (["--hours", "0"], 2, "ebb: error: --hours: 0.0 is not in the range x>0 (ebb sim --help)"),
        (["--devices", "0"], 2, "ebb: error: --devices: 0 is not in the range x>=1"),
        (["--load", "soon"], 2, "ebb: error: --load: 'soon' is not one of"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_flag(
    trace: Path, args: list[str], code: int, start: str
) -> None:
    result = CliRunner().invoke(cli, ["sim", "--online", f"trace:{trace}", *args], prog_name="ebb")
    assert result.exit_code == code, result.output
    assert result.stderr.startswith(start), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_missing_trace_names_online() -> None:
    result = CliRunner().invoke(cli, ["sim", "--online", "trace:/nope.csv"])
    assert result.exit_code == 1
    assert result.stderr.startswith("ebb: error: --online: /nope.csv: cannot read the trace")
    missing = CliRunner().invoke(cli, ["sim"], prog_name="ebb")
    assert missing.exit_code == 2
    assert missing.stderr == "ebb: error: Missing option '--online' (ebb sim --help)\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["qstat", "-a"], "ebb: error: No such option '-a' (ebb qstat --help)\n"),
        (["qstta"], "ebb: error: No such command 'qstta'"),
        (
            ["node", "drain"],
            "ebb: error: Missing argument 'NODE[/DEVICE]' (ebb node drain --help)\n",
        ),
    ],
)
def test_any_usage_error_is_one_line(args: list[str], says: str) -> None:
    """A trial's trap: PBS habits (``qstat -a``) got click's three-line usage error."""
    result = CliRunner().invoke(cli, args, prog_name="ebb")
    assert result.exit_code == 2
    assert result.stderr.startswith(says) and result.stderr.count("\n") == 1


def test_a_shipped_sample_is_found_by_its_name() -> None:
    """A trial's trap: ``ebb up --headroom trace:genai_sample.csv`` found the shipped
    sample, and ``ebb sim --online trace:genai_sample.csv`` said it could not read it."""
    result = CliRunner().invoke(
        cli,
        ["sim", "--online", "trace:genai_sample.csv", "--hours", "0.05", "--no-baselines"],
        prog_name="ebb",
    )
    assert result.exit_code == 0, result.output
    assert "harvest efficiency" in result.stdout
