"""First-day traps of ``ebb qstat`` and ``ebb nodes``, as a PBS user meets them:
``qstat ID``, PBS state letters, readable times, no stale exit code while a job runs,
and agents that went silent marked as such."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.client_fleet import NO_SCHEDULER_NOTE
from ebbtide.clock import FakeClock
from ebbtide.identity import user_name
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store, job_to_dict


def ebb(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_qstat_takes_ids_arrays_and_pbs_state_letters(home: Path) -> None:
    ebb("qsub", "-h", "--", "true")  # 1, held
    ebb("qsub", "-J", "1-3", "--", "true")  # 2..4, queued
    rows = ebb("qstat", "-t", "1", "2[]").splitlines()[1:]
    assert [int(r.split()[0]) for r in rows] == [1, 2, 3, 4]
    assert [int(r.split()[0]) for r in ebb("qstat", "-s", "H").splitlines()[1:]] == [1]
    assert len(ebb("qstat", "-t", "-s", "QH").splitlines()[1:]) == 4
    # an array is one line unless -t
    rows = ebb("qstat", "-s", "QH").splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["1", "2[1-3]"]
    assert "3 tasks: 3 queued (-t for each)" in rows[1]
    assert ebb("qstat", "-s", "F").splitlines()[1:] == []
    result = CliRunner().invoke(cli, ["qstat", "-s", "Z"])
    assert result.exit_code == 1 and "PBS letters (Q R H W E F)" in result.output


def test_qstat_columns_hold_long_ids_and_every_state_name(home: Path) -> None:
    """A trial's leftovers: an array's id past six characters pushed its line out of the
    columns, and ``qstat -Q`` cut ``dispatched`` to ``dispatche``."""
    ebb("qsub", "-J", "1-1000", "-h", "--", "true")  # 1[1-1000]: 9 characters
    ebb("qsub", "-N", "single", "-h", "--", "true")
    header, array, single = ebb("qstat").splitlines()
    assert array.split()[0] == "1[1-1000]" and single.split()[0] == "1001"
    # every line's NAME column starts where the header's does
    at = header.index("NAME")
    assert array[at:].startswith("true") and single[at:].startswith("single")
    assert array.index("1[1-1000]") + len("1[1-1000]") == header.index("ID") + len("ID")
    queues = ebb("qstat", "-Q").splitlines()
    assert "dispatched" in queues[0].split()
    assert len(queues[0]) == len(queues[1])
    # --json: every state, 0 included, as the table shows them (a trial's trap)
    counts = json.loads(ebb("qstat", "-Q", "--json"))["default"]
    assert counts["held"] == 1001 and counts["running"] == 0 and len(counts) == 9


def test_qstat_lists_unfinished_jobs_unless_x_as_pbs_does(home: Path) -> None:
    ebb("qsub", "-N", "done", "--", "true")  # 1, cancelled below
    ebb("qsub", "-N", "waits", "-h", "--", "true")  # 2, held
    ebb("qdel", "1")
    assert [r.split()[0] for r in ebb("qstat").splitlines()[1:]] == ["2"]
    assert [j["id"] for j in json.loads(ebb("qstat", "--json"))] == [2]
    assert [r.split()[0] for r in ebb("qstat", "-x").splitlines()[1:]] == ["1", "2"]
    assert [j["id"] for j in json.loads(ebb("qstat", "-x", "--json"))] == [1, 2]
    assert [r.split()[0] for r in ebb("qstat", "-s", "F").splitlines()[1:]] == ["1"]
    assert [r.split()[0] for r in ebb("qstat", "1").splitlines()[1:]] == ["1"]  # named: shown
    ebb("qdel", "2")
    result = CliRunner().invoke(cli, ["qstat"])
    assert result.exit_code == 0 and result.stdout.splitlines()[1:] == []
    assert "no job is waiting or running; -x lists finished jobs" in result.stderr


def test_a_job_submitted_where_no_agent_ever_reported_says_so(home: Path) -> None:
    """A mistyped EBBTIDE_HOME makes a new store: the job would wait there forever."""
    result = CliRunner().invoke(cli, ["qsub", "--", "true"])
    assert result.exit_code == 0 and result.stdout == "1\n"
    assert result.stderr == (
        "ebb qsub: note: no node agent has ever reported to this store: the job waits until "
        "one does (ebb up, ebb worker; is EBBTIDE_HOME or EBBTIDE_DB_URL mistyped?)\n"
    )


def test_qstat_f_takes_any_number_of_jobs_as_pbs_does(home: Path) -> None:
    ebb("qsub", "-N", "one", "-h", "--", "true")  # 1
    ebb("qsub", "-N", "two", "-J", "1-2", "--", "true")  # 2, 3
    one = json.loads(ebb("qstat", "-f", "1", "--json"))
    assert one["id"] == 1  # one job named: its object, as before
    assert json.loads(ebb("qstat", "1", "-f", "--json"))["id"] == 1  # -f after the id too
    assert [d["id"] for d in json.loads(ebb("qstat", "-f", "1", "3", "--json"))] == [1, 3]
    assert [d["id"] for d in json.loads(ebb("qstat", "-f", "2[]", "--json"))] == [2, 3]
    assert [d["id"] for d in json.loads(ebb("qstat", "-f", "--json"))] == [1, 2, 3]
    text = ebb("qstat", "-f", "1", "2")
    assert text.count("                  id: ") == 2 and "\n\n" in text  # a blank line apart
    assert [d["id"] for d in json.loads(ebb("qstat", "-f", "-s", "H", "--json"))] == [1]


def test_an_arrays_task_is_named_as_pbs_names_it(home: Path) -> None:
    ebb("qsub", "-N", "arr", "-J", "0-4:2", "--", "true")  # 1, 2, 3: indices 0, 2, 4
    assert json.loads(ebb("qstat", "-f", "1[2]", "--json"))["id"] == 2
    rows = ebb("qstat", "-t", "1[4]", "1[0]").splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["3", "1"]
    assert json.loads(ebb("events", "1[4]", "--json"))[0]["type"] == "submitted"
    for args, says in (
        (["events", "1[3]"], "array 1 has no task 3 (its tasks: 0-4, 3 of them)"),
        (["logs", "1[]"], "is a whole array; name one task, like 1[1]"),
        (["qstat", "1[x]"], "is not a job id (expected a number like 12, 12[] for an array"),
        (["qdel", "9[1]"], "no array with id 9"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and says in result.output, (args, result.output)
    ebb("qdel", "1[2]")
    assert json.loads(ebb("qstat", "-f", "2", "--json"))["state"] == "cancelled"


def test_qstat_full_shows_local_iso_times_and_the_command(home: Path) -> None:
    ebb("qsub", "-h", "-l", "walltime=1:00:00", "--", "python", "train.py")
    text = ebb("qstat", "-f", "1")
    submitted = next(line for line in text.splitlines() if "submitted_at" in line)
    stamp = submitted.split(": ", 1)[1]
    assert stamp[:4].isdigit() and "T" in stamp and stamp[-6] in "+-"  # 2026-...T..+00:00
    assert "command: python train.py" in text and "walltime_s: 3600.0" in text
    assert "signal: TERM (15)" in text and f"cwd: {home.parent}" in text
    # a trial's trap: each value once (signal beside signal_name, device beside devices)
    keys = [line.split(":", 1)[0].strip() for line in text.splitlines()]
    assert len(keys) == len(set(keys))
    assert {"signal_name", "device", "checkpoint"}.isdisjoint(keys)
    assert {"devices", "checkpoint_path"} <= set(keys)
    data = json.loads(ebb("qstat", "-f", "1", "--json"))
    assert isinstance(data["submitted_at"], float)  # --json keeps Unix seconds
    assert data["device"] is None and data["submitted"]["signal_name"] == "TERM"  # kept


def test_a_job_that_has_not_ended_shows_no_exit_code(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    job_id = store.submit(JobSpec(command=["true"]), "alice", defaults_deadline_s=30)[0]
    job = store.get(job_id).model_copy(update={"exit_code": 137, "state": "queued"})
    data = job_to_dict(job)
    assert data["exit_code"] is None and data["last_exit_code"] == 137
    done = job_to_dict(job.model_copy(update={"state": "failed"}))
    assert done["exit_code"] == 137 and "last_exit_code" not in done


def test_ebb_nodes_marks_an_agent_that_went_silent(home: Path) -> None:
    clock = FakeClock(start=time.time() - 120)
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}", clock=clock)
    store.heartbeat("old-box", started_at=clock.time(), devices=[])
    Store(f"sqlite:///{home / 'ebbtide.db'}").heartbeat(
        "live-box", started_at=time.time(), devices=[]
    )
    nodes = {n["name"]: n for n in json.loads(ebb("nodes", "--json"))}
    assert nodes["old-box"]["silent"] and not nodes["live-box"]["silent"]
    text = ebb("nodes")
    assert "old-box" in text and "(agent silent)" in text.split("old-box", 1)[1].splitlines()[0]


def test_ebb_nodes_shows_no_state_for_a_silent_agents_devices_and_says_when_one_is_quiet(
    home: Path,
) -> None:
    """A trial's trap: a killed agent's device showed "ok (agent silent: ...)", and for
    the first seconds after the kill plain "ok"."""
    home.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{home / 'ebbtide.db'}"
    device = {"index": 0, "memory_mib": 81920, "online_compute_pct": 0.0, "online_memory_mib": 0.0}
    for name, age_s in (("dead-box", 120), ("quiet-box", 7), ("live-box", 0)):
        clock = FakeClock(start=time.time() - age_s)
        Store(url, clock=clock).heartbeat(name, started_at=clock.time(), devices=[device])
    lines = {line.split()[0]: line for line in ebb("nodes").splitlines()[1:]}
    assert "unknown (agent silent: its jobs are lost and requeued)" in lines["dead-box"]
    ebb("node", "drain", "dead-box", "--reason", "psu")  # the store's: it still shows
    lines = {line.split()[0]: line for line in ebb("nodes").splitlines()[1:]}
    assert (
        "unknown, dead-box drained by " in lines["dead-box"] and ": psu (agent" in lines["dead-box"]
    )
    assert " ok (no heartbeat for 7s)" in lines["quiet-box"]  # the timeout is 10s
    assert lines["live-box"].endswith(" ok")
    nodes = {n["name"]: n for n in json.loads(ebb("nodes", "--json"))}
    assert [nodes[n]["quiet"] for n in ("dead-box", "quiet-box", "live-box")] == [
        True,
        True,
        False,
    ]


def test_ebb_nodes_says_an_agent_that_stopped_cleanly_stopped(home: Path) -> None:
    """A trial's trap: an agent stopped with Ctrl-C showed "(agent stopping) (agent
    silent: its jobs are lost and requeued)", though nothing of it was lost."""
    clock = FakeClock(start=time.time() - 120)
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}", clock=clock)
    device = [
        {"index": 0, "memory_mib": 81920, "online_compute_pct": 5.0, "online_memory_mib": 1024.0}
    ]
    store.heartbeat("stopped", started_at=clock.time(), devices=device, stopping=True)
    store.heartbeat("lost", started_at=clock.time(), devices=device)
    live = Store(f"sqlite:///{home / 'ebbtide.db'}")
    # stopping, still evicting what it runs; and stopped a moment ago, nothing left
    live.heartbeat("going", started_at=time.time(), devices=device, stopping=True)
    live.heartbeat("gone", started_at=time.time(), devices=device, stopping=True)
    ebb("qsub", "-l", "gpu=10%,gpumem=1GiB", "--", "true")  # job 1
    live.dispatch(
        1, expected_attempts=0, node="going", devices=(0,), compute_pct=10, memory_mib=1024
    )
    live.close()
    store.close()
    lines = {line.split()[0]: line for line in ebb("nodes").splitlines() if line.strip()}
    assert lines["stopped"].endswith("(agent stopped)")
    assert lines["lost"].endswith("(agent silent: its jobs are lost and requeued)")
    assert lines["going"].endswith("ok (agent stopping)")
    # a trial's trap: "ok (agent stopping)" for 40 s after a clean stop (the allowance of
    # a client that does not read liveness in Redis): it stopped, and its figures are old
    assert lines["gone"].endswith("unknown (agent stopped)")


def test_qalter_changes_queued_jobs_and_whole_arrays(home: Path) -> None:
    ebb("qsub", "-J", "1-3", "-l", "gpu=10%", "--", "true")  # 1..3
    out = ebb("qalter", "1[]", "-l", "gpu=50%,walltime=2:00:00", "-p", "7", "-N", "big")
    assert out.splitlines()[0].startswith("1: altered (gpu=50%")
    jobs = json.loads(ebb("qstat", "--json"))
    assert [(j["name"], j["compute_pct"], j["priority"]) for j in jobs] == [
        ("big[1]", 50.0, 7),
        ("big[2]", 50.0, 7),
        ("big[3]", 50.0, 7),
    ]
    for args, says in (
        (["qalter", "2"], "qalter needs something to change"),
        (["qalter", "2", "-l", "ncpus=4"], "cannot be altered"),
        (["qalter", "2", "-l", "gpumem=4"], "needs a unit"),
        (["qalter", "2", "-p", "5000"], "-p: expected a whole number from -1024 to 1023"),
        (["qalter", "99", "-p", "1"], "99"),
        # PBS's qalter -h sets a hold: said, not taken for help or for an unknown flag
        (["qalter", "-h", "u", "2"], "ebb qhold ID"),
        (["qalter", "2", "-h"], "ebb qhold ID"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and says in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_a_job_no_node_could_hold_is_refused_with_what_the_fleet_offers(home: Path) -> None:
    # before any node reports, there is nothing to compare with: accepted
    ebb("qsub", "-h", "-l", "gpu=8", "--", "true")
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-a",
        started_at=time.time(),
        devices=[{"index": i, "memory_mib": 81920} for i in range(2)],
    )
    store.heartbeat("gpu-b", started_at=time.time(), devices=[{"index": 0, "memory_mib": 40960}])
    ebb("qsub", "-l", "gpu=2,gpumem=60GiB", "--", "true")  # gpu-a has two such cards
    for resources, field in (("gpu=4", "gpu"), ("gpu=25%,gpumem=96GiB", "gpumem")):
        result = CliRunner().invoke(cli, ["qsub", "-l", resources, "--", "true"])
        assert result.exit_code == 1, result.output
        assert f"{field}: no node could ever hold it" in result.output
        assert "gpu-a: 2 × 80GiB, gpu-b: 1 × 40GiB" in result.output
        assert "--allow-future" in result.output
    # a whole card's memory asked of that card: the planner keeps the memory margin
    # (2GiB) back on every card, so it would wait forever
    result = CliRunner().invoke(cli, ["qsub", "-l", "gpu=1,gpumem=80GiB", "--", "true"])
    assert result.exit_code == 1, result.output
    assert "gpumem: no node could ever hold it" in result.output
    assert "(of which 2GiB a card is always kept for the online side)" in result.output
    ebb("qsub", "-h", "-l", "gpu=1,gpumem=78GiB", "--", "true")  # what the margin leaves
    ebb("qsub", "--allow-future", "-l", "gpu=4", "--", "true")
    sbatch = CliRunner().invoke(cli, ["sbatch", "--allow-future", "-G", "4", "--wrap", "true"])
    assert sbatch.exit_code == 0, sbatch.output
    assert len(json.loads(ebb("qstat", "--json"))) == 5  # the refused three are not there


def test_a_whole_gpu_asked_with_no_memory_gets_the_whole_card(home: Path) -> None:
    """PBS's ``ngpus=1`` and Slurm's ``--gres=gpu:1`` mean a GPU, all of it: not the 1 GiB
    a slice gets by default, past which its attempts would be evicted."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-a", started_at=time.time(), devices=[{"index": i, "memory_mib": 81920} for i in (0, 1)]
    )
    store.heartbeat("gpu-b", started_at=time.time(), devices=[{"index": 0, "memory_mib": 40960}])
    script = home.parent / "train.pbs"
    script.write_text("#!/bin/sh\n#PBS -l select=1:ncpus=8:ngpus=1:mem=32gb\npython train.py\n")
    result = CliRunner().invoke(cli, ["qsub", "--json", str(script)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    # a trial's trap: granted the whole card, 40GiB, it never ran: the planner always
    # keeps the memory margin (2GiB by default) back for the online side
    assert out["notes"] == [
        "1 whole GPU with no gpumem: granted 38GiB of memory on each, the smallest card "
        "here (40GiB) less the 2GiB kept for the online side; -l gpumem=SIZE asks for less",
        NO_SCHEDULER_NOTE,  # agents report; no scheduler leads here
    ]
    assert (store.get(out["id"]).gpus, store.get(out["id"]).memory_mib) == (1, 38 * 1024)
    result = CliRunner().invoke(cli, ["sbatch", "--gres=gpu:2", "--wrap", "true"])
    assert result.exit_code == 0 and "2 whole GPUs with no gpumem: granted 38GiB" in result.output
    asked = json.loads(ebb("qsub", "--json", "-l", "gpu=1,gpumem=70GiB", "--", "true"))
    assert asked["notes"] == [NO_SCHEDULER_NOTE]  # no whole-GPU note: an amount was asked
    assert store.get(asked["id"]).memory_mib == 70 * 1024
    sliced = json.loads(ebb("qsub", "--json", "-l", "gpu=25%", "--", "true"))
    assert sliced["notes"] == [NO_SCHEDULER_NOTE]
    assert store.get(sliced["id"]).memory_mib == 1024  # a slice
    store.close()


def test_a_whole_gpu_is_sized_by_the_cards_not_by_mig_instances(home: Path) -> None:
    """A MIG instance is a GPU to the planner, but ``ngpus=1`` means a card: a node of
    10GiB instances beside 80GiB cards made every whole-GPU job a 8GiB one."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-mig",
        started_at=time.time(),
        devices=[{"index": i, "memory_mib": 10240, "mig_parent": 0} for i in (0, 1)],
    )
    store.close()
    out = json.loads(ebb("qsub", "--json", "--allow-future", "-l", "ngpus=1", "--", "true"))
    # only instances have reported: the smallest of them, said as such
    assert out["notes"][0].startswith(
        "1 whole GPU with no gpumem: granted 8GiB of memory on each, the smallest MIG "
        "instance here (10GiB) less the 2GiB kept for the online side"
    )
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat("gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81920}])
    store.close()
    out = json.loads(ebb("qsub", "--json", "-l", "ngpus=1", "--", "true"))
    assert out["notes"] == [
        "1 whole GPU with no gpumem: granted 78GiB of memory on each, the smallest card here "
        "(80GiB) less the 2GiB kept for the online side; -l gpumem=SIZE asks for less",
        NO_SCHEDULER_NOTE,  # agents report; no scheduler leads here
    ]


def test_a_whole_gpu_is_sized_by_the_nodes_that_run_the_owners_jobs(home: Path) -> None:
    """A trial's trap: ``--gres=gpu:1`` was sized by a 40GiB card on a node that runs
    someone else's jobs only, and got 38GiB of an 80GiB card."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat("gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81920}])
    store.heartbeat(
        "gpu-b",
        started_at=time.time(),
        devices=[{"index": 0, "memory_mib": 40960}],
        runs_jobs_of="user:ebbtide-nobody-else",
    )
    store.close()
    out = json.loads(ebb("sbatch", "--json", "--gres=gpu:1", "--wrap", "true"))
    assert out["notes"][0].startswith(
        "1 whole GPU with no gpumem: granted 78GiB of memory on each, the smallest card here "
        "(80GiB)"
    )


def test_a_share_no_device_could_ever_give_is_refused(home: Path) -> None:
    """A trial's trap: ``-l gpu=96%`` waited for good, as the planner keeps 5 % of every
    GPU's compute for the online side; a whole GPU runs beside the online load."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat("gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81920}])
    store.close()
    for share in ("96%", "0.99"):
        result = CliRunner().invoke(cli, ["qsub", "-l", f"gpu={share}", "--", "true"])
        assert result.exit_code == 1, result.output
        assert "gpu: no device could ever give" in result.output
        assert (
            "5% of each GPU's compute is always kept for the online side, so a share is at "
            "most 95%; ask for less, or for a whole GPU (-l gpu=1)" in result.output
        )
    ebb("qsub", "-l", "gpu=95%", "--", "true")
    ebb("qsub", "-l", "gpu=1", "--", "true")
    ebb("qsub", "--allow-future", "-l", "gpu=99%", "--", "true")  # a policy may change
    assert len(json.loads(ebb("qstat", "--json"))) == 3
    # a fleet measured through Prometheus only: the planning margin is kept too
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-a",
        started_at=time.time(),
        devices=[{"index": 0, "memory_mib": 81920, "eviction_trigger": False}],
    )
    store.close()
    result = CliRunner().invoke(cli, ["qsub", "-l", "gpu=85%", "--", "true"])
    assert result.exit_code == 1, result.output
    assert (
        "5% of each GPU's compute is always kept for the online side, and 15% more where "
        "measured through Prometheus, so a share is at most 80%" in result.output
    )


def test_a_whole_gpu_where_no_card_has_room_now_is_told_it_waits(home: Path) -> None:
    """A trial's trap: on a new ``ebb up`` a whole GPU waited 10 minutes (the cold reserve
    while the agent learns the online load) and the note did not say it would wait."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat(
        "gpu-a",
        started_at=time.time(),
        devices=[
            {"index": 0, "memory_mib": 81920, "online_memory_mib": 8192.0},
            {"index": 1, "memory_mib": 81920, "online_memory_mib": 1024.0},
        ],
    )
    store.heartbeat(
        "gpu-b",
        started_at=time.time(),
        devices=[
            {
                "index": 0,
                "memory_mib": 81920,
                "reserve_memory_mib": 8192.0,
                "reserve_cold_for_s": 540.0,
            }
        ],
    )
    out = json.loads(ebb("qsub", "--json", "-l", "ngpus=1", "--", "true"))
    assert out["notes"] == [
        "1 whole GPU with no gpumem: granted 78GiB of memory on each, the smallest card here "
        "(80GiB) less the 2GiB kept for the online side; -l gpumem=SIZE asks for less; no "
        "card has that free now (at most 77GiB, on gpu-a/1, beside online memory and the "
        "reserve kept for its growth), so it waits until one has, which an online service "
        "that keeps its memory may never allow: -l gpumem=SIZE of up to 77GiB runs beside "
        "it now",  # (a trial's trap: job 54 waited for ever behind a resident tenant)
        NO_SCHEDULER_NOTE,  # agents report; no scheduler leads here
    ]
    store.heartbeat(  # gpu-a's cards taken: the most room is gpu-b's, warming up
        "gpu-a",
        started_at=time.time(),
        devices=[{"index": 0, "memory_mib": 81920, "online_memory_mib": 40960.0}],
    )
    store.close()
    out = json.loads(ebb("qsub", "--json", "-l", "ngpus=1", "--", "true"))
    assert out["notes"][0].endswith(
        "no card has that free now (at most 70GiB, on gpu-b/0, beside online memory and the "
        "reserve kept for its growth, while its agent learns the online load for 9 more min "
        "(defaults.forecast_warmup_s)), so it waits until one has"
    )
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.heartbeat("gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81920}])
    store.close()
    out = json.loads(ebb("qsub", "--json", "-l", "ngpus=1", "--", "true"))
    assert "no card has that free now" not in out["notes"][0]  # gpu-a/0 is idle


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("notaurl", "EBBTIDE_DB_URL: cannot read 'notaurl' as a database URL; expected sqlite"),
        ("mysql://u@h/db", "ebbtide keeps its jobs in SQLite or PostgreSQL, not mysql"),
        ("postgresql+pg8000://u@127.0.0.1/db", "needs the pg8000 driver, which is not installed"),
        (
            "sqlite:////nonexistent-ebbtide/dir/e.db",
            "the directory /nonexistent-ebbtide/dir does not",
        ),
    ],
)
def test_a_bad_database_url_is_one_line_and_makes_nothing(
    url: str, says: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EBBTIDE_DB_URL", url)
    result = CliRunner().invoke(cli, ["qsub", "--", "true"])
    assert result.exit_code == 1 and says in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not Path("/nonexistent-ebbtide").exists()


def test_reading_commands_never_make_an_empty_store_where_home_is_mistyped(
    home: Path,
) -> None:
    for args in (["events", "1"], ["qdel", "1"], ["qstat", "-f", "1"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, (args, result.output)
        assert f"there is no ebbtide store at {home / 'ebbtide.db'}" in result.output
    # a list is empty, as on a new cluster, and says where it looked
    for args, out in (
        (["qstat"], ""),
        (["qstat", "--json"], "[]\n"),
        (["qstat", "-Q", "--json"], "{}\n"),
        (["nodes", "--json"], "[]\n"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0 and result.stdout == out, (args, result.output)
        assert "note: there is no ebbtide store at" in result.stderr
    assert not home.exists()
    ebb("qsub", "-h", "--", "true")  # submitting makes it
    assert (home / "ebbtide.db").exists()
    assert json.loads(ebb("qstat", "--json"))[0]["id"] == 1


def test_a_database_holding_other_tables_is_not_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from ebbtide.errors import UserError

    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(UserError, match=r"holds tables that are not ebbtide's \(customers\)"):
        Store(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"customers"}  # nothing was made
    monkeypatch.setenv("EBBTIDE_DB_INIT", "1")
    Store(f"sqlite:///{path}").close()  # asked for: ebbtide's tables beside them
    monkeypatch.delenv("EBBTIDE_DB_INIT")
    Store(f"sqlite:///{path}").close()  # and from then on it is ebbtide's too


def test_qstat_shows_paused_and_suspended_jobs(home: Path) -> None:
    for _ in range(3):
        ebb("qsub", "--", "true")
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    now = time.time()
    for job_id in (1, 2):
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024
        )
        store.mark_started(job_id, 1, pid=1, stdout_path="o", stderr_path="e")
    store.record_pause(1, 1, at=now, reason="compute", reason_code="online_compute")
    store.record_pause(2, 1, at=now, reason="memory", reason_code="online_memory", kind="suspend")
    store.close()
    rows = ebb("qstat").splitlines()[1:]
    assert {int(r.split()[0]): r.split()[5] for r in rows} == {
        1: "paused",
        2: "suspended",
        3: "queued",
    }
    # and REASON says why (a trial's trap: it was empty)
    assert rows[0].endswith("  paused: compute") and rows[1].endswith("  suspended: memory")
    full = ebb("qstat", "-f", "2")
    assert "state: running (suspended to host)" in full
    assert "suspended_at: 2" in full  # a local ISO time
    assert "state: running (paused)" in ebb("qstat", "-f", "1")
    data = json.loads(ebb("qstat", "-f", "2", "--json"))
    assert data["state"] == "running" and data["suspended_at"] == pytest.approx(now)
    listed = {j["id"]: j for j in json.loads(ebb("qstat", "--json"))}
    assert listed[2]["suspended_at"] == pytest.approx(now) and listed[1]["suspended_at"] is None

    # a trial's trap: the table showed paused and suspended, but -s refused them
    def ids(*args: str) -> list[int]:
        return [int(r.split()[0]) for r in ebb("qstat", *args).splitlines()[1:]]

    assert ids("-s", "paused") == [1]
    assert ids("-s", "suspended") == [2]
    assert ids("-s", "Paused", "-s", "suspended") == [1, 2]
    assert ids("-s", "paused", "-s", "queued") == [1, 3]
    assert ids("-s", "running") == [1, 2]  # running has them both
    assert ids("-s", "R") == [1, 2]
    assert ids("-s", "paused", "1", "2", "3") == [1]  # named jobs, one state
    assert [j["id"] for j in json.loads(ebb("qstat", "-s", "suspended", "--json"))] == [2]
    assert [d["id"] for d in json.loads(ebb("qstat", "-f", "-s", "paused", "--json"))] == [1]
    refused = CliRunner().invoke(cli, ["qstat", "-s", "mixed"])
    assert refused.exit_code == 1 and "paused, suspended" in refused.output


def test_what_pods_do_not_honour_is_noted_at_submission(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-o/-e files and Slurm's B: (the warning to the shell only) are not what attempts
    running as pods do: said at submission (stderr, and notes in --json), never silently."""
    policy = home.parent / "policy.yaml"
    policy.write_text("kubernetes: {image: registry.example.com/train:1}\n")
    monkeypatch.setenv("EBBTIDE_POLICY", str(policy))
    result = CliRunner().invoke(cli, ["qsub", "-o", "out.log", "-h", "--", "true"])
    assert result.exit_code == 0, result.output
    assert "note: -o/--output: where attempts run as pods, their output is the pod's log" in (
        result.stderr
    )
    data = json.loads(ebb("qsub", "--json", "-e", "err.log", "-h", "--", "true"))
    assert [n.split(":")[0] for n in data["notes"]] == [
        "-e/--error",
        "no node agent has ever reported to this store",
    ]
    shell = CliRunner().invoke(cli, ["sbatch", "--signal=B:TERM@30", "--hold", "--wrap", "true"])
    assert shell.exit_code == 0, shell.output
    assert "--signal=B:: where attempts run as pods, the warning is the kubelet's SIGTERM" in (
        shell.stderr
    )
    # without a kubernetes: section, nothing to say
    monkeypatch.delenv("EBBTIDE_POLICY")
    quiet = CliRunner().invoke(cli, ["qsub", "-o", "out.log", "-h", "--", "true"])
    assert quiet.exit_code == 0 and "pods" not in quiet.stderr


def test_a_script_job_is_named_after_its_script_as_pbs_and_slurm_name_it(home: Path) -> None:
    """A trial's trap: every script job was named ``script`` in qstat."""
    (home.parent / "eval.sh").write_text("#!/bin/sh\ntrue\n")
    (home.parent / "named.pbs").write_text("#!/bin/sh\n#PBS -N nightly\ntrue\n")
    (home.parent / "my run.sbatch").write_text("#!/bin/sh\n#SBATCH --time=1:00\ntrue\n")
    ebb("qsub", "-h", "eval.sh")  # 1
    ebb("qsub", "-h", "named.pbs")  # 2
    ebb("qsub", "-h", "-N", "mine", "eval.sh")  # 3
    ebb("sbatch", "-H", "my run.sbatch")  # 4
    ebb("sbatch", "-H", "--wrap", "true")  # 5
    ebb("qsub", "-h", "--", "python", "eval.py")  # 6
    names = {j["id"]: j["name"] for j in json.loads(ebb("qstat", "--json"))}
    assert names == {
        1: "eval.sh",
        2: "nightly",
        3: "mine",
        4: "my_run.sbatch",
        5: "wrap",
        6: "python",
    }
    rows = ebb("qstat").splitlines()[1:]
    assert [r.split()[1] for r in rows] == [
        "eval.sh",
        "nightly",
        "mine",
        "my_run.sbatch",
        "wrap",
        "python",
    ]


def test_sbatch_takes_its_own_flags_among_the_options_and_says_what_an_array_id_names(
    home: Path,
) -> None:
    """A trial's traps: ``ebb sbatch --wrap CMD --json`` was refused, ``sbatch -h`` too,
    and an array's "Submitted batch job 7" looked like Slurm's id for every task (``ebb
    qdel 7`` cancels one)."""
    out = json.loads(ebb("sbatch", "-H", "--wrap", "true", "--json"))
    assert out["id"] == 1
    assert "Submit a Slurm batch script" in ebb("sbatch", "-h")
    (home.parent / "arr.sbatch").write_text("#!/bin/sh\n#SBATCH --array=1-3%2\necho $1\n")
    result = CliRunner().invoke(cli, ["sbatch", "-H", "arr.sbatch", "--json", "x"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Submitted batch job 2\n"
    assert result.stderr.endswith(
        "note: job 2 is the array's first task; 2[] names all 3 "
        "(ebb qstat -t 2[], ebb qdel 2[], as Slurm's 2 does)\n"
    )
    # after the script, --json is the script's argument, not ebbtide's
    assert json.loads(ebb("qstat", "-f", "2", "--json"))["submitted"]["args"] == ["--json", "x"]
    array = json.loads(ebb("sbatch", "--json", "-H", "arr.sbatch"))
    assert array["array"] is True and len(array["tasks"]) == 3
    assert any("names all 3" in n for n in array["notes"])


def test_sbatch_help_after_options_a_valued_own_flag_and_a_script_after_the_end_of_options(
    home: Path,
) -> None:
    """A trial's traps: ``sbatch -G 1 -h`` was an "unknown sbatch option", ``--json=x``
    after an option too, and ``sbatch -- -x.sh`` read the script's name as options
    (``-d ash.sh``)."""
    assert "Submit a Slurm batch script" in ebb("sbatch", "-G", "1", "-h")
    assert "Submit a Slurm batch script" in ebb("sbatch", "-H", "--help")
    result = CliRunner().invoke(cli, ["sbatch", "-G", "1", "--json=x", "--wrap", "true"])
    assert result.exit_code == 1 and "--json takes no value" in result.output
    result = CliRunner().invoke(cli, ["sbatch", "--json=x", "--wrap", "true"])  # click's
    assert result.exit_code == 2 and "'--json' does not take a value" in result.output
    (home.parent / "-x.sh").write_text("#!/bin/sh\ntrue\n")
    out = json.loads(ebb("sbatch", "--json", "-H", "--", "-x.sh", "a", "--", "b"))
    job = json.loads(ebb("qstat", "-f", str(out["id"]), "--json"))
    assert job["name"] == "-x.sh" and job["submitted"]["args"] == ["a", "--", "b"]
    out = json.loads(ebb("sbatch", "--json", "-H", "-J", "named", "--", "-x.sh"))
    assert json.loads(ebb("qstat", "-f", str(out["id"]), "--json"))["name"] == "named"
    # after --, nothing is ebbtide's: not --json, not --help, wherever the script is
    for words, args in (
        (["--", "-x.sh", "--json", "a"], ["--json", "a"]),
        (["--", "-x.sh", "--help"], ["--help"]),
        (["-x.sh", "a", "--", "b"], None),  # no -- before it: -x.sh reads as options
        (["ok.sh", "a", "--", "--json"], ["a", "--", "--json"]),
    ):
        (home.parent / "ok.sh").write_text("#!/bin/sh\ntrue\n")
        result = CliRunner().invoke(cli, ["sbatch", "-H", *words])
        if args is None:
            assert result.exit_code == 1 and "Traceback" not in result.output
            continue
        assert result.exit_code == 0 and result.stdout.startswith("Submitted batch job ")
        job_id = result.stdout.split()[-1]
        assert json.loads(ebb("qstat", "-f", job_id, "--json"))["submitted"]["args"] == args
    assert len(json.loads(ebb("qstat", "--json"))) == 5  # the refused ones are not there


def test_commands_on_an_array_leave_its_finished_tasks_alone_and_say_what_they_did(
    home: Path,
) -> None:
    """A trial's traps: with one task of an array cancelled, ``qhold 1[]`` held the others
    and exited 1 on the cancelled one, ``qalter 1[]`` changed none, and ``qalter 2 99999``
    renamed job 2 but printed only the error."""
    ebb("qsub", "-h", "-J", "1-3", "--", "true")  # 1, 2, 3
    ebb("qdel", "1")
    result = CliRunner().invoke(cli, ["qrls", "1[]"])
    assert result.exit_code == 0, result.output
    assert result.stderr == "ebb: note: array 1: 1 finished or not held task left alone\n"
    states = {j["id"]: j["state"] for j in json.loads(ebb("qstat", "-x", "--json"))}
    assert states == {1: "cancelled", 2: "queued", 3: "queued"}
    result = CliRunner().invoke(cli, ["qalter", "1[]", "-N", "renamed"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["2: altered (name=renamed)", "3: altered (name=renamed)"]
    result = CliRunner().invoke(cli, ["qalter", "2", "99999", "-p", "5"])
    assert result.exit_code == 1
    assert result.stdout == "2: altered (priority=5)\n"
    assert "99999" in result.stderr
    ebb("qdel", "2", "3")
    result = CliRunner().invoke(cli, ["qhold", "1[]"])
    assert result.exit_code == 1 and "every task of array 1 has finished" in result.stderr
    # ... and it does not stop the command for the other jobs named (a review's find)
    ebb("qsub", "-h", "--", "true")  # 4
    result = CliRunner().invoke(cli, ["qrls", "1[]", "4", "--json"])
    assert result.exit_code == 1
    assert [(r["id"], r["ok"]) for r in json.loads(result.stdout)] == [(4, True), (1, False)]
    assert {j["id"]: j["state"] for j in json.loads(ebb("qstat", "--json"))} == {4: "queued"}


def test_a_deadline_too_long_is_named_by_the_flag_that_set_it(home: Path) -> None:
    """A trial's traps: ``qalter --deadline 2h`` said "deadline_s: Input should be less
    than or equal to 3600", and Slurm's ``--signal=USR1@7200`` was refused as --deadline."""
    ebb("qsub", "-h", "--", "true")
    result = CliRunner().invoke(cli, ["qalter", "1", "--deadline", "2h"])
    assert result.exit_code == 1
    assert result.stderr == "ebb: error: --deadline: must be at most 3600s (1h), got '2h'\n"
    (home.parent / "sig.sbatch").write_text("#!/bin/sh\n#SBATCH --signal=USR1@7200\ntrue\n")
    result = CliRunner().invoke(cli, ["sbatch", "sig.sbatch"])
    assert result.exit_code == 1
    assert "sig.sbatch line 2: --signal @SECS: must be at most 3600s (1h)" in result.stderr
    result = CliRunner().invoke(cli, ["sbatch", "--signal=USR1@7200", "--wrap", "true"])
    assert "command line: --signal @SECS: must be at most 3600s (1h)" in result.stderr
    # a later --deadline-setting line is named by its own flag
    ok = CliRunner().invoke(cli, ["sbatch", "-H", "--signal=USR1@60", "--wrap", "true"])
    assert ok.exit_code == 0, ok.output


def test_a_report_or_recommendation_for_a_queue_the_policy_lacks_says_so(home: Path) -> None:
    """A trial's trap: ``ebb report -q nope`` printed zeros as if nothing had happened."""
    ebb("qsub", "-h", "--", "true")  # a store to read
    for args in (["report", "--since", "1d", "-q", "nope"], ["recommend", "-q", "nope"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert "ebb: note: queue: unknown queue 'nope'; known queues: default" in result.stderr
    quiet = CliRunner().invoke(cli, ["report", "--since", "1d", "-q", "default"])
    assert quiet.exit_code == 0 and "unknown queue" not in quiet.stderr


def test_a_whole_gpu_on_nodes_measured_through_prometheus_leaves_the_planning_margin(
    home: Path,
) -> None:
    """A review's find: there the planner keeps the planning margin (8GiB) back on every
    card too, so the card less the margin (78GiB) never fit, and 75GiB was accepted."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    card = {"index": 0, "memory_mib": 81920, "eviction_trigger": False}
    store.heartbeat("prom-1", started_at=time.time(), devices=[card])
    store.close()
    out = json.loads(ebb("qsub", "-h", "--json", "-l", "ngpus=1", "--", "true"))
    assert out["notes"][0].startswith(
        "1 whole GPU with no gpumem: granted 70GiB of memory on each, the smallest card here "
        "(80GiB) less the 10GiB kept for the online side"
    )
    result = CliRunner().invoke(cli, ["qsub", "-l", "gpu=1,gpumem=75GiB", "--", "true"])
    assert result.exit_code == 1
    assert "(of which 2GiB a card is always kept for the online side, 8GiB more where " in (
        result.output
    )
    ebb("qsub", "-h", "-l", "gpu=1,gpumem=70GiB", "--", "true")


def test_ebb_events_picks_the_kinds_asked_for(home: Path) -> None:
    """A trial's trap: a job that checkpoints twice a second fills ``ebb events`` with
    ``checkpointed`` lines, and there was no way to see only the rest."""
    ebb("qsub", "--", "true")
    ebb("qhold", "1")
    ebb("qrls", "1")
    kinds = [line.split()[1] for line in ebb("events", "1").splitlines()]
    assert kinds == ["submitted", "held", "released"]
    assert [ln.split()[1] for ln in ebb("events", "1", "-t", "held,released").splitlines()] == [
        "held",
        "released",
    ]
    assert [ln.split()[1] for ln in ebb("events", "1", "-t", "^held").splitlines()] == [
        "submitted",
        "released",
    ]
    assert [e["type"] for e in json.loads(ebb("events", "1", "-t", "held", "--json"))] == ["held"]
    bad = CliRunner().invoke(cli, ["events", "1", "-t", "evictd"])
    assert bad.exit_code == 1 and "-t: no event type 'evictd'; the types: " in bad.stderr


def test_draining_again_without_a_reason_keeps_the_reason_given(home: Path) -> None:
    """A trial's trap: ``ebb node drain gpu-a/0`` a second time erased "fan"."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    device = {"index": 0, "memory_mib": 81920, "online_compute_pct": 0.0, "online_memory_mib": 0.0}
    store.heartbeat("gpu-a", started_at=time.time(), devices=[device])
    store.close()
    ebb("node", "drain", "gpu-a/0", "--reason", "fan")
    ebb("node", "drain", "gpu-a/0")
    [node] = json.loads(ebb("nodes", "--json"))
    assert node["devices"][0]["drained"].endswith(": fan")
    ebb("node", "drain", "gpu-a/0", "--reason", "new fan")
    [node] = json.loads(ebb("nodes", "--json"))
    assert node["devices"][0]["drained"].endswith(": new fan")
    # undrain says whether there was anything to undo (a trial's trap: "back in service"
    # of a device that never left it)
    assert ebb("node", "undrain", "gpu-a/0") == "gpu-a/0 back in service\n"
    assert ebb("node", "undrain", "gpu-a/0") == "gpu-a/0 was in service already\n"
    assert ebb("node", "undrain", "gpu-a") == "gpu-a was in service already\n"
    # a trial's trap: a device undrained under its node's drain was "back in service"
    ebb("node", "drain", "gpu-a", "--reason", "maint")
    said = ebb("node", "undrain", "gpu-a/0")
    assert "gpu-a/0: its own drain and fault are lifted, but it stays out of service" in said
    assert "maint; ebb node undrain gpu-a returns the node" in said
    out = json.loads(ebb("node", "undrain", "gpu-a/0", "--json"))
    assert out["drained"] is True and out["node_drained"].endswith(": maint")
    assert ebb("node", "undrain", "gpu-a") == "gpu-a back in service\n"


def test_undraining_a_node_keeps_its_devices_own_drains_and_names_them(home: Path) -> None:
    """An SRE's trap: ``ebb node undrain gpu-a`` said "gpu-a back in service" and the fan
    drain of gpu-a/1 was gone without a word."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    devices = [
        {"index": i, "memory_mib": 81920, "online_compute_pct": 0.0, "online_memory_mib": 0.0}
        for i in range(4)
    ]
    store.heartbeat("gpu-a", started_at=time.time(), devices=devices)
    store.close()
    ebb("node", "drain", "gpu-a/1", "--reason", "fan")
    ebb("node", "drain", "gpu-a/3")
    ebb("node", "drain", "gpu-a", "--reason", "upgrade")
    [node] = json.loads(ebb("nodes", "--json"))
    assert node["devices"][1]["device_drain"]["reason"] == "fan"
    assert node["devices"][0]["device_drain"] is None
    me = node["devices"][3]["device_drain"]["by"]
    assert ebb("node", "undrain", "gpu-a") == (
        "gpu-a back in service; "
        "gpu-a/1 stays drained (fan): ebb node undrain gpu-a/1; "
        f"gpu-a/3 stays drained (by {me}): ebb node undrain gpu-a/3\n"
    )
    lines = ebb("nodes").splitlines()[1:]
    states = [line.rsplit("  ", 1)[1] for line in lines]
    assert states[0] == "ok" and states[2] == "ok"
    assert states[1].startswith("gpu-a/1 drained by ") and states[1].endswith(": fan")
    # nothing left on the node itself: it says so, and still names the device drains
    out = json.loads(ebb("node", "undrain", "gpu-a", "--json"))
    assert out["drained"] is False and out["stays_drained"] == [
        {"device": 1, "by": me, "reason": "fan"},
        {"device": 3, "by": me, "reason": ""},
    ]
    said = ebb("node", "undrain", "gpu-a")
    assert said.startswith("gpu-a was not drained; gpu-a/1 stays drained (fan)")
    ebb("node", "undrain", "gpu-a/1")
    ebb("node", "undrain", "gpu-a/3")
    assert ebb("node", "undrain", "gpu-a") == "gpu-a was in service already\n"
    assert json.loads(ebb("node", "undrain", "gpu-a", "--json"))["stays_drained"] == []


def test_a_heartbeat_from_a_clock_a_little_ahead_is_0s_old(home: Path) -> None:
    """An SRE's trap: ``ebb nodes`` showed an age of ``-0.0s``."""
    home.mkdir(parents=True, exist_ok=True)
    ahead = FakeClock(start=time.time() + 5)
    Store(f"sqlite:///{home / 'ebbtide.db'}", clock=ahead).heartbeat(
        "gpu-a", started_at=ahead.time(), devices=[]
    )
    [node] = json.loads(ebb("nodes", "--json"))
    assert node["heartbeat_age_s"] == 0.0
    assert ebb("nodes").splitlines()[1].split()[:2] == ["gpu-a", "0.0s"]


def test_ebb_token_says_which_store_it_uses_when_a_server_is_named(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's trap: with EBBTIDE_URL set, ``ebb token create`` wrote the token into the
    local default store, and the server knew nothing of it."""
    monkeypatch.setenv("EBBTIDE_URL", "http://127.0.0.1:18786")
    # a later trial's trap: where no store was, an empty one was made for the token
    for args in (["token", "create", "bob"], ["token", "list"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"ebb: error: there is no ebbtide store at {home}/")
        assert "not behind EBBTIDE_URL=http://127.0.0.1:18786" in result.stderr
        assert not (home / "ebbtide.db").exists()
    home.mkdir(parents=True)
    Store(f"sqlite:///{home / 'ebbtide.db'}").close()  # the server's store, on its host
    result = CliRunner().invoke(cli, ["token", "list"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(
        f"ebb token: note: tokens live in the store itself, sqlite:///{home}/ebbtide.db "
        "(EBBTIDE_DB_URL, else EBBTIDE_HOME), not behind EBBTIDE_URL=http://127.0.0.1:18786"
    )
    monkeypatch.delenv("EBBTIDE_URL")
    assert CliRunner().invoke(cli, ["token", "list"]).stderr == ""


def test_ebb_token_says_an_admins_token_is_one_and_a_second_revoke_changes_nothing(
    home: Path,
) -> None:
    """A trial's traps: a token for root was handed out without a word, and revoking a
    token twice said "revoked" twice."""
    result = CliRunner().invoke(cli, ["token", "create", "root"])
    assert result.exit_code == 0, result.output
    assert "ebb token: note: root is an admin here" in result.stderr
    result = CliRunner().invoke(cli, ["token", "create", "bob"])
    assert "is an admin" not in result.stderr
    assert ebb("token", "revoke", "2").strip() == "token 2 (bob) revoked"
    again = ebb("token", "revoke", "2").strip()
    assert again.startswith("token 2 (bob) was already revoked, by ")


def test_qstat_full_shows_the_jobs_result(home: Path) -> None:
    """A trial's trap: what a job gave with ``ebbtide.job.result()`` was only in
    ``ebb events`` and the SDK's ``handle.result()``, not in ``qstat -f``."""
    ebb("qsub", "--", "true")  # 1
    ebb("qsub", "--", "true")  # 2: no result
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    for job_id in (1, 2):
        store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024
        )
        store.mark_started(job_id, 1, pid=1, stdout_path="o", stderr_path="e")
    store.record_result(1, 1, {"loss": 0.5})
    store.record_result(1, 1, {"loss": 0.25})  # the last one is the job's
    store.finish_attempt(1, 1, exit_code=0)
    store.close()
    assert json.loads(ebb("qstat", "-f", "1", "--json"))["result"] == {"loss": 0.25}
    assert 'result: {"loss": 0.25}' in ebb("qstat", "-f", "1")  # JSON, not a Python repr
    assert json.loads(ebb("qstat", "-f", "2", "--json"))["result"] is None


def test_a_job_no_node_runs_for_its_owner_is_refused_not_failed_at_its_start(home: Path) -> None:
    """A trial's trap: another user's job on a box whose agent runs only its own user's
    (``ebb up`` as root, an owner-mode agent that is not root) was accepted, then failed
    at its start.  Every node's heartbeat says whose jobs it runs; the submission is
    refused when none runs the owner's, and nothing is stored."""
    me = user_name(os.geteuid())
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    devices = [
        {"index": 0, "memory_mib": 81920, "online_compute_pct": 0.0, "online_memory_mib": 0.0}
    ]
    store.heartbeat("gpu-a", started_at=time.time(), devices=devices, runs_jobs_of="user:zed")
    result = CliRunner().invoke(cli, ["qsub", "--", "true"])
    assert result.exit_code == 1, result.output
    assert f"owner: no node runs {me}'s jobs: node gpu-a runs only zed's jobs" in result.output
    assert "--run-as owner" in result.output and "--allow-future" in result.output
    assert "Traceback" not in result.output
    assert json.loads(ebb("qstat", "--json")) == []
    ebb("qsub", "--allow-future", "--", "true")  # such a node will join
    nodes = json.loads(ebb("nodes", "--json"))
    assert [n["runs_jobs_of"] for n in nodes] == ["user:zed"]
    assert "runs: only zed's jobs" in ebb("nodes", "-f")
    # one node that runs them is enough; so is one whose agent did not say (older)
    for name, runs in (("gpu-b", f"user:{me}"), ("gpu-c", None)):
        store.forget_node("gpu-b")
        store.heartbeat(name, started_at=time.time(), devices=devices, runs_jobs_of=runs)
        ebb("qsub", "--", "true")
    assert len(json.loads(ebb("qstat", "--json"))) == 3


def test_qstat_says_when_no_scheduler_runs_to_plan_a_queued_job(home: Path) -> None:
    """A trial's trap: with ``ebb up`` stopped, a queued job's REASON stayed empty and
    nothing said why."""
    from ebbtide.scheduling.leader import LeaderLock

    ebb("qsub", "--", "true")
    result = CliRunner().invoke(cli, ["qstat"])
    assert result.exit_code == 0
    assert "no scheduler is running on this store" in result.stderr
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    lock = LeaderLock(store.engine, home)
    assert lock.try_acquire()
    try:
        assert CliRunner().invoke(cli, ["qstat"]).stderr == ""
    finally:
        lock.release()
    # a reason given by a scheduler that stopped since: shown, and said to be its
    # (a trial's trap: a stale REASON hid that none runs)
    store.set_reasons({1: "waits for headroom"})
    assert CliRunner().invoke(cli, ["qstat"]).stderr == (
        "ebb: note: no scheduler is running on this store: queued jobs wait until one does "
        "(ebb up, or ebb scheduler); a REASON shown is what the last one said\n"
    )
    assert lock.try_acquire()
    try:
        assert CliRunner().invoke(cli, ["qstat"]).stderr == ""
    finally:
        lock.release()


def test_policy_explain_explains_the_policy_in_force(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's trap: ``ebb policy explain`` re-read ``$EBBTIDE_POLICY``'s file, not the
    policy the scheduler runs with (a broken edit made it fail, though the scheduler kept
    its old policy)."""
    broken = home.parent / "edited.yaml"
    broken.write_text("windows: [\n")
    monkeypatch.setenv("EBBTIDE_POLICY", str(broken))
    nothing = CliRunner().invoke(cli, ["policy", "explain"])  # no store: the file
    assert nothing.exit_code == 1 and "edited.yaml" in nothing.output
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.publish_policy(
        "windows:\n  - {name: nights, kind: cron, schedule: '0 22 * * *', duration: 8h}\n",
        "/etc/ebbtide/ebbtide.yaml",
    )
    data = json.loads(ebb("policy", "explain", "--json", "--at", "2026-12-01T23:00:00+00:00"))
    assert data["policy"] == "as the scheduler published it (/etc/ebbtide/ebbtide.yaml)"
    assert [w["name"] for w in data["windows"]] == ["nights"] and data["allowed"] is True
    text = ebb("policy", "explain", "--at", "2026-12-01T23:00:00+00:00")
    assert text.startswith("policy: as the scheduler published it (/etc/ebbtide/ebbtide.yaml)\n")
    # and says that EBBTIDE_POLICY's file is not the one in force
    other = CliRunner().invoke(cli, ["policy", "explain"]).stderr
    assert other == (
        "ebb: note: the policy in force is the scheduler's, from /etc/ebbtide/ebbtide.yaml, "
        f"not EBBTIDE_POLICY's {broken}: a scheduler reads only its own file; change that "
        f"one, or restart the scheduler with EBBTIDE_POLICY={broken}\n"
    )
    # the file the scheduler loaded, edited since (a reload failed, said only in its log)
    store.publish_policy("windows: []\n", str(broken))
    stale = CliRunner().invoke(cli, ["policy", "explain"])
    assert stale.exit_code == 0 and stale.stdout.startswith("policy: as the scheduler published")
    assert f"ebb: note: {broken} has changed since the scheduler loaded it" in stale.stderr
    broken.write_text("windows: []\n")  # as loaded: nothing to say
    assert "has changed" not in CliRunner().invoke(cli, ["policy", "explain"]).stderr
    broken.write_text("windows: [\n")
    # --policy FILE: that file, an edit before it is loaded
    edit = CliRunner().invoke(cli, ["policy", "explain", "--policy", str(broken)])
    assert edit.exit_code == 1 and "edited.yaml" in edit.output
    # a store out of reach: the file, with a note (it explained offline before)
    good = home.parent / "good.yaml"
    good.write_text("windows: []\n")
    monkeypatch.setenv("EBBTIDE_POLICY", str(good))
    monkeypatch.setenv("EBBTIDE_DB_URL", "postgresql://u:secret@127.0.0.1:1/db")
    away = CliRunner().invoke(cli, ["policy", "explain"])
    assert away.exit_code == 0 and away.stdout.startswith(f"policy: {good}\n")
    assert "the store's policy cannot be read" in away.stderr and "secret" not in away.output


def test_a_python_script_with_no_shebang_is_taken_with_a_note(home: Path) -> None:
    """A trial's trap: ``ebb qsub myjob.py 5`` ran the script under /bin/sh, which failed
    with ``import: not found``, and nothing said so at submission."""

    def said(*args: str) -> str:
        result = CliRunner().invoke(cli, ["qsub", *args])
        assert result.exit_code == 0, result.output
        return result.stderr

    (home.parent / "myjob.py").write_text("import sys\nprint(sys.argv)\n")
    err = said(str(home.parent / "myjob.py"), "5")
    assert "myjob.py has no #! line, so it runs under /bin/sh" in err
    assert "#!/usr/bin/env python3" in err and "ebb qsub -- python3" in err
    (home.parent / "ok.py").write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert "no #! line" not in said(str(home.parent / "ok.py"))
    # -S says what runs it
    assert "no #! line" not in said("-S", "/usr/bin/python3", str(home.parent / "myjob.py"))


def test_qdel_of_an_arrays_id_says_it_is_one_task(home: Path) -> None:
    """A trial's trap: ``ebb qdel 62``, 62 being an array's id, cancelled its first task
    alone, and said nothing."""
    assert ebb("qsub", "-J", "1-3", "--", "true").strip() == "1[]"
    result = CliRunner().invoke(cli, ["qdel", "1"])
    assert result.exit_code == 0, result.output
    assert "1 is task 1[1] of an array: `ebb qdel 1[]` acts on all its tasks" in result.stderr
    result = CliRunner().invoke(cli, ["qdel", "1[]"])
    assert result.exit_code == 0 and "is task" not in result.stderr


def test_a_task_named_beside_its_array_is_one_job(home: Path) -> None:
    assert ebb("qsub", "-J", "0-3", "--", "true").strip() == "1[]"
    out = ebb("qstat", "--json", "1[]", "2", "3")
    ids = [j["id"] for j in json.loads(out)]
    assert sorted(ids) == [1, 2, 3, 4] and len(ids) == len(set(ids))


def test_logs_of_a_job_cancelled_before_it_ran_say_it_never_started(home: Path) -> None:
    ebb("qsub", "-h", "--", "true")
    ebb("qdel", "1")
    shown = CliRunner().invoke(cli, ["logs", "1"])
    assert shown.exit_code == 1
    assert "job 1 never started (cancelled by" in shown.stderr
    assert "has not started yet" not in shown.stderr  # (as if it still might)
    followed = CliRunner().invoke(cli, ["logs", "-f", "1"])  # the same: nothing to follow
    assert followed.exit_code == 1 and followed.stderr == shown.stderr


def test_logs_of_an_attempt_that_could_not_start_say_so_not_that_its_file_is_gone(
    home: Path, tmp_path: Path
) -> None:
    # (-o into a directory that is not there: the attempt never started, and ebb logs
    # said the file "is not there (no output yet; or it was moved or deleted ...)")
    out = tmp_path / "missing" / "out.txt"
    ebb("qsub", "-o", str(out), "--", "true")
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.dispatch(1, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1)
    store.mark_started(1, 1, pid=1, stdout_path=str(out), stderr_path="e")
    why = f"could not start 'true' in /tmp: could not open {out} for the job's output"
    store.finish_attempt(1, 1, exit_code=127, why=why, final=True)
    store.close()
    shown = CliRunner().invoke(cli, ["logs", "1"])
    assert shown.exit_code == 1
    assert shown.stderr.startswith(f"ebb: error: job 1 attempt 1 never started ({why}")
    assert shown.stderr.rstrip().endswith("so it wrote no stdout")
    assert "moved or deleted" not in shown.stderr


def test_a_slurm_submitter_is_told_how_slurm_asks_for_gpu_memory(home: Path) -> None:
    # (told "-l gpumem=SIZE", a flag sbatch does not have; its --mem-per-gpu is host memory)
    slurm = CliRunner().invoke(cli, ["sbatch", "--gres=gpu:1", "--wrap", "true"])
    assert slurm.exit_code == 0, slurm.output
    assert "an '#EBB -l gpumem=SIZE' line asks for what it needs" in slurm.stderr
    pbs = CliRunner().invoke(cli, ["qsub", "-l", "ngpus=1", "--", "true"])
    assert "; -l gpumem=SIZE asks for what it needs" in pbs.stderr


def test_a_finished_job_is_said_to_have_ended_not_to_be_its_state(home: Path) -> None:
    ebb("qsub", "--", "true")
    ebb("qdel", "1")
    released = CliRunner().invoke(cli, ["qrls", "1"])
    assert released.exit_code == 1
    assert "job 1 was cancelled, not held" in released.stderr  # (not "is cancelled")
    held = CliRunner().invoke(cli, ["qhold", "1"])
    assert "job 1 was cancelled; only queued or waiting jobs can be held" in held.stderr
    altered = CliRunner().invoke(cli, ["qalter", "-p", "3", "1"])
    assert "job 1 was cancelled; only held, waiting or queued jobs can be altered" in (
        altered.stderr
    )
    ebb("qsub", "--", "true")
    queued = CliRunner().invoke(cli, ["qrls", "2"])
    assert "job 2 is queued, not held" in queued.stderr


def test_qstat_f_names_a_script_jobs_file(home: Path) -> None:
    # (a script job showed only "command: ['script']": which script was nowhere)
    Path("train.pbs").write_text("#PBS -N trainer\necho hi\n")
    Path("eval.sbatch").write_text("#!/bin/bash\n#SBATCH -J ev\necho hi\n")
    ebb("qsub", "train.pbs")
    ebb("sbatch", "eval.sbatch")
    for job_id, path in (("1", "train.pbs"), ("2", "eval.sbatch")):
        shown = json.loads(ebb("qstat", "-f", "--json", job_id))
        submitted = shown["submitted"]
        assert (submitted["command"], submitted["script_path"]) == (["script"], path)
        full = ebb("qstat", "-f", job_id)
        assert f"script_path: {path}" in full
        # (and showed Python's reprs: "command: ['script']", "args: []", "image: None")
        assert f"command: (the script {path}, with its args)" in full
        assert "args: none" in full and "image: -" in full and "None" not in full
    ebb("qsub", "--", "python", "-c", "print('a b')")
    assert "command: python -c 'print('\"'\"'a b'\"'\"')'" in ebb("qstat", "-f", "3")


def test_qstat_f_shows_how_a_job_joined_its_output(home: Path) -> None:
    # (-j eo -o o.txt showed only where the attempt's log went, not the join asked for)
    ebb("qsub", "-j", "eo", "-o", "o.txt", "--", "true")
    shown = json.loads(ebb("qstat", "-f", "--json", "1"))["submitted"]
    assert (shown["join"], shown["stdout"], shown["stderr"]) == ("eo", None, None)
    assert "join: eo" in ebb("qstat", "-f", "1")
