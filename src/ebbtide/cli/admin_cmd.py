"""``ebb admin purge``: remove old finished jobs from the store (admins)."""

from __future__ import annotations

import time
from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json
from ebbtide.errors import UserError
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, MAX_BATCH_JOBS, MIN_PURGE_AGE_S
from ebbtide.units import MAX_DURATION_S


@click.group("admin")
def admin_group() -> None:
    """Look after the store (admins only).

    \b
      ebb admin purge --older-than 90d --dry-run   how many finished jobs would go
      ebb admin purge --older-than 90d             remove them, a batch at a time
    """


def _age(text: str) -> float:
    from ebbtide.units import parse_duration_s

    forms = "an age like 30d, 12h or 90d (1h to 366d)"
    try:
        seconds = parse_duration_s(text)
    except ValueError as exc:
        if "at most" in str(exc):  # a trial's trap: 400d was "expected an age like ..."
            raise UserError(f"--older-than: must be from 1h to 366d, got {text}") from None
        raise UserError(f"--older-than: expected {forms}, got {text!r}") from None
    if not MIN_PURGE_AGE_S <= seconds <= MAX_DURATION_S:
        # a trial's trap: a bare 90 was 90 seconds, refused without saying so
        unit = f" ({seconds:g} seconds: give a unit)" if text.strip().isdigit() else ""
        raise UserError(
            f"--older-than: must be from 1h to 366d, got {text}{unit}; a job that finished "
            "just now may still be waited on and looked at"
        )
    return seconds


@admin_group.command("purge")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Jobs that finished longer ago than this go: 30d, 12h (1h at least).",
)
@click.option("--dry-run", is_flag=True, help="Count what would go; remove nothing.")
@click.option(
    "--batch",
    type=click.IntRange(1, MAX_BATCH_JOBS),
    default=DEFAULT_BATCH_JOBS,
    show_default=True,
    metavar="N",
    help="Jobs removed per transaction; the scheduler runs between two.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what went as one JSON object.")
def purge(older_than: str, dry_run: bool, batch: int, as_json: bool) -> None:
    """Remove the jobs that finished (succeeded, failed, cancelled) longer ago than
    AGE, with their attempts and events, a batch at a time.  Never a job not yet
    finished, one that a job not yet finished depends on, nor part of an array not all
    finished that long ago.  Log files and checkpoints stay where they are.  The
    policy's `retention:` has the leading scheduler do this on its own."""
    age = _age(older_than)
    with _client() as client:
        result = client.purge(age, batch=batch, dry_run=dry_run)
    if as_json:
        _echo_json(result)
        return
    for line in _lines(result, older_than):
        click.echo(line)


def _lines(result: dict[str, Any], older_than: str) -> list[str]:
    verb = "would purge" if result["dry_run"] else "purged"
    lines = [
        f"{verb} {_n(result['jobs'], 'job')}, {_n(result['attempts'], 'attempt')} and "
        f"{_n(result['events'], 'event')}: finished before {_when(result['cutoff'])} (over "
        f"{older_than} ago); {_n(result['batches'], 'batch')}, {result['elapsed_s']:.2f}s"
    ]
    if result["kept"]:
        lines.append(
            f"kept {_n(result['kept'], 'job')} that finished before then: a job not yet "
            "finished depends on it, or not all of its array has finished that long ago"
        )
    oldest = result["oldest_kept_finished_at"]
    if oldest is None:
        lines.append("no finished job is left in the store")
    else:
        label = "oldest finished job now" if result["dry_run"] else "oldest finished job kept"
        lines.append(f"{label}: finished {_when(oldest)}")
    return lines


def _n(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``3 batches``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith('ch') else 's'}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
