"""``ebb recommend``: the slice to ask for, from what jobs used of their GPUs."""

from __future__ import annotations

from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json, _note_unknown_queue
from ebbtide.errors import UserError
from ebbtide.units import parse_int


@click.command("recommend")
@click.argument("job_id", metavar="[ID]", required=False)
@click.option("-u", "--user", help="Each job name among this user's latest finished jobs.")
@click.option("-q", "--queue", help="Each job name among this queue's latest finished jobs.")
@click.option(
    "--last",
    metavar="N",
    help="How many of the latest finished jobs -u/-q look at (default 50, at most 1000).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def recommend(
    job_id: str | None, user: str | None, queue: str | None, last: str | None, as_json: bool
) -> None:
    """Suggest the slice to ask for (-l gpu=…,gpumem=…) from what a job used:
    `ebb recommend 12`, or per job name among a user's (-u) or a queue's (-q) latest
    finished jobs.

    Node agents measure what each attempt uses where the headroom source sees GPU use
    per process (--headroom nvml): compute asked = its p95 + 20 %, rounded up to 5 %;
    memory asked = its peak (never less: memory past the grant gets a job evicted or
    killed) + 10 % + 1GiB, rounded up to 1GiB and capped at the largest device. It says
    what the change would free on each device.
    """
    from ebbtide.cli.job_ids import _expand_ids, _one_job
    from ebbtide.client import MAX_RECOMMEND_JOBS
    from ebbtide.queue.rightsizing import RECENT_JOBS

    if job_id is not None and (user or queue):
        raise UserError("give a job ID, or -u/-q, not both")
    if job_id is None and not (user or queue):
        raise UserError("recommend needs a job ID, -u USER or -q QUEUE")
    # an array's task as logs and events take it (12[3]), checked before the store opens
    ref = None if job_id is None else _one_job(job_id)
    jobs = RECENT_JOBS
    if last is not None:
        if ref is not None:
            raise UserError("--last goes with -u/-q: a job ID names one job")
        try:
            jobs = parse_int(last, 1, MAX_RECOMMEND_JOBS)
        except ValueError as exc:
            raise UserError(f"--last: {exc}") from None
    with _client() as client:
        number = None if ref is None else _expand_ids(client, [ref])[0]
        found = client.recommend(number, user=user, queue=queue, last=jobs)
        _note_unknown_queue(client, queue)  # (once the value was found well formed)
    if as_json:
        _echo_json(found)
        return
    click.echo("\n".join(recommendation_lines(found)))


def recommendation_lines(found: dict[str, Any]) -> list[str]:
    """``ebb recommend``'s text: one block per job name, or the note."""
    from ebbtide.queue.rightsizing import (
        COMPUTE_HEADROOM_FRACTION,
        COMPUTE_STEP_PCT,
        MEMORY_HEADROOM_FRACTION,
        MEMORY_HEADROOM_MIB,
        MEMORY_STEP_MIB,
    )
    from ebbtide.units import format_mib

    if not found["recommendations"]:
        return [f"ebb recommend: {found['note']}"]
    lines: list[str] = []
    for r in found["recommendations"]:
        used, jobs = r["used"], r["jobs"]
        if "job_id" in found["scope"]:
            head = f"job {jobs[0]} ({r['name']}, {r['owner']})"
        else:
            ids = ("…, " if len(jobs) > 3 else "") + ", ".join(map(str, jobs[-3:]))
            head = f"{r['name']} ({r['owner']}): {len(jobs)} job{_s(jobs)} ({ids})"
        lines.append(
            f"{head}: {used['attempts']} attempt{_s(used['attempts'])} measured, "
            f"{used['samples']} samples"
        )
        lines.append(f"  used       {_used_words(used)}")
        lines.append(f"  asked      -l {r['asked']['resources']}")
        lines.append(f"  recommend  -l {r['recommended']['resources']}")
        lines.append(f"  frees      {_freed_words(r)}")
        lines.extend(f"  note: {note}" for note in r["notes"])
        lines.append("")
    lines.append(
        f"(compute: p95 + {COMPUTE_HEADROOM_FRACTION:.0%}, rounded up to {COMPUTE_STEP_PCT}%; "
        f"memory: peak + {MEMORY_HEADROOM_FRACTION:.0%} + {format_mib(MEMORY_HEADROOM_MIB)}, "
        f"rounded up to {format_mib(MEMORY_STEP_MIB)})"
    )
    return lines


def _used_words(used: dict[str, Any]) -> str:
    from ebbtide.queue.rightsizing import Used

    return Used(**used).words() or "-"


def _freed_words(r: dict[str, Any]) -> str:
    """``35% compute and 12GiB memory per device``; ``nothing; needs 3GiB more memory per
    device`` where it used more than it asked."""
    from ebbtide.units import format_mib

    freed = r["freed_per_device"]
    compute, memory = freed["compute_pct"], freed["memory_mib"]
    frees, needs = [], []
    if compute > 0:
        frees.append(f"{compute:g}% compute")
    elif compute < 0:
        needs.append(f"{-compute:g}% more compute")
    if memory > 0:
        frees.append(f"{format_mib(memory)} memory")
    elif memory < 0:
        needs.append(f"{format_mib(-memory)} more memory")
    if not frees and not needs:
        return "nothing: it asks for what it needs"
    where = "per device" if r["devices"] == 1 else f"on each of its {r['devices']} devices"
    said = " and ".join(frees) or "nothing"
    if needs:
        said += "; needs " + " and ".join(needs)
    return f"{said} {where}"


def _s(n: int | list[Any]) -> str:
    count = len(n) if isinstance(n, list) else n
    return "" if count == 1 else "s"
