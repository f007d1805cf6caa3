"""``ebb events | logs``: what happened to a job, and what it wrote (``-f`` as it comes)."""

from __future__ import annotations

from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json
from ebbtide.cli.job_ids import _expand_ids, _one_job
from ebbtide.cli.qstat_cmd import _fmt_time
from ebbtide.errors import UserError
from ebbtide.units import MAX_INT64, shown

#: How often ``ebb logs -f`` looks for more output, in seconds.
FOLLOW_POLL_S = 0.5


def _follow(client: Any, job_id: int, options: dict[str, Any]) -> None:
    """``ebb logs -f``: print each attempt's output as it grows, from the attempt asked
    for (or the latest) on, until the job ends and nothing more comes."""
    import time

    from ebbtide.attempt_logs import MAX_TAIL_BYTES
    from ebbtide.queue.states import FINAL_STATES

    final = {s.value for s in FINAL_STATES}
    only = options.get("attempt")
    number, printed, said_waiting, said_where = only, 0, False, False
    try:
        while True:
            job = client.get(job_id)
            if number is None and job.attempts:
                number = job.attempts
            if number is None:
                if job.state in final:  # ended before it ever started: an error, as
                    # `ebb logs` says it (a trial's trap: -f said it in a note, exit 0)
                    client.log_tail(job_id, attempt=None, stderr=options["stderr"], tail_bytes=1)
                    return
                if not said_waiting:
                    click.echo(
                        f"ebb: job {job_id} is {job.state}; waiting for it to start", err=True
                    )
                    said_waiting = True
                time.sleep(FOLLOW_POLL_S)
                continue
            grown = _new_output(client, job_id, number, printed, options["stderr"], MAX_TAIL_BYTES)
            if grown is not None:
                if grown[2] is not None and not said_where:
                    _say_where(job_id, number, options["stderr"], grown[2])
                    said_where = True
                click.echo(grown[0], nl=False)
                printed = grown[1]
            if job.attempts > number and only is None:
                number, printed, said_where = number + 1, 0, False
                click.echo(f"ebb: --- job {job_id} attempt {number} ---", err=True)
                continue
            if (job.state in final or (only is not None and job.attempts > only)) and not grown:
                if printed == 0:
                    _say_if_missing(client, job_id, number, options["stderr"])
                return
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        click.echo(f"ebb: stopped following; job {job_id} goes on", err=True)


def _say_if_missing(client: Any, job_id: int, attempt: int, stderr: bool) -> None:
    """At the end of ``ebb logs -f`` with nothing shown: say why, if there was nothing
    to read (the file the job named is not there, or cannot be shown)."""
    try:
        client.log_tail(job_id, attempt=attempt, stderr=stderr, tail_bytes=1)
    except UserError as exc:
        click.echo(f"ebb: note: {exc}", err=True)


def _say_empty(
    client: Any, job_id: int, attempt: int, stderr: bool, *, named: bool = False
) -> None:
    """``ebb logs`` found nothing: say so on stderr, and where there is something (a job
    that failed at once wrote only to stderr), say how to see it."""
    stream, other = ("stderr", "stdout") if stderr else ("stdout", "stderr")
    note = f"ebb: job {job_id} attempt {attempt} has written nothing to {stream}"
    try:
        size = client.log_tail(job_id, attempt=attempt, stderr=not stderr, tail_bytes=1).size
    except UserError:
        size = 0  # no such log yet, or a file that cannot be shown: nothing more to say
    if size:
        flags = ("" if stderr else " -e") + (f" --attempt {attempt}" if named else "")
        note += f"; its {other} holds {size} bytes: ebb logs{flags} {job_id}"
    click.echo(note, err=True)


def _say_where(job_id: int, attempt: int, stderr: bool, path: str) -> None:
    """Say that a job's output is read from the file it named (-o, --output)."""
    stream = "stderr" if stderr else "stdout"
    click.echo(f"ebb: job {job_id} attempt {attempt}: {stream} from {path}", err=True)


def _new_output(
    client: Any, job_id: int, attempt: int, printed: int, stderr: bool, most: int
) -> tuple[str, int, str | None] | None:
    """What attempt ``attempt``'s log (or the file the job named) holds past its first
    ``printed`` bytes, its size and that file; None while there is nothing new (or no
    log yet)."""
    from ebbtide.attempt_logs import NoLogYet

    try:
        size = client.log_tail(job_id, attempt=attempt, stderr=stderr, tail_bytes=1).size
        if size <= printed:
            return None
        for _ in range(3):  # the end of the log as it was when its size was taken
            grown = client.log_tail(
                job_id, attempt=attempt, stderr=stderr, tail_bytes=min(size - printed, most)
            )
            if grown.size == size:
                break
            size = grown.size  # it grew meanwhile: ask again for all that is new
    except NoLogYet:
        return None
    except UserError as exc:
        if "no output yet" in str(exc) or "has not started" in str(exc):
            return None  # (a server of an older version says it so)
        raise
    return grown.text, grown.size, getattr(grown, "path", None)


@click.command("events")
@click.argument("job_id")
@click.option(
    "-t",
    "--type",
    "types",
    metavar="TYPE[,TYPE]",
    multiple=True,
    help="Only these kinds of event (evicted,requeued); -t ^checkpointed,progress: all but "
    "these (a job that checkpoints often writes many).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the events as a JSON list.")
def events(job_id: str, types: tuple[str, ...], as_json: bool) -> None:
    """Show what happened to a job, oldest first."""
    ref = _one_job(job_id)
    keep = _event_filter(types)
    client = _client()
    evs = [e for e in client.events(_expand_ids(client, [ref])[0]) if keep(e["type"])]
    if as_json:
        _echo_json(evs)
        return
    for e in evs:
        extra = {k: v for k, v in e.items() if k not in ("type", "time", "attempt")}
        att = f"#{e['attempt']}" if e["attempt"] else "  "
        detail = " ".join(f"{k}={_event_value(k, v)}" for k, v in extra.items() if v is not None)
        click.echo(f"{_fmt_time(e['time'])} {att:>3} {e['type']:<16} {detail}")


def _event_filter(texts: tuple[str, ...]) -> Any:
    """``-t`` as a test of an event's type: the kinds named, or with a leading ``^`` all
    but those; a kind that does not exist is refused, naming those that do."""
    from ebbtide.queue.states import EventType

    if not texts:
        return lambda _: True
    words = [w.strip() for t in texts for w in t.split(",")]
    exclude = bool(words) and words[0].startswith("^")
    if exclude:
        words[0] = words[0][1:]
    known = {e.value for e in EventType}
    for w in words:
        if w not in known:
            raise UserError(f"-t: no event type {shown(w)}; the types: {', '.join(sorted(known))}")
    chosen = set(words)
    return (lambda t: t not in chosen) if exclude else (lambda t: t in chosen)


def _event_value(key: str, value: Any) -> Any:
    """An event's detail for people: an instant (``freed_at``, ``spike_at``) as a local
    time to the millisecond, other numbers to four significant digits (whole ones as
    they are); what a change set (``altered``'s ``changes``) holds as ``(gpu=20%, ...)``, a
    list comma-separated; ``--json`` keeps them exact."""
    import datetime as dt

    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={_event_value(k, v)}" for k, v in value.items()) + ")"
    if isinstance(value, list | tuple):
        return ",".join(str(_event_value(key, v)) for v in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if key.endswith("_at"):
        return dt.datetime.fromtimestamp(value).strftime("%H:%M:%S.%f")[:-3]
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"
    return value


@click.command("logs")
@click.argument("job_id", metavar="ID")
@click.option("-e", "--stderr", is_flag=True, help="Show stderr instead of stdout.")
@click.option("--attempt", metavar="N", help="Which attempt (default: the latest).")
@click.option("--tail", metavar="BYTES", help="How much of the end to show (default 1048576).")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing what the job writes, across its attempts (a requeued job's next "
    "attempt follows under a header), until it ends. Ctrl-C stops following, not the job.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the text with its attempt, size and path (the file the job named, or null).",
)
def logs(
    job_id: str,
    stderr: bool,
    attempt: str | None,
    tail: str | None,
    follow: bool,
    as_json: bool,
) -> None:
    """Show what a job wrote: the end of its latest attempt's stdout (or -e stderr), or,
    with -f, all of it as it comes. Its owner and admins only. A job that sent its output
    to a file (-o/-e, --output/--error, Slurm's default slurm-%j.out) is shown from that
    file, as each attempt named it, with a line on stderr saying which; a file that is
    not there (yet) is said so. It must be a plain file of the job's owner."""
    from ebbtide.attempt_logs import DEFAULT_TAIL_BYTES, MAX_TAIL_BYTES
    from ebbtide.units import parse_int

    options: dict[str, Any] = {"stderr": stderr, "tail_bytes": DEFAULT_TAIL_BYTES}
    for flag, key, value, high in (
        ("--attempt", "attempt", attempt, MAX_INT64),
        ("--tail", "tail_bytes", tail, MAX_TAIL_BYTES),
    ):
        if value is not None:
            try:
                options[key] = parse_int(value, 1, high)
            except ValueError as exc:
                raise UserError(f"{flag}: {exc}") from None
    ref = _one_job(job_id)
    if follow and as_json:
        raise UserError("-f and --json do not go together: follow prints text as it comes")
    client = _client()
    number = _expand_ids(client, [ref])[0]
    if follow:
        _follow(client, number, options)
        return
    log_tail = client.log_tail(number, **options)
    if as_json:
        _echo_json(log_tail.to_dict())
        return
    if log_tail.path is not None:
        _say_where(number, log_tail.attempt, stderr, log_tail.path)
    click.echo(log_tail.text, nl=False)
    if log_tail.size == 0:
        _say_empty(client, number, log_tail.attempt, stderr, named=attempt is not None)
    if log_tail.truncated:
        click.echo(
            f"ebb: only the end of the log is shown ({log_tail.size} bytes in all); "
            "--tail BYTES for more",
            err=True,
        )
