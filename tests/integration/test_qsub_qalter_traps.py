"""Traps a PBS and Slurm user met submitting and changing jobs (a trial of 2026-12-07):
``SCRIPT -- ARGS`` dropped the script's directives, qalter advised a flag it lacked and
dropped ``-l`` resources it could not alter, qhold and qrls of an array with a running task
failed though they did their work, ``qstat -s`` took no comma list, and an array's tasks
sharing one ``-o`` file were not told."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner, Result

from ebbtide.cli.main import cli
from ebbtide.queue.store import Store


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def ebb(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def jobs() -> dict[int, dict]:  # type: ignore[type-arg]
    return {j["id"]: j for j in json.loads(ebb("qstat", "-x", "--json"))}


def test_a_dashdash_after_the_script_is_the_scripts_and_its_directives_hold(
    home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "args.sh"
    script.write_text('#!/bin/bash\n#PBS -N argsjob\n#EBB -l gpu=30%\necho "args: $*"\n')
    ebb("qsub", str(script), "--lr", "0.1")  # 1
    ebb("qsub", str(script), "--", "--lr", "0.1")  # 2: a "--" the script gets, as bash would
    ebb("qsub", str(script), "x", "--", "y")  # 3
    ebb("qsub", "-N", "cmd", "-l", "gpu=20%", "--", "echo", "a", "--", "b")  # 4: a command
    got = jobs()
    for job_id, args in ((1, ["--lr", "0.1"]), (2, ["--", "--lr", "0.1"]), (3, ["x", "--", "y"])):
        assert (got[job_id]["name"], got[job_id]["compute_pct"]) == ("argsjob", 30.0)
        described = json.loads(ebb("qstat", "-f", str(job_id), "--json"))
        assert described["submitted"]["args"] == args, described
    assert got[4]["name"] == "cmd" and got[4]["compute_pct"] == 20.0
    submitted = json.loads(ebb("qstat", "-f", "4", "--json"))["submitted"]
    assert submitted["command"] + submitted["args"] == ["echo", "a", "--", "b"]


def test_an_option_given_dashdash_as_its_value_is_refused(home: Path) -> None:
    """``qsub -N -- true`` (the name forgotten) made a job named ``--``."""
    result = run("qsub", "-N", "--", "true")
    assert result.exit_code == 1, result.output
    assert "-N was given '--' as its value" in result.output
    assert "Traceback" not in result.output
    assert jobs() == {}  # nothing submitted


def _fleet(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-a", started_at=time.time(), devices=[{"index": i, "memory_mib": 81920} for i in (0, 1)]
    )
    store.close()


def test_qalter_takes_allow_future_as_its_refusal_says(home: Path) -> None:
    _fleet(home)
    ebb("qsub", "-h", "--", "true")  # 1
    refused = run("qalter", "1", "-l", "gpumem=100GiB")
    assert refused.exit_code == 1 and "--allow-future" in refused.output, refused.output
    assert jobs()[1]["memory_mib"] != 100 * 1024  # unchanged
    ebb("qalter", "1", "-l", "gpumem=100GiB", "--allow-future")
    assert jobs()[1]["memory_mib"] == 100 * 1024
    ebb("qalter", "1", "-l", "gpu=4", "--allow-future")
    assert "--allow-future" in ebb("qalter", "--help")


def test_qalter_names_the_resource_it_cannot_alter_as_typed(home: Path) -> None:
    ebb("qsub", "-h", "-l", "gpu=10%", "--", "true")  # 1
    for resources in ("foo=bar,gpu=20%", "foo=bar", "ncpus=4", "gpu=20%,mem=4gb"):
        typed = next(
            item.split("=")[0] for item in resources.split(",") if not item.startswith("gpu=")
        )
        result = run("qalter", "1", "-l", resources)
        assert result.exit_code == 1, (resources, result.output)
        assert f"-l {typed}: cannot be altered" in result.output, (resources, result.output)
    assert jobs()[1]["compute_pct"] == 10.0  # nothing changed, gpu=20% beside them included


def test_qhold_and_qrls_of_an_array_leave_its_running_task_alone(home: Path) -> None:
    _fleet(home)
    ebb("qsub", "-J", "1-4", "-l", "gpu=10%,gpumem=1GiB", "--", "true")  # 1..4
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.dispatch(
        1, expected_attempts=0, node="gpu-a", devices=(0,), compute_pct=10, memory_mib=1024
    )
    store.close()
    held = run("qhold", "1[]")
    assert held.exit_code == 0, held.output
    assert "array 1: 1 running or finished task left alone" in held.output
    states = {k: j["state"] for k, j in jobs().items()}
    assert states == {1: "dispatched", 2: "held", 3: "held", 4: "held"}
    released = run("qrls", "1[]")
    assert released.exit_code == 0, released.output
    assert "array 1: 1 finished or not held task left alone" in released.output
    assert {k: j["state"] for k, j in jobs().items()} == {
        1: "dispatched",
        2: "queued",
        3: "queued",
        4: "queued",
    }
    nothing = run("qrls", "1[]")
    assert nothing.exit_code == 1 and "no task of array 1 is held" in nothing.output
    # named one by one, the running task is still an error
    one = run("qhold", "1")
    assert one.exit_code == 1 and "only queued or waiting jobs can be held" in one.output


def test_qstat_s_takes_comma_lists_and_u_says_whose_list_is_empty(home: Path) -> None:
    ebb("qsub", "-h", "--", "true")  # 1 held
    ebb("qsub", "--", "true")  # 2 queued
    ebb("qdel", "2")
    for states in (["-s", "held,cancelled"], ["-s", "H,F"], ["-s", "held", "-s", "cancelled"]):
        rows = ebb("qstat", *states).splitlines()[1:]
        assert [int(r.split()[0]) for r in rows] == [1, 2], states
    assert "comma list" in ebb("qstat", "--help")
    bad = run("qstat", "-s", "held,nope")
    assert bad.exit_code == 1 and "got 'nope'" in bad.output
    empty = run("qstat", "-u", "nobody")
    assert empty.exit_code == 0
    assert "no job of nobody is waiting or running" in empty.output


def test_an_arrays_tasks_sharing_an_output_file_are_told(home: Path, tmp_path: Path) -> None:
    result = run("qsub", "--json", "-J", "1-3", "-o", "out/arr.txt", "-e", "err", "--", "true")
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    shared = [n for n in notes if "share the" in n]
    assert len(shared) == 2, notes
    assert "-o file out/arr.txt" in shared[0] and "e.g. out/arr.%a.txt" in shared[0]
    assert "-e file err" in shared[1] and "e.g. err.%a" in shared[1]
    # the missing directory is said too (the job would fail at its start)
    assert any(f"-o file out/arr.txt ({tmp_path / 'out'}) does not exist here" in n for n in notes)
    (tmp_path / "out").mkdir()
    result = run("qsub", "--json", "-J", "1-3", "-o", "out/arr.%a.txt", "--", "true")
    assert not [n for n in json.loads(result.stdout)["notes"] if "share the" in n]
    result = run("qsub", "--json", "-o", "out/one.txt", "--", "true")  # one job: nothing
    assert not [n for n in json.loads(result.stdout)["notes"] if "-o file" in n]


def test_kind_is_taken_in_any_case_and_priorities_keep_their_column(home: Path) -> None:
    ebb("qsub", "--kind", "TRAINING", "-p", "-1024", "-h", "--", "true")
    assert jobs()[1]["kind"] == "training"
    ebb("qalter", "1", "--kind", "Inference")
    assert jobs()[1]["kind"] == "inference"
    header, row = ebb("qstat").splitlines()
    at = header.index("PRI") + len("PRI")
    assert row[:at].endswith("-1024") and row[at] == " "


def test_sbatch_time_zero_is_no_limit_as_slurm_reads_it(home: Path) -> None:
    result = run("sbatch", "--json", "-t", "0", "--wrap", "true")
    assert result.exit_code == 0, result.output
    assert any("no walltime" in n for n in json.loads(result.stdout)["notes"])
    assert json.loads(ebb("qstat", "-f", "1", "--json"))["submitted"]["walltime_s"] is None


def test_l_deadline_and_deadline_that_disagree_are_refused(home: Path, tmp_path: Path) -> None:
    """``qsub -l deadline=30s --deadline 60s`` kept 60 s and said nothing; the same value
    twice is fine, and the command line still overrides the script's directive."""
    result = run("qsub", "-l", "gpu=20%,deadline=30s", "--deadline", "60s", "--", "true")
    assert result.exit_code == 1, result.output
    assert "--deadline: gives the deadline as '60s' and -l deadline= as '30s'" in result.output
    assert "Traceback" not in result.output
    assert jobs() == {}  # nothing submitted
    ebb("qsub", "-l", "gpu=20%,deadline=30s", "--deadline", "30", "--", "true")  # 1: the same
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#PBS -l gpu=20%,deadline=30s\ntrue\n")
    ebb("qsub", "--deadline", "45s", str(script))  # 2: the command line's
    got = jobs()
    assert (got[1]["deadline_s"], got[2]["deadline_s"]) == (30.0, 45.0)


def test_depend_on_an_array_with_brackets_waits_for_the_whole_array(home: Path) -> None:
    """``-W depend=afterok:1[]`` dropped the ``[]`` and waited for task 1 alone (an array's
    id is its first task's); on a job that is no array it was taken in silence."""
    ebb("qsub", "-J", "1-3", "-l", "gpu=20%", "--", "true")  # 1, 2, 3
    ebb("qsub", "-l", "gpu=20%", "-W", "depend=afterok:1[]", "--", "true")  # 4
    described = json.loads(ebb("qstat", "-f", "4", "--json"))
    assert described["depends"] == [{"kind": "afterok", "job_id": 1, "array": True}]
    assert described["state"] == "waiting"
    shown = ebb("qstat", "-f", "4")
    assert "depends: afterok:1[]" in shown
    assert "depends: none" in ebb("qstat", "-f", "2")
    result = run("qsub", "-l", "gpu=20%", "-W", "depend=afterok:4[]", "--", "true")
    assert result.exit_code == 1, result.output
    assert "job 4 is not an array: depend on 4, without []" in result.output
    assert "Traceback" not in result.output
    assert sorted(jobs()) == [1, 2, 3, 4]  # nothing more submitted


def test_a_partly_refused_qdel_says_what_it_did_and_qalter_json_names_every_id(
    home: Path,
) -> None:
    """A trial's traps: ``qdel 1 2`` printed only 1's refusal, and 2's cancel went unsaid;
    ``qalter --json`` left the ids it refused out of its list."""
    first, second = (int(ebb("qsub", "--", "true")) for _ in range(2))
    ebb("qdel", str(first))
    partly = run("qdel", str(first), str(second))
    assert partly.exit_code == 1
    assert partly.stderr.splitlines() == [
        f"ebb: error: job {first} already cancelled",
        f"ebb qdel: cancelled {second}; not {first} (above)",
    ]
    assert jobs()[second]["state"] == "cancelled"
    refused = run("qdel", str(first))  # nothing done: nothing to sum up
    assert refused.stderr.splitlines() == [f"ebb: error: job {first} already cancelled"]

    third = int(ebb("qsub", "--", "true"))
    altered = run("qalter", "-N", "renamed", str(third), str(first), "99", "--json")
    assert altered.exit_code == 1
    out = json.loads(altered.stdout)
    assert [(j["id"], j["ok"]) for j in out] == [(third, True), (first, False), (99, False)]
    assert out[0]["name"] == "renamed" and out[0]["state"] == "queued"  # as qstat --json
    assert out[0]["notes"] == []
    assert out[2]["error"] == "no job with id 99"


def test_qalter_notes_a_resource_a_later_l_gives_again(home: Path) -> None:
    job_id = ebb("qsub", "-l", "gpu=10%,gpumem=1GiB", "--", "true").strip()
    altered = run("qalter", "-l", "gpu=20%", "-l", "gpu=30%", job_id)
    assert altered.exit_code == 0, altered.output
    assert altered.stderr.splitlines() == [
        "ebb qalter: note: -l gpu=30%: replaces the 20% an earlier -l gave: the last one counts"
    ]
    assert jobs()[int(job_id)]["compute_pct"] == 30
    # what qalter notes of a job is in --json too (a trial's trap: stderr alone)
    whole = json.loads(run("qalter", "-l", "gpu=1", job_id, "--json").stdout)
    assert [j["ok"] for j in whole] == [True]
    assert any("1 whole GPU with no gpumem" in n for n in whole[0]["notes"]), whole


def test_qsub_h_alone_says_h_holds_and_where_the_help_is(home: Path) -> None:
    # (`ebb qsub -h` said only "qsub needs a SCRIPT": -h is PBS's hold, not help)
    alone = run("qsub", "-h")
    assert alone.exit_code == 1
    assert "-h holds the job, as PBS's qsub -h; ebb qsub --help shows the help" in alone.stderr
    assert "holds the job" not in run("qsub").stderr


def test_qsub_says_no_scheduler_runs_where_agents_report_but_none_leads(home: Path) -> None:
    # (a trial's job sat queued with agents up and no scheduler, and qsub said nothing)
    from ebbtide.client_fleet import NO_SCHEDULER_NOTE
    from ebbtide.scheduling.leader import LeaderLock

    _fleet(home)
    alone = run("qsub", "--json", "-l", "gpu=10%,gpumem=1GiB", "--", "true")
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout)["notes"] == [NO_SCHEDULER_NOTE]
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    lock = LeaderLock(store.engine, home, "scheduler")
    assert lock.try_acquire()
    try:
        led = run("qsub", "--json", "-l", "gpu=10%,gpumem=1GiB", "--", "true")
        assert "notes" not in json.loads(led.stdout)  # (only where there is one)
    finally:
        lock.release()
        store.close()
