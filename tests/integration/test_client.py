"""The SDK against a real SQLite store under a temporary EBBTIDE_HOME."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide import client_base
from ebbtide.attempt_logs import NoLogYet
from ebbtide.client import Client, WaitTimeout
from ebbtide.config.policy import parse_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import EbbtideError, PermissionDenied, SpecError, UserError
from ebbtide.identity import Caller, is_admin
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import EventType, JobState

S = JobState
POLICY = """
queues:
  default: {}
  fast:
    priority: 7
    deadline_s: 5s
admins: [carol]
"""


ALICE = Caller("alice", via="test")


def _settings(tmp_path: Path, **extra: str) -> Settings:
    return Settings.from_env({"EBBTIDE_HOME": str(tmp_path), **extra})


def _as(user: str, policy_text: str = POLICY) -> Caller:
    """The caller ``user``, an admin as the policy says (as ``ebb server`` would make)."""
    return Caller(user, admin=is_admin(user, parse_policy(policy_text, "p.yaml").admins))


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setattr(client_base, "WAIT_POLL_S", 0.02)
    policy_path = tmp_path / "ebbtide.yaml"
    policy_path.write_text(POLICY)
    with Client(_settings(tmp_path, EBBTIDE_POLICY=str(policy_path)), caller=ALICE) as c:
        yield c


def _run_to_end(client: Client, job_id: int, exit_code: int) -> None:
    """Play the scheduler and the node agent on the store."""
    store = client.store
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
    )
    store.mark_started(job_id, attempt, pid=42, stdout_path="o", stderr_path="e")
    store.finish_attempt(job_id, attempt, exit_code=exit_code)


def test_settings_from_a_dict(tmp_path: Path) -> None:
    settings = _settings(tmp_path, EBBTIDE_USER="alice")
    assert settings.act_as == "alice"
    assert settings.home == tmp_path
    assert settings.db_url == f"sqlite:///{tmp_path / 'ebbtide.db'}"
    assert settings.policy_path is None


def test_default_client_uses_the_home(tmp_path: Path) -> None:
    with Client(_settings(tmp_path), caller=ALICE) as c:
        job_id = c.submit(command=["true"])
        assert c.get(job_id).owner == "alice"
        assert c.policy.queues.keys() == {"default"}
    assert (tmp_path / "ebbtide.db").exists()


def test_submit_with_keywords(client: Client) -> None:
    job_id = client.submit(command=["python", "train.py"], gpu="25%", gpumem="4GiB", name="t")
    job = client.get(job_id)
    assert (job.name, job.owner, job.queue, job.state) == ("t", "alice", "default", S.QUEUED)
    assert (job.compute_pct, job.memory_mib) == (25.0, 4096)
    assert job.deadline_s == 30.0  # the policy default


def test_submit_a_jobspec(client: Client) -> None:
    spec = JobSpec(command=["python", "infer.py"], kind="inference", gpu=1, deadline="20s")
    job = client.get(client.submit(spec))
    assert (job.kind, job.gpus, job.compute_pct, job.deadline_s) == ("inference", 1, 100.0, 20.0)
    # submitted from here, it runs here (as PBS_O_WORKDIR), and knows from where
    # (PBS_O_HOST, SLURM_SUBMIT_HOST)
    assert client.store.spec(job.id or 0) == spec.model_copy(
        update={"cwd": os.getcwd(), "submit_host": socket.gethostname()}
    )


def test_queue_priority_and_deadline_apply(client: Client) -> None:
    job = client.get(client.submit(command=["x"], queue="fast"))
    assert (job.priority, job.deadline_s) == (7, 5.0)
    job = client.get(client.submit(JobSpec(command=["x"], queue="fast")))
    assert job.priority == 7
    job = client.get(client.submit(command=["x"], queue="fast", priority=1))
    assert job.priority == 1  # an explicit priority wins


def test_jobspec_with_keyword_overrides(client: Client) -> None:
    """``submit(spec, **fields)`` is the spec with those fields changed, as if given to it."""
    base = JobSpec(command=["x"])
    job = client.get(client.submit(base, queue="fast", name="over"))
    assert (job.queue, job.name) == ("fast", "over")
    assert job.priority == 7  # the queue's priority, as when the spec says queue="fast"


def test_jobspec_with_convenience_overrides(client: Client) -> None:
    """The user-facing forms (``gpu``, ``gpumem``) work as overrides too, not silently dropped."""
    job = client.get(client.submit(JobSpec(command=["x"]), gpu="50%", gpumem="2GiB"))
    assert (job.compute_pct, job.memory_mib) == (50.0, 2048)


def test_jobspec_with_bad_override(client: Client) -> None:
    with pytest.raises(SpecError) as info:
        client.submit(JobSpec(command=["x"]), priority=5000)
    assert info.value.field == "priority"
    assert client.list() == []


def test_submit_many_returns_every_task(client: Client) -> None:
    ids = client.submit_many(command=["x"], name="a", array={"start": 0, "end": 2, "limit": 1})
    assert len(ids) == 3
    with pytest.raises(SpecError, match="submit_many"):  # one handle is not an array's
        client.submit(command=["x"], array={"start": 0, "end": 1})
    assert len(client.list()) == 3
    assert [j.name for j in client.list(array_id=ids[0])] == ["a[0]", "a[1]", "a[2]"]


def test_unknown_queue(client: Client) -> None:
    with pytest.raises(SpecError) as info:
        client.submit(command=["x"], queue="nope")
    assert "nope" in str(info.value) and "default, fast" in str(info.value)
    with pytest.raises(SpecError):
        client.submit(JobSpec(command=["x"], queue="nope"))
    assert client.list() == []


def test_bad_spec_is_a_spec_error(client: Client) -> None:
    with pytest.raises(SpecError) as info:
        client.submit(command=["x"], gpu="lots")
    assert info.value.field == "gpu"


def test_list_with_filters(client: Client) -> None:
    a = client.submit(command=["x"])
    b = client.submit(command=["x"], queue="fast", hold=True)
    c = client.submit(command=["x"], queue="fast")
    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(client.list()) == [a, b, c]
    assert ids(client.list(state="held")) == [b]
    assert ids(client.list(state=S.QUEUED)) == [a, c]
    assert ids(client.list(state=["queued", S.HELD])) == [a, b, c]
    assert ids(client.list(queue="fast")) == [b, c]
    assert ids(client.list(queue="fast", state="queued")) == [c]
    assert ids(client.list(owner="alice")) == [a, b, c]
    assert ids(client.list(owner="bob")) == []
    assert ids(client.list(limit=1)) == [a]
    with pytest.raises(ValueError):
        client.list(state="sleeping")


def test_as_dict(client: Client) -> None:
    data = client.as_dict(client.get(client.submit(command=["x"], gpu="25%")))
    assert data["state"] == "queued"
    assert data["slice"]["compute_pct"] == 25.0


def test_wait_timeout(client: Client) -> None:
    job_id = client.submit(command=["x"])
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        client.wait(job_id, timeout=0.1)
    assert 0.1 <= time.monotonic() - started < 2
    assert "queued" in str(info.value)
    # a trial's trap: nothing said that no scheduler would ever start it
    assert str(info.value).endswith("; no scheduler runs for this store (ebb up, or ebb scheduler)")
    assert isinstance(info.value, EbbtideError)
    assert client.get(job_id).state == S.QUEUED  # the job goes on


def test_wait_returns_a_finished_job_at_once(client: Client) -> None:
    job_id = client.submit(command=["x"])
    _run_to_end(client, job_id, 0)
    assert client.wait(job_id, timeout=0).state == S.SUCCEEDED


@pytest.mark.parametrize(("exit_code", "state"), [(0, S.SUCCEEDED), (3, S.FAILED)])
def test_wait_returns_when_the_job_ends(client: Client, exit_code: int, state: JobState) -> None:
    job_id = client.submit(command=["x"])
    timer = threading.Timer(0.15, _run_to_end, args=(client, job_id, exit_code))
    timer.start()
    try:
        job = client.wait(job_id, timeout=10)
    finally:
        timer.join()
    assert (job.state, job.exit_code) == (state, exit_code)


def test_wait_returns_when_cancelled(client: Client) -> None:
    job_id = client.submit(command=["x"])
    timer = threading.Timer(0.1, client.cancel, args=(job_id,))
    timer.start()
    try:
        assert client.wait(job_id, timeout=10).state == S.CANCELLED
    finally:
        timer.join()


def test_events(client: Client) -> None:
    job_id = client.submit(command=["x"])
    client.hold(job_id)
    client.release(job_id)
    _run_to_end(client, job_id, 0)
    events = client.events(job_id)
    assert [e["type"] for e in events] == [
        EventType.SUBMITTED,
        EventType.HELD,
        EventType.RELEASED,
        EventType.DISPATCHED,
        EventType.STARTED,
        EventType.SUCCEEDED,
    ]
    times = [e["time"] for e in events]
    assert times == sorted(times)
    assert [e["attempt"] for e in events] == [None, None, None, 1, 1, 1]


def test_actions_check_the_owner(client: Client, tmp_path: Path) -> None:
    job_id = client.submit(command=["x"])
    policy = parse_policy(POLICY, "p.yaml")
    # the other clients share the store, so they are not closed here
    bob = Client(_settings(tmp_path), store=client.store, policy=policy, caller=_as("bob"))
    assert not bob.is_admin
    with pytest.raises(PermissionDenied):
        bob.hold(job_id)
    with pytest.raises(PermissionDenied):
        bob.cancel(job_id)
    assert client.get(job_id).state == S.QUEUED
    carol = Client(_settings(tmp_path), store=client.store, policy=policy, caller=_as("carol"))
    assert carol.is_admin  # an admin by the policy
    assert carol.hold(job_id).state == S.HELD
    root = Client(_settings(tmp_path), store=client.store, policy=policy, caller=_as("root"))
    assert root.is_admin  # root always is
    assert root.cancel(job_id).state == S.CANCELLED


def test_a_deadline_over_the_queue_maximum_is_refused_and_nothing_is_stored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ebbtide.client import Client
    from ebbtide.config.policy import parse_policy
    from ebbtide.config.settings import Settings
    from ebbtide.errors import SpecError

    policy = parse_policy("queues:\n  fast: {max_deadline_s: 10s}\n")
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path)})
    with Client(settings, policy=policy, caller=ALICE) as client:
        with pytest.raises(SpecError, match="max_deadline_s 10s"):
            client.submit(command=["true"], queue="fast", deadline="30s")
        assert client.list() == []
        assert client.submit(command=["true"], queue="fast", deadline="5s") == 1


def test_qstat_shape_shows_the_backoff_of_a_repeatedly_evicted_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ebbtide.client import Client
    from ebbtide.config.policy import parse_policy
    from ebbtide.config.settings import Settings

    policy = parse_policy("defaults: {backoff_base_s: 30s, backoff_max_s: 10m}\n")
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path)})
    with Client(settings, policy=policy, caller=ALICE) as client:
        job_id = client.submit(command=["true"])
        store = client.store
        for _ in range(3):
            n = store.dispatch(
                job_id,
                expected_attempts=store.get(job_id).attempts,
                node="n",
                devices=(0,),
                compute_pct=10,
                memory_mib=1024,
            )
            store.mark_started(job_id, n, pid=1, stdout_path="o", stderr_path="e")
            store.finish_attempt(job_id, n, exit_code=99)
        job = client.get(job_id)
        data = client.as_dict(job)
        assert data["evictions"] == 3
        assert data["backoff_until"] == pytest.approx(job.requeued_at + 60.0)


def test_queue_stats(client: Client) -> None:
    client.submit(command=["x"])
    client.submit(command=["x"], queue="fast", hold=True)
    assert client.queue_stats() == {"default": {"queued": 1}, "fast": {"held": 1}}


def test_logs_are_the_owners_and_admins(client: Client, tmp_path: Path) -> None:
    job_id = client.submit(command=["x"])
    with pytest.raises(UserError, match="has not started"):
        client.logs(job_id)
    _run_to_end(client, job_id, 0)
    attempt_dir = tmp_path / "logs" / str(job_id) / "1"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "stdout.log").write_bytes(b"out \xff\n")
    (attempt_dir / "stderr.log").write_text("0123456789")
    assert client.logs(job_id) == "out \ufffd\n"  # bytes that are not UTF-8, replaced
    tail = client.log_tail(job_id, stderr=True, tail_bytes=4, attempt=1)
    assert (tail.text, tail.size, tail.truncated, tail.attempt) == ("6789", 10, True, 1)
    with pytest.raises(SpecError, match="attempt: job 1 has had 1 attempt so far, not 2"):
        client.logs(job_id, attempt=2)
    with pytest.raises(SpecError, match="tail_bytes"):
        client.logs(job_id, tail_bytes=0)
    policy = client.policy
    bob = Client(_settings(tmp_path), store=client.store, policy=policy, caller=_as("bob"))
    with pytest.raises(PermissionDenied, match="only its owner or an admin may read its logs"):
        bob.logs(job_id)
    carol = Client(_settings(tmp_path), store=client.store, policy=policy, caller=_as("carol"))
    assert carol.logs(job_id, stderr=True) == "0123456789"


def test_a_job_cancelled_before_it_ran_never_will_and_its_logs_say_so(client: Client) -> None:
    job_id = client.submit(command=["x"])
    client.cancel(job_id)
    with pytest.raises(UserError) as caught:
        client.logs(job_id)
    # (it said "has not started yet", as if it still might, and ebb logs -f waited)
    assert not isinstance(caught.value, NoLogYet)
    assert str(caught.value).startswith(f"job {job_id} never started (cancelled by alice")


def test_joined_output_is_read_from_the_one_log_for_either_stream(
    client: Client, tmp_path: Path
) -> None:
    job_id = client.submit(JobSpec(command=["x"], join="oe"))
    _run_to_end(client, job_id, 0)
    attempt_dir = tmp_path / "logs" / str(job_id) / "1"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "stdout.log").write_text("out\nerr\n")  # as -j oe's attempt wrote it
    tail = client.log_tail(job_id, stderr=True)
    assert (tail.text, tail.stream) == ("out\nerr\n", "stderr")


def test_a_log_file_of_another_user_is_not_shown(client: Client, tmp_path: Path) -> None:
    """The job's owner controls its attempt directory: a hard-linked (then unlinked)
    file of someone else's placed there is refused, whoever reads it."""
    import os

    if os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    job_id = client.submit(command=["x"])
    _run_to_end(client, job_id, 0)
    attempt_dir = tmp_path / "logs" / str(job_id) / "1"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "stdout.log").write_text("someone else's secrets")
    os.chown(attempt_dir / "stdout.log", 54321, 54321)  # neither alice, nor us, nor root
    with pytest.raises(UserError, match="does not belong to alice"):
        client.logs(job_id)
