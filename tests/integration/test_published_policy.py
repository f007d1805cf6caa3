"""The queues, defaults and deadlines a client checks a job against are the running
scheduler's: it publishes its policy to the store, and clients read that one rather
than whatever file they happen to be pointed at."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ebbtide.client import Client
from ebbtide.config.policy import load_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import NotLeader, SpecError, UserError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import LEADERSHIP, Store
from ebbtide.scheduling.loop import Scheduler

SCHEDULERS = "queues:\n  default: {}\n  night:\n    deadline_s: 12s\n    max_deadline_s: 20s\n"
CLIENTS = "queues:\n  default: {}\n  stale:\n    priority: 5\n"
#: a window open all day long, for every queue
WINDOWS = "windows:\n  - {name: all-day, kind: cron, schedule: '0 0 * * *', duration: 24h}\n"
#: one 80 GiB GPU, nearly idle
DEVICE = {"index": 0, "memory_mib": 81920, "online_compute_pct": 5.0, "online_memory_mib": 1024}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'e.db'}")


def _client(tmp_path: Path, store: Store) -> Client:
    stale = tmp_path / "client-policy.yaml"
    stale.write_text(CLIENTS)
    settings = Settings.from_env(
        {"EBBTIDE_HOME": str(tmp_path / "home"), "EBBTIDE_POLICY": str(stale)}
    )
    return Client(settings, store=store)


def test_without_a_scheduler_a_client_reads_its_own_file(tmp_path: Path, store: Store) -> None:
    assert store.published_policy() is None
    assert set(_client(tmp_path, store).policy.queues) == {"default", "stale"}


def test_a_client_checks_jobs_against_the_schedulers_policy(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "scheduler-policy.yaml"
    path.write_text(SCHEDULERS)
    scheduler = Scheduler(store, policy=load_policy(path), policy_path=path, wakeups=False)
    scheduler.run_once()
    text, source, _ = store.published_policy()  # type: ignore[misc]
    assert text == SCHEDULERS and source == str(path)
    client = _client(tmp_path, store)
    assert set(client.policy.queues) == {"default", "night"}
    job = client.get(client.submit(command=["x"], queue="night"))
    assert job.deadline_s == 12  # the scheduler's queue default, not the client's
    with pytest.raises(UserError, match="unknown queue 'stale'") as refused:
        client.submit(command=["x"], queue="stale")
    # a trial's trap: it named no file, so the client's own file seemed to be ignored
    stale = tmp_path / "client-policy.yaml"
    assert str(refused.value).endswith(
        f"; the policy in force is the scheduler's, from {path}, not EBBTIDE_POLICY's {stale}: "
        f"a scheduler reads only its own file; change that one, or restart the scheduler "
        f"with EBBTIDE_POLICY={stale}"
    )
    with pytest.raises(SpecError, match="max_deadline_s 20s"):
        client.submit(command=["x"], queue="night", deadline="30s")

    with pytest.raises(SpecError) as refused:  # no file of its own: nothing it believes in
        Client(Settings.from_env({}), store=store).submit(command=["x"], queue="nope")
    assert str(refused.value).endswith("known queues: default, night")
    # the scheduler's own file, edited and not (yet) reloaded: the refusal says so
    path.write_text(SCHEDULERS + "  extra: {}\n")
    mine = Client(Settings.from_env({"EBBTIDE_POLICY": str(path)}), store=store)
    with pytest.raises(SpecError, match="unknown queue 'extra'") as refused:
        mine.submit(command=["x"], queue="extra")
    assert str(refused.value).endswith(
        f"; {path} has changed since the scheduler loaded it: what it loaded is the policy "
        f"in force; if a reload failed, ebb policy check {path} says why"
    )

    # the scheduler reloads an edited file: clients see the new one
    scheduler.runtime.request_reload()
    scheduler.run_once()
    assert "extra" in _client(tmp_path, store).policy.queues


def test_a_scheduler_with_the_built_in_defaults_publishes_them(
    tmp_path: Path, store: Store
) -> None:
    Scheduler(store, wakeups=False).run_once()
    assert store.published_policy()[0] == ""  # type: ignore[index]
    assert set(_client(tmp_path, store).policy.queues) == {"default"}


def test_a_deposed_leader_cannot_publish(store: Store) -> None:
    old = store.fenced(0)  # the epoch a fresh store starts at
    with store.engine.begin() as conn:  # another scheduler takes the lead
        conn.execute(LEADERSHIP.update().values(epoch=LEADERSHIP.c.epoch + 1))
    with pytest.raises(NotLeader):
        old.publish_policy("queues:\n  default: {}\n", "old")
    assert store.published_policy() is None


@pytest.mark.parametrize("windows", ["", WINDOWS])
def test_jobs_of_a_queue_taken_out_of_the_policy_wait_and_say_why(
    tmp_path: Path, store: Store, windows: str
) -> None:
    """A trial's trap: once a reload took queue 'night' out of the policy, its queued
    jobs ran under no queue's rules (with windows: waited "for a device to be up")."""
    store.heartbeat("n1", started_at=time.time(), devices=[DEVICE])
    path = tmp_path / "policy.yaml"
    path.write_text("queues:\n  default: {}\n  night: {}\n" + windows)
    scheduler = Scheduler(store, policy=load_policy(path), policy_path=path, wakeups=False)
    job_id = store.submit(
        JobSpec(command=["true"], queue="night", hold=True), "alice", defaults_deadline_s=30
    )[0]
    path.write_text("queues:\n  default: {}\n" + windows)
    scheduler.runtime.request_reload()
    store.release(job_id, user="alice")
    scheduler.run_once()
    job = store.get(job_id)
    assert job.state == "queued"
    assert job.reason == (
        "waiting: queue 'night' is not in the policy (taken out of it?): its jobs wait "
        "until it is back; qdel them, or add the queue again"
    )
    path.write_text("queues:\n  default: {}\n  night: {}\n" + windows)  # back
    scheduler.runtime.request_reload()
    scheduler.run_once()
    assert store.get(job_id).state == "dispatched"
