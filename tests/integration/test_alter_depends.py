"""``qalter -W depend=``: a job that has not started is given new dependencies, on every
store; the state follows them (queued → waiting, waiting → queued), a held job stays
held, and what a new job could not have (no such job, never met, a ring) is refused with
nothing changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.errors import SpecError, UserError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store

S = JobState


@pytest.fixture
def store(any_store: Store) -> Store:
    return any_store


def submit(store: Store, **fields: Any) -> int:
    fields.setdefault("command", ["true"])
    return store.submit(JobSpec(**fields), "alice", defaults_deadline_s=30)[0]


def alter(store: Store, job_id: int, depends: list[Any]) -> Any:
    spec = store.spec(job_id)
    kept = spec.model_dump(exclude_unset=True)
    kept.pop("depends", None)
    new = JobSpec(**kept, depends=depends)
    return store.alter(
        job_id,
        new,
        user="alice",
        defaults_deadline_s=30,
        changes={"depends": str(depends)},
    )


def test_a_queued_job_given_dependencies_waits_and_one_left_with_none_is_queued(
    store: Store,
) -> None:
    first, second = submit(store), submit(store)
    job = alter(store, second, ["afterok:" + str(first)])
    assert (job.state, job.reason) == (S.WAITING, "waiting for dependencies")
    assert json.loads(job.depends_json) == [{"kind": "afterok", "job_id": first}]
    event = store.events(second)[-1]
    assert (event["type"], event["changes"]) == ("altered", {"depends": f"afterok:{first}"})
    job = alter(store, second, [])  # all taken away: nothing to wait for
    assert (job.state, job.reason, job.depends_json) == (S.QUEUED, "", "[]")
    assert store.events(second)[-1]["changes"] == {"depends": "none"}
    # and a waiting one given others waits for those, promoted once they are met
    alter(store, second, [f"afterany:{first}"])
    store.cancel(first, user="alice")
    assert store.promote_waiting() == [second]
    assert store.get(second).state == S.QUEUED


def test_a_held_job_stays_held_and_is_released_to_wait(store: Store) -> None:
    first = submit(store)
    held = submit(store, hold=True)
    job = alter(store, held, [f"afterok:{first}"])
    assert job.state == S.HELD and job.reason == "held at submission"
    assert store.release(held, user="alice").state == S.WAITING


def test_what_a_new_job_could_not_have_is_refused_and_nothing_changes(store: Store) -> None:
    done = submit(store)
    store.cancel(done, user="alice")
    other = submit(store)
    job_id = submit(store, depends=[f"afterany:{other}"])
    before = (store.get(job_id).model_dump(), store.events(job_id))
    with pytest.raises(SpecError, match="no job with id 999"):
        alter(store, job_id, ["afterok:999"])
    with pytest.raises(SpecError, match=f"dependency afterok:{done} can never be met"):
        alter(store, job_id, [f"afterok:{done}"])
    with pytest.raises(SpecError, match=f"job {job_id} would wait for itself"):
        alter(store, job_id, [f"afterok:{job_id}"])
    # a ring: other would wait for job_id, which waits for other
    with pytest.raises(SpecError) as ring:
        alter(store, other, [f"afterok:{job_id}"])
    assert str(ring.value) == (
        f"depends: job {other} would wait for job {job_id}, which waits for job {other}: "
        "none of them could ever run"
    )
    assert (store.get(job_id).model_dump(), store.events(job_id)) == before
    assert store.get(other).state == S.QUEUED and store.get(other).depends_json == "[]"


def test_an_array_task_may_not_wait_for_its_own_array(store: Store) -> None:
    [first, second] = store.submit(
        JobSpec(command=["true"], array="1-2"), "alice", defaults_deadline_s=30
    )
    with pytest.raises(SpecError, match=f"would wait for array {first}, of which it is a task"):
        alter(store, second, [f"afterok:{first}[]"])
    lone = submit(store)
    assert alter(store, second, [f"afterok:{lone}"]).state == S.WAITING


def test_a_job_that_started_is_not_given_dependencies(store: Store) -> None:
    job_id = submit(store)
    store.dispatch(job_id, expected_attempts=0, node="n", devices=(0,), compute_pct=1, memory_mib=1)
    other = submit(store)
    with pytest.raises(UserError, match="only held, waiting or queued jobs can be altered"):
        alter(store, job_id, [f"afterok:{other}"])
    assert store.get(job_id).depends_json == "[]"


def ebb(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result.output


def test_qalter_takes_w_depend_as_qsub_does(home: Path) -> None:
    """A trial's trap: qalter had no -W, so a chain was mended by qdel and qsub again."""
    ebb("qsub", "--", "true")
    ebb("qsub", "-J", "1-2", "--", "true")  # 2[]
    ebb("qsub", "--", "true")  # 4
    assert ebb("qalter", "4", "-W", "depend=afterok:1,afterany:2[]") == (
        "4: altered (depends=afterok:1,afterany:2[])\n"
    )
    job = json.loads(ebb("qstat", "-f", "4", "--json"))
    assert job["state"] == "waiting" and job["depends"] == [
        {"kind": "afterok", "job_id": 1},
        {"kind": "afterany", "job_id": 2, "array": True},
    ]
    refused = CliRunner().invoke(cli, ["qalter", "1", "-W", "depend=afterok:4"])
    assert refused.exit_code == 1
    assert refused.stderr == (
        "ebb: error: depends: job 1 would wait for job 4, which waits for job 1: none of "
        "them could ever run\n"
    )
    other = CliRunner().invoke(cli, ["qalter", "1", "-W", "group_list=gpu"])
    assert other.exit_code == 1
    assert other.stderr == (
        "ebb: error: -W group_list: cannot be altered; qalter -W takes depend=LIST "
        "(depend= for none)\n"
    )
    # depend= (empty) takes them all away: the job is queued again
    assert ebb("qalter", "4", "-W", "depend=") == "4: altered (depends=none)\n"
    assert json.loads(ebb("qstat", "-f", "4", "--json"))["state"] == "queued"
    assert json.loads(ebb("qstat", "-f", "1", "--json"))["state"] == "queued"


def test_a_task_named_by_its_index_is_depended_on_by_its_id(store: Store) -> None:
    """``qalter -W depend=afterok:12[2]`` names the array's task of index 2 by its id."""
    tasks = store.submit(
        JobSpec(command=["true"], array={"start": 1, "end": 2}), "alice", defaults_deadline_s=30
    )
    job_id = submit(store)
    job = alter(store, job_id, [f"afterok:{tasks[0]}[2]"])
    assert json.loads(job.depends_json) == [{"kind": "afterok", "job_id": tasks[1]}]
    assert store.events(job_id)[-1]["changes"] == {"depends": f"afterok:{tasks[1]}"}
    with pytest.raises(SpecError, match="has no task 3"):
        alter(store, job_id, [f"afterok:{tasks[0]}[3]"])
    assert json.loads(store.get(job_id).depends_json) == [{"kind": "afterok", "job_id": tasks[1]}]
