"""What a submission is told about the paths its job names: a working directory or an
output file's directory missing on the submitting host, one checkpoint directory or
output file an array's tasks would share."""

from __future__ import annotations

import os
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


def shared_output_notes(spec: JobSpec) -> list[str]:
    """A note for each output file an array's tasks would share (a trial's trap: ``-J 1-3
    -o out/arr.txt``: each task started the file afresh, the last one's output was all
    that was left, and ``ebb logs`` of the first showed it)."""
    if spec.array is None or spec.array.end == spec.array.start:
        return []
    notes = []
    for flag, path in (("-o", spec.stdout), ("-e", spec.stderr)):
        if path is None or any(f in path for f in ("%a", "%j", "%J")):
            continue
        if flag == "-e" and path == spec.stdout:
            continue  # joined with stdout: said once
        stem, dot, suffix = path.rpartition(".")
        apart = f"{stem}.%a.{suffix}" if dot and "/" not in suffix else f"{path}.%a"
        notes.append(
            f"the array's tasks share the {flag} file {path}: each task starts it afresh and "
            f"only the last one's output is left; put %a (the task's index) in it to keep "
            f"them apart, e.g. {apart}"
        )
    return notes


def missing_path_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """What the submitting host can tell of the job's paths: a working directory, an
    output file's directory, missing here (:func:`missing_cwd_note`,
    :func:`missing_output_dir_notes`)."""
    return [*missing_cwd_note(spec, policy), *missing_output_dir_notes(spec, policy)]


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


def missing_output_dir_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """A note for each output file (``-o``, ``-e``) whose directory does not exist on the
    submitting host (a trial's trap: ``-o nodir/out.txt`` was taken, and the job failed at
    its start with exit code 127): not an error, as the node it runs on may have it.  A
    directory with ``%`` fields or ``~`` in it is not checked."""
    if policy.kubernetes is not None:
        return []
    notes = []
    for flag, path in (("-o", spec.stdout), ("-e", spec.stderr)):
        if path is None or (flag == "-e" and path == spec.stdout):
            continue
        directory = os.path.dirname(path)
        if not directory or "%" in directory or directory.startswith("~"):
            continue
        if not os.path.isabs(directory):
            if not spec.cwd:
                continue
            directory = os.path.join(spec.cwd, directory)
        if not Path(directory).is_dir():
            notes.append(
                f"the directory of the {flag} file {path} ({os.path.normpath(directory)}) does "
                "not exist here: the job fails at its start unless it exists on the node it "
                "runs on"
            )
    return notes
