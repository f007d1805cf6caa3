"""A trial's trap: an array submitted with one ``--checkpoint-dir`` ran its tasks from one
another's state (each task's first attempt restored the newest ``state.pkl`` in the
directory, another task's; and every task's ``job.checkpoint()`` wrote the same file).
Now the agent's word on where to resume is final, ``%a`` (and the other fields of an
output path) keeps the tasks' directories apart, and submitting says so."""

from __future__ import annotations

import pickle
from pathlib import Path

from ebbtide.client_paths import shared_checkpoint_note
from ebbtide.queue.spec import ArraySpec, JobSpec
from ebbtide.workers.launch import launch_for
from tests.unit.builders import JobRow
from tests.unit.test_job_api import agent_env, local_env, run_py


def test_a_fresh_attempt_starts_fresh_whatever_its_directory_holds(tmp_path: Path) -> None:
    # another task's checkpoint, in the directory they share
    (tmp_path / "checkpoints" / "task0").mkdir(parents=True)
    (tmp_path / "checkpoints" / "task0" / "state.pkl").write_bytes(pickle.dumps({"idx": 0}))
    code = "import ebbtide.job as job; print(job.restore({'idx': 1}))"
    result = run_py(code, agent_env(tmp_path, EBBTIDE_RESUME_FROM="", EBBTIDE_ARRAY_INDEX="1"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'idx': 1}"
    assert result.stderr == ""


def test_a_local_rerun_resumes_and_says_from_where(tmp_path: Path) -> None:
    code = "import ebbtide.job as job; print(job.restore({'i': 0})); job.checkpoint({'i': 30})"
    first = run_py(code, local_env(), cwd=tmp_path)
    assert first.stdout.strip() == "{'i': 0}" and first.stderr == ""
    again = run_py(code, local_env(), cwd=tmp_path)
    assert again.stdout.strip() == "{'i': 30}"
    saved = tmp_path / ".ebbtide-checkpoints" / "state.pkl"
    assert f"resuming from {saved} (delete it to start afresh)" in again.stderr


def _launch_dir(tmp_path: Path, template: str, index: int) -> str:
    job = JobRow()
    job.id, job.array_id, job.array_index = 30 + index, 30, index  # type: ignore[misc]
    spec = JobSpec(command=["true"], checkpoint_dir=str(tmp_path / template))
    (tmp_path / "home").mkdir(exist_ok=True)
    launch = launch_for(spec, job, 1, home=tmp_path / "home", node="n1", devices=[], lease_s=60)
    return launch.env["EBBTIDE_CHECKPOINT_DIR"]


def test_fields_in_the_checkpoint_directory_keep_an_arrays_tasks_apart(tmp_path: Path) -> None:
    dirs = [_launch_dir(tmp_path, "ckpt/%A/%a", i) for i in range(3)]
    assert dirs == [str(tmp_path / "ckpt" / "30" / str(i)) for i in range(3)]
    assert all(Path(d).is_dir() for d in dirs)  # made for the job, as before
    assert _launch_dir(tmp_path, "ckpt", 1) == str(tmp_path / "ckpt")  # no field: as given


def test_submitting_an_array_with_one_checkpoint_directory_says_so() -> None:
    array = ArraySpec(start=0, end=3)
    [note] = shared_checkpoint_note(JobSpec(command=["x"], array=array, checkpoint_dir="/c/"))
    assert "share the checkpoint directory /c/" in note and "e.g. /c/%a" in note
    for fine in (
        JobSpec(command=["x"], array=array, checkpoint_dir="/c/%a"),
        JobSpec(command=["x"], array=array, checkpoint_dir="/c/job-%j"),
        JobSpec(command=["x"], array=array),  # each task's own directory
        JobSpec(command=["x"], checkpoint_dir="/c"),  # one job
        JobSpec(command=["x"], array=ArraySpec(start=2, end=2), checkpoint_dir="/c"),
    ):
        assert shared_checkpoint_note(fine) == []
