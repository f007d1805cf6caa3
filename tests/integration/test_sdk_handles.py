"""The SDK's job handles: ``client.submit`` returns a ``JobHandle`` that is the job's id
and answers for it; a job's result travels from ``ebbtide.job.result`` to
``JobHandle.result()``."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from ebbtide import Client, JobFailed, JobHandle, JobState, SpecError, WaitTimeout
from ebbtide.identity import Caller
from ebbtide.queue.spec import JobSpec
from ebbtide.workers.status import Result, parse


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return Client()


def test_a_handle_is_the_jobs_id_and_answers_for_it(client: Client) -> None:
    client.submit_many(command=["true"], array="1-4%2")  # an array: submit_many's
    job = client.handle(1)
    assert isinstance(job, JobHandle) and isinstance(job, int)
    assert job == job.id == 1 and json.dumps({"id": job}) == '{"id": 1}'
    assert (str(job), f"{job}", f"{job:>3}", repr(job)) == ("1", "1", "  1", "JobHandle(1)")
    assert client.get(job).array_limit == 2  # old code that passes ids on works
    assert job.state is JobState.QUEUED and not job.done()
    assert pickle.loads(pickle.dumps(job)) == 1 and copy.copy(job) == 1
    with pytest.raises(WaitTimeout):
        job.wait(timeout=0)
    ended = job.cancel()
    assert ended.state == "cancelled" and job.done()
    assert [e["type"] for e in job.events()] == ["submitted", "cancelled"]
    with pytest.raises(JobFailed) as info:
        job.result(timeout=1)
    assert info.value.job.state == "cancelled" and "job 1 cancelled" in str(info.value)
    assert client.handle(2).info().array_index == 2


def test_the_array_text_form_is_checked_as_on_the_command_line(client: Client) -> None:
    with pytest.raises(SpecError, match="array: the range ends"):
        client.submit_many(command=["true"], array="4-1")
    assert JobSpec(command=["x"], array="0-15:4").array.indices() == range(0, 16, 4)  # type: ignore[union-attr]


def test_a_result_line_is_read_and_its_value_recorded_for_the_owner_only(
    client: Client,
) -> None:
    assert parse(b'{"type": "result", "value": {"loss": 0.1}}') == Result({"loss": 0.1})
    assert parse(b'{"type": "result"}') is None  # no value: garbage
    job = client.submit(command=["true"])
    client.store.record_result(job.id, 1, {"loss": 0.1})
    client.store.record_result(job.id, 1, {"loss": 0.05})  # the last one is the job's
    assert [e["value"] for e in job.events() if e["type"] == "result"] == [
        {"loss": 0.1},
        {"loss": 0.05},
    ]
    other = Client(caller=Caller("nobody-else", admin=False, by="nobody-else", via="test"))
    seen = [e for e in other.events(job.id) if e["type"] == "result"]
    assert [e["value"] for e in seen] == ["***", "***"]


def test_a_job_cannot_give_what_is_not_a_small_json_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ebbtide.job as job_api

    status = tmp_path / "status.jsonl"
    monkeypatch.setenv("EBBTIDE_STATUS_FILE", str(status))
    job_api.result({"acc": 0.9})
    assert json.loads(status.read_text()) == {"type": "result", "value": {"acc": 0.9}}
    with pytest.raises(TypeError, match="JSON value"):
        job_api.result({1, 2})
    with pytest.raises(ValueError, match="JSON value"):
        job_api.result(float("nan"))
    with pytest.raises(ValueError, match="at most 3072 bytes"):
        job_api.result("x" * 4000)
