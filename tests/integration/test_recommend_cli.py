"""``ebb recommend`` and ``qstat -f``'s hint, on a store whose attempts were measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store

GIB = 1024


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EBBTIDE_HOME", str(home))
    monkeypatch.delenv("EBBTIDE_URL", raising=False)
    s = Store(f"sqlite:///{home / 'ebbtide.db'}")
    s.heartbeat("n1", started_at=0.0, devices=[{"index": 0, "memory_mib": 80 * GIB}])
    yield s
    s.close()


def ran(
    store: Store,
    owner: str = "alice",
    *,
    name: str = "train",
    gpu: str = "50%",
    gpumem: str = "16GiB",
    usage: tuple[float, float] | None = (18.0, 6 * GIB),
    samples: int = 600,
) -> int:
    """A job whose one attempt ran to success, with its p95 compute and peak memory."""
    [job_id] = store.submit(
        JobSpec(command=["train"], name=name, gpu=gpu, gpumem=gpumem),
        owner,
        defaults_deadline_s=30,
    )
    job = store.get(job_id)
    attempt = store.dispatch(
        job_id,
        expected_attempts=0,
        node="n1",
        devices=(0,),
        compute_pct=job.compute_pct,
        memory_mib=job.memory_mib,
    )
    store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    measured = None
    if usage is not None:
        measured = {
            "usage_samples": samples,
            "used_compute_p95_pct": usage[0],
            "used_compute_peak_pct": usage[0] + 13,
            "used_memory_p95_mib": usage[1] - 900,
            "used_memory_peak_mib": usage[1],
        }
    store.finish_attempt(job_id, attempt, exit_code=0, usage=measured)
    return job_id


def ebb(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result.output


def test_recommend_one_job(store: Store) -> None:
    job_id = ran(store)
    text = ebb("recommend", str(job_id))
    assert text.splitlines()[:6] == [
        f"job {job_id} (train, alice): 1 attempt measured, 600 samples",
        "  used       compute p95 18%, peak 31%; memory p95 5.1GiB, peak 6GiB",
        "  asked      -l gpu=50%,gpumem=16GiB",
        "  recommend  -l gpu=25%,gpumem=8GiB",
        "  frees      25% compute and 8GiB memory per device",
        "",
    ]
    assert "p95 + 20%, rounded up to 5%" in text and "peak + 10% + 1GiB" in text
    data = json.loads(ebb("recommend", str(job_id), "--json"))
    assert data["scope"] == {"job_id": job_id} and data["note"] is None
    [r] = data["recommendations"]
    assert r["recommended"]["resources"] == "gpu=25%,gpumem=8GiB"
    assert r["freed_per_device"] == {"compute_pct": 25.0, "memory_mib": 8 * GIB}


def test_recommend_per_job_name_for_a_user_and_a_queue(store: Store) -> None:
    for p95, peak in ((10.0, 2 * GIB), (22.0, 3 * GIB), (15.0, 7 * GIB)):
        ran(store, usage=(p95, peak))
    ran(store, name="eval", gpu="20%", gpumem="4GiB", usage=(30.0, 5 * GIB))
    ran(store, "bob", usage=(80.0, 40 * GIB))
    text = ebb("recommend", "-u", "alice")
    assert "eval (alice): 1 job (4): 1 attempt measured, 600 samples" in text
    assert "train (alice): 3 jobs (1, 2, 3): 3 attempts measured, 1800 samples" in text
    # the largest p95 (22 → 26.4 → 30 %) and peak (7 → 8.7 → 9 GiB) of the three
    assert "  recommend  -l gpu=30%,gpumem=9GiB" in text
    # eval used more than it asked: it says so, and what it needs
    assert "  recommend  -l gpu=40%,gpumem=7GiB" in text
    assert "  frees      nothing; needs 20% more compute and 3GiB more memory per device" in text
    assert "above its grant (4GiB)" in text
    assert "bob" not in text
    data = json.loads(ebb("recommend", "-q", "default", "--last", "2", "--json"))
    assert data["scope"] == {"user": None, "queue": "default", "last": 2}
    assert [(r["name"], r["owner"], r["jobs"]) for r in data["recommendations"]] == [
        ("eval", "alice", [4]),
        ("train", "bob", [5]),
    ]


def test_no_measurement_says_why(store: Store) -> None:
    job_id = ran(store, usage=None)
    text = ebb("recommend", str(job_id))
    assert text.strip() == (
        "ebb recommend: no usage measured: attempts ran where the headroom source cannot "
        "attribute GPU use per process (static, trace, prometheus); run with --headroom nvml"
    )
    data = json.loads(ebb("recommend", "-u", "alice", "--json"))
    assert data["recommendations"] == [] and "--headroom nvml" in data["note"]
    [queued] = store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)
    assert "has not run yet" in ebb("recommend", str(queued))
    # a trial's trap: a user with no finished job (a typo) was told to change the
    # headroom source
    for args, whose in (
        (["-u", "nosuchuser"], "of user nosuchuser"),
        (["-u", "alice", "-q", "nosuchqueue"], "of user alice and in queue nosuchqueue"),
    ):
        text = ebb("recommend", *args)
        assert f"no job {whose} has finished yet" in text and "--headroom" not in text


def test_a_job_cancelled_before_it_ran_is_not_a_finished_one(store: Store) -> None:
    """A user whose only finished job was cancelled in the queue was told to change the
    headroom source, as if a job had run and been measured nowhere."""
    [queued] = store.submit(JobSpec(command=["x"]), "carol", defaults_deadline_s=30)
    store.cancel(queued, user="carol")
    text = ebb("recommend", "-u", "carol")
    assert "no job of user carol has finished yet" in text and "--headroom" not in text
    ran(store, "carol", usage=None)  # one that ran, unmeasured: now the headroom source
    assert "--headroom nvml" in ebb("recommend", "-u", "carol")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "needs a job ID, -u USER or -q QUEUE"),
        (("1", "-u", "alice"), "not both"),
        (("nope",), "is not a job id"),
        (("-u", "alice", "--last", "0"), "--last:"),
        (("1", "--last", "5"), "--last goes with -u/-q"),
        (("99",), "no job with id 99"),
    ],
)
def test_mistakes_are_one_line(store: Store, args: tuple[str, ...], says: str) -> None:
    ran(store)
    output = ebb("recommend", *args, code=1)
    assert output.startswith("ebb: error:") and says in output, output


def test_qstat_full_hints_at_a_job_that_asks_far_more_than_it_used(store: Store) -> None:
    wasteful = ran(store, usage=(18.0, 6 * GIB))
    snug = ran(store, gpu="20%", gpumem="8GiB", usage=(15.0, 6 * GIB))
    unmeasured = ran(store, usage=None)
    text = ebb("qstat", "-f", str(wasteful))
    assert (
        "used: compute p95 18%, peak 31%; memory p95 5.1GiB, peak 6GiB (1 attempt, 600 samples)"
        in text
    )
    assert (
        "hint: it used at most 6GiB of its 16GiB of memory and 18% compute (p95) of its 50% "
        f"per device; `ebb recommend {wasteful}` suggests a smaller slice" in text
    )
    data = json.loads(ebb("qstat", "-f", str(wasteful), "--json"))
    assert data["usage"]["memory_peak_mib"] == 6 * GIB
    assert data["hint"].startswith("it used at most 6GiB")
    assert "hint:" not in ebb("qstat", "-f", str(snug))
    assert json.loads(ebb("qstat", "-f", str(snug), "--json"))["hint"] is None
    plain = ebb("qstat", "-f", str(unmeasured))
    assert "hint:" not in plain and "used:" not in plain
    assert json.loads(ebb("qstat", "-f", str(unmeasured), "--json"))["usage"] is None


def test_an_arrays_task_is_named_as_logs_and_events_name_it(store: Store) -> None:
    """A trial's trap: ``ebb recommend 5[2]`` said "'5[2]' is not a job id", where
    ``ebb logs`` and ``ebb events`` take it."""
    tasks = store.submit(
        JobSpec(command=["x"], array="1-2", gpu="10%"), "alice", defaults_deadline_s=30
    )
    text = ebb("recommend", f"{tasks[0]}[2]")
    assert text.startswith(f"ebb recommend: job {tasks[1]} has not run yet"), text
    assert "a whole array" in ebb("recommend", f"{tasks[0]}[]", code=1)
