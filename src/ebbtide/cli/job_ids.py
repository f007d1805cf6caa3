"""Job ids as the command line names them (``12``, ``12.server``, ``12[]``, ``12[3]``),
checked before any store is opened."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from ebbtide.errors import UserError
from ebbtide.units import MAX_INT64, shown


def _job_id(text: str) -> int | None:
    """``12`` → 12; None for anything but digits; an error past what the store holds."""
    if not re.fullmatch(r"[0-9]{1,30}", text.strip()):
        return None
    number = int(text)
    if not 1 <= number <= MAX_INT64:
        raise UserError(f"{text!r} is not a job id: ids go from 1 to {MAX_INT64}")
    return number


def parse_job_id(text: str, flag: str) -> int:
    """A job id given to ``flag``; a :class:`UserError` naming the flag otherwise."""
    try:
        number = _job_id(text)
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None
    if number is None:
        raise UserError(f"{flag}: {shown(text, 60)} is not a job id (expected a number like 12)")
    return number


@dataclass(frozen=True)
class JobRef:
    """A job as named on the command line: ``12`` (or ``12.server``), ``12[]`` (every
    task of the array 12), ``12[3]`` (its task of index 3), as PBS names them."""

    id: int
    whole_array: bool = False
    index: int | None = None


def _parse_ids(ids: Sequence[str]) -> list[JobRef]:
    """Job ids as given, checked before any store is opened."""
    out: list[JobRef] = []
    for text in ids:
        raw = text.split(".", 1)[0].strip()
        found = re.fullmatch(r"([0-9]{1,30})(?:\[([0-9]{0,30})\])?", raw)
        job_id = _job_id(found.group(1)) if found else None
        if found is None or job_id is None:
            raise UserError(
                f"{shown(text, 60)} is not a job id (expected a number like 12, 12[] for an "
                "array's tasks or 12[3] for one)"
            )
        index = found.group(2)
        if index is None:
            out.append(JobRef(job_id))
        elif index == "":
            out.append(JobRef(job_id, whole_array=True))
        else:
            out.append(JobRef(job_id, index=int(index)))
    return out


def _expand_ids(
    client: Any,
    ids: Sequence[JobRef],
    *,
    skip_finished: bool = False,
    skip_started: bool = False,
    only_held: bool = False,
    refused: list[tuple[int, str]] | None = None,
) -> list[int]:
    """The jobs :func:`_parse_ids` named, an array as each of its tasks; with
    ``skip_finished`` (commands that change jobs) a whole array as its tasks that have not
    finished, with a note on stderr of those left alone, and an array with none left
    added to ``refused`` (its id, why) for the caller to report beside the others;
    ``skip_started`` (``qalter``, ``qhold``) leaves the tasks that hold a slice alone too,
    as PBS's qalter of an array alters what has not run yet; ``only_held`` (``qrls``)
    takes a whole array's held tasks alone."""
    from ebbtide.queue.states import ACTIVE_STATES, FINAL_STATES, JobState

    left_alone = {s.value for s in FINAL_STATES}
    if skip_started:
        left_alone |= {s.value for s in ACTIVE_STATES}
    left = "running or finished" if skip_started else "finished"
    if only_held:
        left_alone = {s.value for s in JobState if s != JobState.HELD}
        left = "finished or not held"
    out: list[int] = []
    for ref in ids:
        if not ref.whole_array and ref.index is None:
            out.append(ref.id)
            continue
        tasks = client.list(array_id=ref.id)
        if not tasks:
            raise UserError(f"no array with id {ref.id}")
        if ref.whole_array:
            skipping = skip_finished or skip_started
            live = [t.id for t in tasks if not (skipping and t.state in left_alone)]
            if not live:
                ended = all(t.state in {s.value for s in FINAL_STATES} for t in tasks)
                why = f"every task of array {ref.id} has {'started or ' * (not ended)}finished"
                if only_held and not ended:
                    why = f"no task of array {ref.id} is held"
                if refused is None:
                    raise UserError(why)
                refused.append((ref.id, why))
                continue
            if len(live) < len(tasks):
                done = len(tasks) - len(live)
                click.echo(
                    f"ebb: note: array {ref.id}: {done} {left} task{'s' * (done > 1)} left alone",
                    err=True,
                )
            out.extend(live)
            continue
        task = next((t.id for t in tasks if t.array_index == ref.index), None)
        if task is None:
            indices = [t.array_index for t in tasks]
            raise UserError(
                f"array {ref.id} has no task {ref.index} (its tasks: {min(indices)}-"
                f"{max(indices)}, {len(indices)} of them)"
            )
        out.append(task)
    # each job once, where it was first named (a trial's trap: `qstat 111[] 112` counted
    # task 112 twice, "5 tasks" of a 4-task array)
    return list(dict.fromkeys(out))


def _one_job(text: str) -> JobRef:
    """The one job ``text`` names (``12``, or an array's task ``12[3]``), for commands
    that act on one job (``ebb logs``, ``ebb events``); checked before any store is
    opened (:func:`_expand_ids` finds a task's id)."""
    [ref] = _parse_ids([text])
    if ref.whole_array:
        raise UserError(f"ID: {shown(text, 60)} is a whole array; name one task, like {ref.id}[1]")
    return ref
