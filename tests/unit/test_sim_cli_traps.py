"""``ebb sim``: a new-user trial's traps.

- a bad ``--plot`` path ran the whole simulation, then threw it away with a traceback;
- ``--policy FILE`` silently ignored ``--margins``, ``--quantiles`` and ``--history``, and
  neither output said which policy file ran;
- a policy's windows, read on an undocumented simulated Monday, or a pool matching no
  simulated device, gave 0 % harvest without a word;
- ``--hours`` longer than the trace was silently cut;
- ``--history 0s`` named ``history_s``, not the flag.

The sim's own checks of a value exit 1 (``UserError``, as the rest of ``ebb``); click's own
usage errors (a range such as ``--hours 0``, a choice) keep exit 2
(``test_sim_cli_errors.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ebbtide.cli.main import cli

#: A tiny run: two devices, a few minutes, ebbtide alone.
TINY = ["--no-baselines", "--hours", "0.05"]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Two devices, 10 minutes of online load."""
    path = tmp_path / "online.csv"
    rows = ["t_s,device,online_compute_pct,online_memory_mib"]
    rows += [f"{t},{d},{10 + 5 * d},4096" for t in range(0, 660, 60) for d in (0, 1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def sim(trace: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["sim", "--online", f"trace:{trace}", *args], prog_name="ebb")


def policy_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "ebbtide.yaml"
    path.write_text("apiVersion: ebbtide/v1\n" + body)
    return path


def notes(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("ebb sim: note: ")]


# -- 1. --plot is checked before the run; a failure to write it keeps the results -------


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nodir/sim.png", "no directory"),
        ("sim.jpgg", "cannot draw a .jpgg file; end the name in one of"),
        ("", "give a file name"),
    ],
)
def test_a_bad_plot_path_is_refused_before_the_run(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, says: str
) -> None:
    pytest.importorskip("matplotlib")
    import ebbtide.sim.cli as sim_cli

    def no_run(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("simulated before checking --plot")

    monkeypatch.setattr(sim_cli, "run_policies", no_run)
    path = str(tmp_path / name) if name else ""
    result = sim(trace, *TINY, "--plot", path)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("ebb: error: --plot ") and says in result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


@pytest.mark.parametrize("as_json", [False, True])
def test_a_plot_that_cannot_be_written_keeps_the_results(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    pytest.importorskip("matplotlib")
    import ebbtide.sim.plot as sim_plot

    def full_disk(path: str, *_a: Any, **_k: Any) -> None:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(sim_plot, "plot", full_disk)
    png = tmp_path / "sim.png"
    result = sim(trace, *TINY, "--plot", str(png), *(["--json"] if as_json else []))
    assert result.exit_code == 1
    assert result.stderr == f"ebb: error: --plot {png}: No space left on device\n"
    if as_json:
        assert "ebbtide" in json.loads(result.stdout)["policies"]
    else:
        assert "harvest efficiency" in result.stdout


def test_report_and_sim_share_the_plot_check() -> None:
    from ebbtide import plot_path
    from ebbtide.cli import report_cmd

    source = Path(report_cmd.__file__).read_text()
    assert "check_plot_path(plot_path)" in source and "get_supported_filetypes" not in source
    assert callable(plot_path.check_plot_path)


# -- 2. flags over a policy file; the file and margins in the output -------------------

MARGINS_7 = "defaults:\n  margin_compute_pct: 7\n  margin_memory_mib: 1GiB\n"


def test_the_policy_files_margins_stand_without_flags(trace: Path, tmp_path: Path) -> None:
    path = policy_file(tmp_path, MARGINS_7)
    result = sim(trace, *TINY, "--policy", str(path), "--json")
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout)["workload"]
    assert w["policy"] == str(path)
    assert w["margins"] == {"compute_pct": 7.0, "memory_mib": 1024.0}
    assert w["flags_over_policy"] == []


def test_flags_apply_over_the_policy_file(trace: Path, tmp_path: Path) -> None:
    path = policy_file(tmp_path, MARGINS_7 + "  forecast_compute_quantile: 0.5\n")
    flags = ["--margins", "3%,512MiB", "--quantiles", "0.8,0.9", "--history", "30m"]
    result = sim(trace, *TINY, "--policy", str(path), *flags, "--json")
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout)["workload"]
    assert w["margins"] == {"compute_pct": 3.0, "memory_mib": 512.0}
    assert w["forecast"] == {"compute_quantile": 0.8, "memory_quantile": 0.9, "history_s": 1800.0}
    assert w["flags_over_policy"] == ["--history", "--margins", "--quantiles"]


def test_without_a_policy_the_json_says_the_builtin_margins(trace: Path) -> None:
    w = json.loads(sim(trace, *TINY, "--json").stdout)["workload"]
    assert w["policy"] is None and w["margins"] == {"compute_pct": 5.0, "memory_mib": 2048.0}


def test_the_table_header_names_the_policy_file(trace: Path, tmp_path: Path) -> None:
    path = policy_file(tmp_path, MARGINS_7)
    result = sim(trace, *TINY, "--policy", str(path), "--margins", "4%,1GiB")
    assert result.exit_code == 0, result.output
    head = result.stdout.split("\n\n")[0].splitlines()
    assert head[0].startswith("online:") and head[1].startswith("offline:")
    assert head[2].startswith(f"policy:   {path}: margins 4%, 1024 MiB")
    assert head[2].endswith("(--margins over the file)")


def test_help_documents_flags_over_the_policy_and_the_simulated_day() -> None:
    from ebbtide.sim.windows import SIM_DATE

    text = CliRunner().invoke(cli, ["sim", "--help"], terminal_width=200).output
    flat = " ".join(text.split())
    assert f"{SIM_DATE:%A %Y-%m-%d}" == "Monday 2024-01-08" and "Monday 2024-01-08" in flat
    assert "--margins, --quantiles and --history given on the command line" in flat
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    sim_section = readme.split("## Simulation (`ebb sim`)")[1].split("\n## ")[0]
    assert "Monday 2024-01-08" in " ".join(sim_section.split())


# -- 3. notes on windows that admit nothing ---------------------------------------------

NIGHTS = (
    "windows:\n  - name: nights\n    kind: cron\n    schedule: '0 22 * * *'\n    until: '07:00'\n"
)


def test_a_note_when_no_window_opens_in_the_span(trace: Path, tmp_path: Path) -> None:
    path = policy_file(tmp_path, NIGHTS)
    result = sim(trace, *TINY, "--policy", str(path), "--clock-start", "09:00")
    assert result.exit_code == 0, result.output
    (said,) = notes(result)
    assert "no window of the policy opens for the simulated jobs" in said
    assert "Mon 2024-01-08 09:00 to Mon 09:03 UTC" in said and "so ebbtide harvests nothing" in said


def test_no_note_when_a_window_opens(trace: Path, tmp_path: Path) -> None:
    path = policy_file(tmp_path, NIGHTS)
    result = sim(trace, *TINY, "--policy", str(path), "--clock-start", "23:00")
    assert result.exit_code == 0, result.output
    assert notes(result) == []


def test_a_note_when_a_pool_matches_no_simulated_device(trace: Path, tmp_path: Path) -> None:
    body = (
        "devices:\n  pools:\n    a100: ['node-a-*/0']\n"
        + NIGHTS.replace("until: '07:00'\n", "until: '07:00'\n    pool: a100\n")
        + "  - name: always\n    kind: cron\n    schedule: '* * * * *'\n    duration: 1h\n"
    )
    result = sim(trace, *TINY, "--policy", str(policy_file(tmp_path, body)))
    assert result.exit_code == 0, result.output
    (said,) = notes(result)
    assert said == (
        "ebb sim: note: window nights: its pool a100 (node-a-*/0) matches no simulated "
        "device (they are gpu0/0 to gpu1/0)"
    )


def test_a_note_when_a_window_admits_no_queue_default(trace: Path, tmp_path: Path) -> None:
    body = NIGHTS.replace("until: '07:00'\n", "until: '07:00'\n    queues: [batch]\n")
    body += "queues:\n  batch: {}\n"
    result = sim(trace, *TINY, "--policy", str(policy_file(tmp_path, body)))
    assert result.exit_code == 0, result.output
    said = notes(result)
    assert (
        "window nights admits queue(s) batch; every simulated job is in queue default" in (said[0])
    )


# -- 4. a trace shorter than --hours -----------------------------------------------------


def test_a_note_when_the_trace_is_shorter_than_hours(trace: Path) -> None:
    result = sim(trace, "--no-baselines", "--hours", "1")
    assert result.exit_code == 0, result.output
    assert notes(result) == [
        "ebb sim: note: the trace is 660 s long, shorter than --hours 1: the figures are "
        "over its 660 s"
    ]
    assert notes(sim(trace, *TINY)) == []


# -- 5. the sim's own checks name the flag and exit 1 ------------------------------------


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--history", "0s"], "ebb: error: --history '0s': the forecast needs some history"),
        (["--margins", "100%,2GiB"], "ebb: error: --margins '100%,2GiB': compute must be in"),
        (["--quantiles", "2,1"], "ebb: error: --quantiles '2,1': each must be in (0, 1]"),
        (["--tile", "0"], "ebb: error: --tile '0': expected a whole number"),
        (["--device-memory", "0GiB"], "ebb: error: --device-memory '0GiB': must be more than 0"),
        (["--job-gpu-memory", "0"], "ebb: error: --job-gpu-memory '0': must be more than 0"),
        (["--clock-start", "25:00"], "ebb: error: --clock-start '25:00': expected a time"),
    ],
)
def test_the_sims_own_checks_name_the_flag_and_exit_1(
    trace: Path, args: list[str], start: str
) -> None:
    result = sim(trace, *TINY, *args)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(start), result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stdout == ""


def test_a_note_when_the_online_memory_alone_is_more_than_a_device(
    trace: Path, tmp_path: Path
) -> None:
    """A trial's trap: 195 GiB online on an 80 GiB device was taken without a word, and
    the run said 0 online OOM events (they count only what offline slices caused)."""
    big = tmp_path / "big.csv"
    rows = ["t_s,device,online_compute_pct,online_memory_mib"]
    rows += [
        f"{t},{d},20,{200_000 if d == 1 and t == 120 else 4096}"
        for t in range(0, 660, 60)
        for d in (0, 1)
    ]
    big.write_text("\n".join(rows) + "\n")
    result = sim(big, *TINY)
    assert result.exit_code == 0, result.output
    (said,) = notes(result)
    assert "the online memory of 1 of 2 devices is more than a device holds (80GiB" in said
    assert "at most 195.3GiB" in said
    assert notes(sim(trace, *TINY)) == []  # within the device: nothing said
    larger = sim(big, *TINY, "--device-memory", "256GiB")
    assert notes(larger) == []


def test_a_short_runs_header_says_its_span_and_hours_unrounded(trace: Path) -> None:
    """A trial's trap: a 91 s trace's header read "0.0 h ..., 0 GPU-h online, 0 GPU-h
    spare" beside a harvest of 65 %."""
    result = sim(trace, *TINY)  # 0.05 h: 3 minutes of two devices
    assert result.exit_code == 0, result.output
    online = result.stdout.splitlines()[0]
    assert ", 3 min from 00:00 local, 0.01 GPU-h online, 0.09 GPU-h spare" in online, online
    assert " 0 GPU-h" not in online
