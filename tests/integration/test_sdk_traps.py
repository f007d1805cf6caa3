"""Traps a new user of the SDK and of ``qalter`` met, each kept from coming back: a
check ``qsub`` made that ``qalter`` skipped, an array's handle that answered for its
first task alone, raw Python errors for a wrong argument, a ``ConfigError`` where a
``SpecError`` was documented, a store made where the settings were wrong."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.client import Client
from ebbtide.config.settings import Settings
from ebbtide.errors import ConfigError, SpecError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

GIB = 1024


def ebb(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result.output


def _node(home: Path, name: str = "vm", gpus: int = 2) -> None:
    """A node with ``gpus`` 80 GiB cards has reported."""
    home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    devices = [
        {"index": i, "memory_mib": 80 * GIB, "online_compute_pct": 5.0, "online_memory_mib": 1024}
        for i in range(gpus)
    ]
    store.heartbeat(name, started_at=time.time(), devices=devices)
    store.close()


def test_qalter_refuses_a_slice_no_node_could_ever_hold_as_qsub_does(home: Path) -> None:
    _node(home)
    refused = ebb("qsub", "-l", "gpu=2,gpumem=100GiB", "--", "true", code=1)
    assert "no node could ever hold it" in refused
    ebb("qsub", "-h", "-l", "gpu=10%,gpumem=8GiB", "--", "true")  # job 1, held
    for resources in ("gpu=2,gpumem=100GiB", "gpu=3"):
        out = ebb("qalter", "1", "-l", resources, code=1)
        assert out.startswith("ebb: error: ") and "altered" not in out, out
    job = json.loads(ebb("qstat", "-f", "1", "--json"))
    assert (job["compute_pct"], job["gpus"], job["memory_mib"]) == (10.0, 0, 8 * GIB)
    ebb("qalter", "1", "-p", "5")  # what it asked for stays
    assert json.loads(ebb("qstat", "-f", "1", "--json"))["memory_mib"] == 8 * GIB
    # what fits is altered; a whole GPU gets its card's memory, as at submission
    assert ebb("qalter", "1", "-l", "gpu=1").startswith("1: altered (gpu=1)")
    job = json.loads(ebb("qstat", "-f", "1", "--json"))
    assert job["gpus"] == 1 and job["memory_mib"] > 70 * GIB


def test_qalter_of_a_whole_array_leaves_its_running_tasks_alone(home: Path) -> None:
    """A trial's trap: ``qalter 1[]`` altered the queued tasks, then failed on the
    running one (exit 1): PBS alters what has not run yet."""
    ebb("qsub", "-J", "1-3", "-l", "gpu=10%", "--", "true")  # 1..3
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    store.dispatch(1, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1024)
    store.mark_started(1, 1, pid=1, stdout_path="o", stderr_path="e")
    store.close()
    result = CliRunner().invoke(cli, ["qalter", "1[]", "-p", "5"])
    assert result.exit_code == 0, result.output
    assert "array 1: 1 running or finished task left alone" in result.stderr
    assert result.stdout.splitlines() == ["2: altered (priority=5)", "3: altered (priority=5)"]
    # a running job named on its own is still refused
    assert "only held, waiting or queued" in ebb("qalter", "1[1]", "-p", "5", code=1)


def test_an_array_is_submit_manys_not_a_single_handles(home: Path) -> None:
    with Client() as client:
        with pytest.raises(SpecError, match=r"^array: .*submit_many") as info:
            client.submit(command=["true"], array="1-3")
        assert info.value.field == "array" and client.list() == []  # nothing submitted
        tasks = client.submit_many(command=["true"], array="1-3")
        assert len(tasks) == 3


def test_the_sdk_takes_handles_ids_and_field_mappings_and_names_what_it_cannot(
    home: Path,
) -> None:
    with Client() as client:
        job = client.submit({"command": ["true"], "gpu": "10%"})  # a mapping of fields
        assert client.get(job).compute_pct == 10.0
        for ref in (job, int(job), client.get(job)):
            assert client.as_dict(ref)["id"] == job
        with pytest.raises(SpecError, match=r"^job: expected a whole number"):
            client.as_dict("1")  # type: ignore[arg-type]
        with pytest.raises(SpecError, match=r"^spec: expected a JobSpec .* got list"):
            client.submit(["true"])  # type: ignore[arg-type]


def test_an_unknown_queue_is_a_spec_error_naming_the_queue(home: Path) -> None:
    with Client() as client:
        with pytest.raises(SpecError, match=r"^queue: unknown queue 'nosuch'") as info:
            client.submit(command=["true"], queue="nosuch")
        assert info.value.field == "queue" and client.list() == []


def test_a_whole_gpu_before_any_node_reported_says_what_it_is_granted(home: Path) -> None:
    """A trial's trap: granted 1GiB of memory (the default) without a word."""
    result = CliRunner().invoke(cli, ["qsub", "-l", "ngpus=1", "--", "true"])
    assert result.exit_code == 0, result.output
    assert "no node has reported its cards yet: granted 1GiB" in result.stderr
    assert "-l gpumem=SIZE" in result.stderr


def test_a_mistyped_sqlite_directory_or_a_bad_policy_makes_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nodir" / "x.db"
    with pytest.raises(ConfigError, match=r"^EBBTIDE_DB_URL: .*nodir does not exist"):
        Settings.from_env({"EBBTIDE_DB_URL": f"sqlite:///{missing}"})
    assert not missing.parent.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  default: {bogus: 1}\n")
    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EBBTIDE_POLICY", str(bad))
    out = ebb("qsub", "--", "true", code=1)
    assert "bad.yaml:2" in out and "bogus" in out
    assert not (tmp_path / "home" / "ebbtide.db").exists()


def test_a_scripts_unknown_queue_is_named_with_its_line(home: Path, tmp_path: Path) -> None:
    """A trial's trap: other bad ``#PBS`` lines were named, an unknown ``-q`` was not."""
    script = tmp_path / "s1.sh"
    script.write_text("#!/bin/sh\n#PBS -N s1\n#PBS -q workq\necho hi\n")
    out = ebb("qsub", str(script), code=1)
    assert out.startswith(f"ebb: error: {script} line 3: queue: unknown queue 'workq'"), out
    out = ebb("qsub", "-q", "nope", str(script), code=1)  # the flag's, which wins: no line
    assert out.startswith("ebb: error: queue: unknown queue 'nope'"), out


def test_qalter_checks_only_a_new_slice_and_keeps_memory_honest(home: Path) -> None:
    """A review's catches: ``-p`` on a job submitted with allow_future was refused (no
    node could ever hold it, and qalter has no --allow-future); whole GPUs made a
    fraction kept a whole card's memory, blocking the card for anyone sharing it."""
    _node(home)
    with Client() as client:
        future = client.submit(command=["true"], gpu="4", allow_future=True)
        assert client.alter(future, priority=5).priority == 5
        whole = client.submit(command=["true"], gpu="1", hold=True)
        card = client.get(whole).memory_mib
        assert card > 70 * GIB
        with pytest.raises(SpecError, match=r"^gpumem: the job had whole GPUs"):
            client.alter(whole, gpu="50%")
        half = client.alter(whole, gpu="50%", gpumem="8GiB")
        assert (half.compute_pct, half.gpus, half.memory_mib) == (50.0, 0, 8 * GIB)
        assert client.alter(whole, gpu="2").memory_mib == card  # fraction made whole
        assert client.alter(whole, gpu="1").memory_mib == card  # whole stays whole


def test_fields_on_a_mapping_replace_what_they_set_as_on_a_spec(home: Path) -> None:
    with Client() as client:
        job = client.submit({"command": ["true"], "compute_pct": 10}, gpu="30%")
        assert client.get(job).compute_pct == 30.0


def test_a_client_of_a_server_does_not_check_a_store_it_never_opens(tmp_path: Path) -> None:
    env = {"EBBTIDE_URL": "http://h:8786", "EBBTIDE_DB_URL": f"sqlite:///{tmp_path}/no/x.db"}
    assert Settings.from_env(env).url == "http://h:8786"


def test_a_working_directory_missing_here_is_noted_at_submission(
    home: Path, tmp_path: Path
) -> None:
    """A trial's trap: ``qsub -d nope/dir`` was taken without a word, and the job failed
    at its start (exit code 127). Not refused: the node it runs on may have it."""
    result = CliRunner().invoke(cli, ["qsub", "-d", "nope/dir", "--", "true"])
    assert result.exit_code == 0, result.output
    assert f"the working directory {tmp_path / 'nope' / 'dir'} does not exist here" in (
        result.stderr
    )
    result = CliRunner().invoke(cli, ["qsub", "-d", str(tmp_path), "--", "true"])
    assert "does not exist here" not in result.stderr


def test_qalter_says_what_a_new_whole_gpu_slice_is_given(home: Path) -> None:
    _node(home)
    ebb("qsub", "-h", "-l", "gpu=10%", "--", "true")  # job 1
    result = CliRunner().invoke(cli, ["qalter", "1", "-l", "gpu=1"])
    assert result.exit_code == 0, result.output
    assert "ebb qalter: note: 1 whole GPU with no gpumem: granted 78GiB" in result.stderr


def test_an_sdk_client_that_makes_a_new_store_says_where(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A trial's trap: ``Client()`` under a mistyped ``EBBTIDE_HOME`` made an empty store
    in silence, and ``get(5)`` said only that there is no job 5."""
    with caplog.at_level("WARNING", logger="ebbtide"):
        Client().close()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [
        f"there was no ebbtide store at {home / 'ebbtide.db'}: made a new, empty one (check "
        "EBBTIDE_HOME or EBBTIDE_DB_URL if jobs were expected there)"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ebbtide"):
        Client().close()  # there now: nothing to say
        Client(create=True).close()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_state_that_is_not_one_is_a_spec_error(home: Path) -> None:
    client = Client(create=True)
    try:
        for bad in (5, object(), ["queued", 3]):
            with pytest.raises(SpecError, match=r"^state: expected one of held"):
                client.list(state=bad)  # type: ignore[arg-type]
    finally:
        client.close()


def test_a_scripts_directives_are_read_by_from_script_and_noted_when_not(
    home: Path, tmp_path: Path
) -> None:
    """A trial's trap: ``client.submit(script=text)`` ran the script with the defaults,
    its ``#PBS -l gpu=...`` lines unread, and nothing said so."""
    script = tmp_path / "train.sh"
    script.write_text(
        '#!/bin/sh\n#PBS -N trainer\n#PBS -l gpu=25%,gpumem=4GiB\n#PBS -m abe\necho "$@"\n'
    )
    _node(home)
    client = Client(Settings.from_env({"EBBTIDE_HOME": str(home)}))
    try:
        plain = client.get(client.submit(script=script.read_text()).id)
        assert (plain.name, plain.compute_pct) == ("script", 10.0)  # the defaults, noted:
        assert client.last_notes[0] == (
            "script line 2: its #PBS lines are not read when the script's text is submitted "
            "as it is (they set nothing); JobSpec.from_script(PATH) reads them as ebb qsub "
            "PATH does"
        )
        notes: list[str] = []
        spec = JobSpec.from_script(script, "--epochs", "3", notes=notes)
        assert notes == [
            f"{script} line 4: -m abe: accepted, without effect: mail is not sent; watch the "
            "job with ebb qstat or ebb events"
        ]
        read = client.get(client.submit(spec).id)
        assert (read.name, read.compute_pct, read.memory_mib) == ("trainer", 25.0, 4 * GIB)
        assert json.loads(read.spec_json)["args"] == ["--epochs", "3"]
        assert not any("not read" in n for n in client.last_notes)
        # fields on top override the script's lines, as qsub's command line does
        over = client.get(client.submit(spec, gpu="50%", name="big").id)
        assert (over.name, over.compute_pct, over.memory_mib) == ("big", 50.0, 4 * GIB)
        # and what qsub would name, the SDK names: the file, the line
        bad = tmp_path / "bad.sh"
        bad.write_text("#!/bin/sh\n#PBS -l gpu=lots\necho\n")
        with pytest.raises(SpecError, match=f"^{re.escape(str(bad))} line 2: "):
            JobSpec.from_script(bad)
        with pytest.raises(SpecError, match=r"^SCRIPT: cannot read"):
            JobSpec.from_script(tmp_path / "missing.sh")
    finally:
        client.close()
