"""End to end, distributed: ``ebb scheduler`` plus two ``ebb worker`` processes on the real
Redis and PostgreSQL of this machine; then crash safety (``kill -9``)."""

from __future__ import annotations

import json
import signal
import uuid

import pytest

from tests.e2e.helpers import (
    ebb_env,
    events,
    job,
    jobs_by_id,
    start,
    stop,
    submit_count,
    wait_final,
    wait_for,
    write_trace,
)

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

N = 200
COOPERATIVE_DEADLINE_S = 5.0
STUBBORN_DEADLINE_S = 2.0
POLICY = """\
apiVersion: ebbtide/v1
defaults:
  heartbeat_timeout_s: 3s
  dispatch_timeout_s: 10s
"""


@pytest.fixture
def cluster(tmp_path, redis_url, postgres_url):  # type: ignore[no-untyped-def]
    policy = tmp_path / "ebbtide.yaml"
    policy.write_text(POLICY)
    env = ebb_env(
        tmp_path / "home",
        EBBTIDE_DB_URL=postgres_url,
        EBBTIDE_REDIS_URL=redis_url,
        EBBTIDE_NAMESPACE=f"ebbtest-{uuid.uuid4().hex[:8]}",
        EBBTIDE_POLICY=str(policy),
    )
    procs: dict[str, object] = {}

    def launch(name: str, *args: str):  # type: ignore[no-untyped-def]
        procs[name] = start(env, *args, log=tmp_path / f"{name}.log")
        return procs[name]

    yield env, launch, tmp_path
    for p in procs.values():
        stop(p)  # type: ignore[arg-type]


def _logs(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("*.log")))


def _running_on(env, job_id, node):  # type: ignore[no-untyped-def]
    j = job(env, job_id)
    return j["state"] == "running" and j["node"] == node


def test_spike_evicts_and_jobs_resume_on_another_worker(cluster):  # type: ignore[no-untyped-def]
    env, launch, tmp = cluster
    trace = write_trace(tmp / "spike.csv", [(0, 0, 5, 1024), (6, 0, 30, 81000)])
    coop_out, stub_out = tmp / "coop.json", tmp / "stub.json"
    coop = submit_count(env, coop_out, N, name="coop", deadline=f"{COOPERATIVE_DEADLINE_S}s")
    stub = submit_count(
        env,
        stub_out,
        N,
        name="stubborn",
        deadline=f"{STUBBORN_DEADLINE_S}s",
        extra=("--ignore-warning",),
    )
    launch("scheduler", "scheduler")
    launch("w0", "worker", "--node", "w0", "--devices", "1x80GiB", "--headroom", f"trace:{trace}")
    wait_for(
        lambda: _running_on(env, coop, "w0") and _running_on(env, stub, "w0"),
        20,
        "both jobs running on w0",
    )
    launch("w1", "worker", "--node", "w1", "--devices", "1x80GiB")
    jobs = wait_final(env, [coop, stub], timeout=90)
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, _logs(tmp)

    [ev] = [e for e in events(env, coop) if e["type"] == "evicted"]
    assert ev["killed"] is False and ev["checkpointed"] is True
    assert ev["latency_s"] < COOPERATIVE_DEADLINE_S
    [ev] = [e for e in events(env, stub) if e["type"] == "evicted"]
    assert ev["killed"] is True
    assert ev["latency_s"] <= STUBBORN_DEADLINE_S + 0.5
    for out in (coop_out, stub_out):
        result = json.loads(out.read_text())
        assert result["count"] == N
        assert result["attempts_seen"] == [1, 2]
    for j in (coop, stub):
        nodes = [e["node"] for e in events(env, j) if e["type"] == "dispatched"]
        assert nodes == ["w0", "w1"]


def test_kill_9_of_an_agent_requeues_after_heartbeat_timeout(cluster):  # type: ignore[no-untyped-def]
    env, launch, tmp = cluster
    out = tmp / "count.json"
    j = submit_count(env, out, N, name="survivor", deadline="5s")
    launch("scheduler", "scheduler")
    w0 = launch("w0", "worker", "--node", "w0", "--devices", "1x80GiB")
    wait_for(
        lambda: _running_on(env, j, "w0") and job(env, j)["checkpoint"],
        20,
        "the job running on w0 with a checkpoint",
    )
    w0.send_signal(signal.SIGKILL)
    w0.wait()
    launch("w1", "worker", "--node", "w1", "--devices", "1x80GiB")
    [final] = wait_final(env, [j], timeout=90).values()
    assert final["state"] == "succeeded", _logs(tmp)
    evs = events(env, j)
    lost = [e for e in evs if e["type"] == "lost"]
    assert len(lost) == 1 and "w0 stopped heartbeating" in lost[0]["reason"]
    result = json.loads(out.read_text())
    assert result["count"] == N
    assert result["attempts_seen"] == [1, 2]


def test_kill_9_of_the_scheduler_loses_nothing_and_runs_nothing_twice(cluster):  # type: ignore[no-untyped-def]
    env, launch, tmp = cluster
    outs = [tmp / f"c{i}.json" for i in range(6)]
    ids = [submit_count(env, o, 100, name=f"c{i}", deadline="5s") for i, o in enumerate(outs)]
    sched = launch("scheduler", "scheduler")
    launch("w0", "worker", "--node", "w0", "--devices", "1x80GiB")
    launch("w1", "worker", "--node", "w1", "--devices", "1x80GiB")
    wait_for(
        lambda: sum(j["state"] == "running" for j in jobs_by_id(env).values()) >= 2,
        20,
        "some jobs running",
    )
    sched.send_signal(signal.SIGKILL)
    sched.wait()
    launch("scheduler2", "scheduler")
    jobs = wait_final(env, ids, timeout=120)
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, _logs(tmp)
    for o in outs:
        assert json.loads(o.read_text())["count"] == 100
    for i in ids:
        evs = events(env, i)
        started = [e for e in evs if e["type"] == "started"]
        ended = [e for e in evs if e["type"] in ("succeeded", "requeued", "failed", "lost")]
        assert len(started) == len(ended), evs  # each attempt ended before the next began
        assert [e["type"] for e in evs].count("succeeded") == 1


def test_sigterm_to_a_worker_evicts_and_requeues(cluster):  # type: ignore[no-untyped-def]
    env, launch, tmp = cluster
    out = tmp / "count.json"
    j = submit_count(env, out, N, name="graceful", deadline="5s")
    launch("scheduler", "scheduler")
    w0 = launch("w0", "worker", "--node", "w0", "--devices", "1x80GiB")
    wait_for(lambda: _running_on(env, j, "w0"), 20, "the job running on w0")
    assert stop(w0) == 0
    state = job(env, j)
    assert state["state"] == "queued", state
    [ev] = [e for e in events(env, j) if e["type"] == "evicted"]
    assert ev["reason_code"] == "shutdown" and ev["killed"] is False
    # not counted: a stop of ebbtide is not the job's doing (no backoff, no max_preemptions)
    assert state["evictions"] == 0, state
    launch("w1", "worker", "--node", "w1", "--devices", "1x80GiB")
    [final] = wait_final(env, [j], timeout=60).values()
    assert final["state"] == "succeeded", _logs(tmp)
    assert json.loads(out.read_text())["count"] == N
