"""``ebb qalter | qdel | qhold | qrls``: change, cancel, hold and release jobs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json
from ebbtide.cli.job_ids import _expand_ids, _parse_ids
from ebbtide.errors import UserError


def _pbs_hold(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """PBS's ``qalter -h u ID`` puts a hold on the job: here that is ``ebb qhold``."""
    if value is not None:
        raise UserError(
            "qalter -h: PBS's hold is a command of its own here: ebb qhold ID "
            "(ebb qrls ID releases it); ebb qalter --help for help"
        )


@click.command("qalter", context_settings={"help_option_names": ["--help"]})
@click.option(
    "-h",
    "pbs_hold",
    is_flag=False,
    flag_value="",
    default=None,
    hidden=True,
    expose_value=False,
    is_eager=True,
    callback=_pbs_hold,
)
@click.argument("ids", nargs=-1, required=True)
@click.option("-N", "name", help="New job name.")
@click.option("-p", "priority", help="New priority, -1024..1023.")
@click.option(
    "-l",
    "resources",
    multiple=True,
    help="New resources: gpu=, gpumem=, walltime=, deadline=, checkpoint_interval= (as qsub).",
)
@click.option(
    "-W",
    "attributes",
    multiple=True,
    metavar="depend=LIST",
    help="New dependencies, all of them (as qsub -W): depend=afterok:12[:13][,afterany:14]; "
    "12[] is the whole array 12, 12[3] its task 3; depend= (empty) takes them all away.",
)
@click.option("--deadline", help="New eviction deadline, 1s..1h.")
@click.option("--kind", type=click.Choice(["training", "inference", "batch"], case_sensitive=False))
@click.option(
    "--allow-future",
    is_flag=True,
    help="Accept a slice no node could hold today (as qsub --allow-future): one that can "
    "will join.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print a list: each altered job as qstat --json with "ok": true and its "notes", '
    'each refused one as {"id", "ok": false, "error"}.',
)
def qalter(
    ids: Sequence[str],
    name: str | None,
    priority: str | None,
    resources: Sequence[str],
    attributes: Sequence[str],
    deadline: str | None,
    kind: str | None,
    allow_future: bool,
    as_json: bool,
) -> None:
    """Change jobs that have not started (held, waiting or queued): `ebb qalter 12 -l
    gpu=50%,walltime=4:00:00 -p 10`. `-W depend=afterok:14` replaces the job's
    dependencies (checked as qsub checks them; one that would make jobs wait for each
    other in a ring is refused): a queued job waits for them, a held one stays held.
    `12[]` alters every task of an array that has not started (those running or
    finished are left alone, with a note). A running job keeps
    the slice it was given; qdel and qsub again to change it. A new slice is checked as
    qsub checks it (one no node could ever hold is refused, unless --allow-future); a
    fraction made whole GPUs (-l gpu=N) with no gpumem is given a card's memory, with a
    note, as qsub does, and whole GPUs made a fraction need gpumem= too."""
    from ebbtide.client import ALTERABLE_FIELDS
    from ebbtide.queue.qsub import parse_resources
    from ebbtide.queue.qsub.resources import replaced
    from ebbtide.units import parse_int

    changes: dict[str, Any] = {}
    for text in resources:
        given = parse_resources(text)  # checked whole: a bad value, a key twice
        for what, why in replaced(changes, given):
            click.echo(f"ebb qalter: note: {what}: {why}", err=True)
        changes.update(given)
        # a trial's trap: `-l foo=bar` (a site resource: qsub's note) was dropped with no
        # word, and `-l ncpus=4` named the field it is stored as; each as it was typed
        for item in filter(str.strip, text.split(",")):
            site: list[str] = []
            fields = set(parse_resources(item, notes=site))
            if site or fields - set(ALTERABLE_FIELDS):
                typed = item.partition("=")[0].strip().lower()
                raise UserError(f"-l {typed}: cannot be altered; give gpu, gpumem, walltime, "
                                "deadline or checkpoint_interval")  # fmt: skip
    if attributes:
        from ebbtide.queue.qsub import parse_depend

        depends: list[Any] = []
        for text in attributes:  # a trial's trap: qalter had no -W depend= at all
            typed, _, value = text.strip().partition("=")
            if typed.strip() != "depend":
                what = f"-W {typed.strip()}: cannot be altered" if typed.strip() else "-W"
                raise UserError(f"{what}; qalter -W takes depend=LIST (depend= for none)")
            if value.strip():  # (an empty list takes them all away)
                depends += [d for d in parse_depend(text) if d not in depends]
        changes["depends"] = depends
    if deadline is not None:
        from ebbtide.queue.qsub.resources import check_resource

        check_resource("deadline", deadline, None, "--deadline")  # named as qsub names it
        changes["deadline"] = deadline
    if name is not None:
        changes["name"] = name
    if kind is not None:
        changes["kind"] = kind
    if priority is not None:
        try:
            changes["priority"] = parse_int(priority, -1024, 1023)
        except ValueError as exc:
            raise UserError(f"-p: {exc}") from None
    if not changes:
        raise UserError("qalter needs something to change: -N, -p, -l, -W, --deadline or --kind")
    from ebbtide.queue.dependencies import dependency_text

    said = ", ".join(
        f"{k}={(','.join(map(dependency_text, v)) or 'none') if k == 'depends' else v}"
        for k, v in changes.items()
    )
    parsed = _parse_ids(ids)
    client = _client()
    refused: list[tuple[int, str]] = []
    results: list[dict[str, Any]] = []  # --json: every id, altered or not (as qdel's)
    failed = False
    notes: list[str] = []
    jobs = _expand_ids(client, parsed, skip_finished=True, skip_started=True, refused=refused)
    for job_id in jobs:
        try:  # each job on its own, as PBS's qalter: one refusal does not stop the others
            job = client.alter(job_id, allow_future=allow_future, **changes)
        except UserError as exc:
            failed = True
            results.append({"id": job_id, "ok": False, "error": str(exc)})
            click.echo(f"ebb: error: {exc}", err=True)
            continue
        # --json: its notes too, as qsub --json has them (on stderr they are said once)
        results.append({**client.as_dict(job), "ok": True, "notes": list(client.last_notes)})
        notes.extend(n for n in client.last_notes if n not in notes)  # as qsub's, once
        if not as_json:
            click.echo(f"{job.id}: altered ({said})")
    for note in notes:  # what a new slice was given (a whole GPU's memory, ...)
        click.echo(f"ebb qalter: note: {note}", err=True)
    for array_id, why in refused:
        results.append({"id": array_id, "ok": False, "error": why})
        click.echo(f"ebb: error: {why}", err=True)
    if as_json:
        _echo_json(results)
    if failed or refused:
        sys.exit(1)


#: The command of each action, for the notes.
_COMMANDS = {"cancel": "qdel", "hold": "qhold", "release": "qrls"}
#: What each action did, for the summary of a partial failure.
_DONE = {"cancel": "cancelled", "hold": "held", "release": "released"}


def _act(ids: Sequence[str], action: str, as_json: bool) -> None:
    parsed = _parse_ids(ids)
    plain = {r.id for r in parsed if not r.whole_array and r.index is None}
    client = _client()
    refused: list[tuple[int, str]] = []
    results = []
    failed = False
    # a trial's trap: `qhold 12[]` held the tasks it could, yet failed (exit 1) on the
    # running one; each command takes the tasks it applies to, the rest left alone with
    # a note, as qalter and qdel do
    for job_id in _expand_ids(
        client,
        parsed,
        skip_finished=True,
        skip_started=action == "hold",
        only_held=action == "release",
        refused=refused,
    ):
        try:
            job = getattr(client, action)(job_id)
            results.append({"id": job_id, "ok": True, "state": job.state, "reason": job.reason})
            if job_id in plain and job.array_id is not None and not as_json:
                # a trial's trap: `qdel 62` of an array's id acted on its first task alone
                click.echo(
                    f"ebb: note: {job_id} is task {job.array_id}[{job.array_index}] of an "
                    f"array: `ebb {_COMMANDS[action]} {job.array_id}[]` acts on all its tasks",
                    err=True,
                )
        except UserError as exc:
            failed = True
            results.append({"id": job_id, "ok": False, "error": str(exc)})
            if not as_json:
                click.echo(f"ebb: error: {exc}", err=True)
    for array_id, why in refused:  # an array with nothing left to act on
        failed = True
        results.append({"id": array_id, "ok": False, "error": why})
        if not as_json:
            click.echo(f"ebb: error: {why}", err=True)
    if as_json:
        _echo_json(results)
    elif failed and (done := [str(r["id"]) for r in results if r["ok"]]):
        # a trial's trap: `qdel 1 2` printed only 1's refusal, and 2 was cancelled unsaid
        refused_ids = ", ".join(str(r["id"]) for r in results if not r["ok"])
        click.echo(
            f"ebb {_COMMANDS[action]}: {_DONE[action]} {', '.join(done)}; not {refused_ids} "
            "(above)",
            err=True,
        )
    if failed:
        sys.exit(1)


@click.command("qdel")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qdel(ids: Sequence[str], as_json: bool) -> None:
    """Cancel jobs. A running job is evicted (warned, then killed at its deadline)."""
    _act(ids, "cancel", as_json)


@click.command("qhold")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qhold(ids: Sequence[str], as_json: bool) -> None:
    """Hold queued or waiting jobs so they are not started."""
    _act(ids, "hold", as_json)


@click.command("qrls")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qrls(ids: Sequence[str], as_json: bool) -> None:
    """Release held jobs."""
    _act(ids, "release", as_json)
