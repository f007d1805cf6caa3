"""What a submission is told about the paths its job names: a working directory missing
on the submitting host, one checkpoint directory an array's tasks would share."""

from __future__ import annotations

from pathlib import Path

from ebbtide.config.policy import Policy
from ebbtide.queue.spec import JobSpec


def shared_checkpoint_note(spec: JobSpec) -> list[str]:
    """A note when an array's tasks would share one checkpoint directory (a trial's
    trap: ``-J 0-3 --checkpoint-dir ckpt``: each task's ``job.checkpoint()`` writes the
    same ``ckpt/state.pkl``, and a task resumed from another's)."""
    if spec.array is None or spec.checkpoint_dir is None:
        return []
    if spec.array.end == spec.array.start or any(
        f in spec.checkpoint_dir for f in ("%a", "%j", "%J")
    ):
        return []
    return [
        f"the array's tasks share the checkpoint directory {spec.checkpoint_dir}: "
        "job.checkpoint() in each writes the same state.pkl there; put %a (the task's "
        f"index) in it to keep them apart, e.g. {spec.checkpoint_dir.rstrip('/')}/%a"
    ]


def missing_cwd_note(spec: JobSpec, policy: Policy) -> list[str]:
    """A note when the job's working directory is not a directory on the submitting
    host (a trial's trap: ``-d nope/dir`` was taken, and the job failed at its start
    with exit code 127): not an error, as the node it runs on may have it."""
    if policy.kubernetes is not None or not spec.cwd or Path(spec.cwd).is_dir():
        return []
    return [
        f"the working directory {spec.cwd} does not exist here: the job fails at its start "
        "unless it exists on the node it runs on"
    ]
