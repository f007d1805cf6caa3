"""``ebb qsub | qstat | qdel | qhold | qrls | events | logs``: submit and watch jobs."""

from __future__ import annotations

import datetime as dt
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import click

from ebbtide.cli import fast
from ebbtide.cli.common import _client, _echo_json, _listing_client
from ebbtide.errors import UserError
from ebbtide.scriptfile import read_script
from ebbtide.units import MAX_INT64, format_mib, shown

JOB_STATES_HELP = (
    "held, waiting, queued, dispatched, running, evicting, succeeded, failed, cancelled"
)

# -- qsub -------------------------------------------------------------------------------


class _QsubCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["ebb_dashdash"] = "--" in args
        return super().parse_args(ctx, args)


@click.command(
    "qsub",
    cls=_QsubCommand,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help"]},
)
@click.option("-N", "name", help="Job name.")
@click.option("-q", "queue", help="Queue, or one of its aliases in the policy (default: default).")
@click.option("-p", "priority", help="Priority, -1024..1023; higher runs first.")
@click.option(
    "-l",
    "resources",
    multiple=True,
    help="Resources: gpu=25%|0.25|1|2, gpumem=4GiB, walltime=HH:MM:SS, "
    "deadline=30s, checkpoint_interval=10m. Repeatable.",
)
@click.option("-J", "array", help="Array: 1-100, 1-100:2, 1-100%4 (at most 4 at once).")
@click.option(
    "-W", "depend", multiple=True, help="depend=afterok:ID[:ID],afternotok:ID,afterany:ID"
)
@click.option("-h", "hold", is_flag=True, help="Submit held (release with qrls).")
@click.option(
    "--pause/--no-pause",
    "pause",
    default=None,
    help="Whether an online compute spike may pause the job (frozen in place, keeping its "
    "GPU memory) rather than evict it. --no-pause for jobs that cannot stop, e.g. "
    "collectives with timeouts. Default: the queue's (yes unless the policy says no).",
)
@click.option("-v", "env", multiple=True, help="Environment: VAR=val,VAR2 (bare: copied).")
@click.option(
    "--kind",
    type=click.Choice(["training", "inference", "batch"]),
    help="What the job is (default: batch).",
)
@click.option("--deadline", help="Eviction deadline, 1s..1h, e.g. 30s (decision to free slice).")
@click.option(
    "--signal",
    "signal_",
    help="Warning signal at eviction: TERM (default), INT, HUP, USR1, USR2, QUIT, ALRM, XCPU.",
)
@click.option("--checkpoint-dir", help="Where the job keeps checkpoints.")
@click.option("-d", "--cwd", help="Working directory of the job.")
@click.option("--max-attempts", help="Failed attempts allowed before the job fails, 1..100.")
@click.option(
    "--image",
    help="Container image of the job under the Kubernetes executor "
    "(default: the queue's, else the policy's kubernetes.image).",
)
@click.option(
    "-o",
    "stdout",
    help="Where stdout goes: a path (relative to the job's directory; %j id, %A array "
    "id, %a index, %x name, %u user, %N node). Default: kept with the attempt (ebb logs).",
)
@click.option("-e", "stderr", help="Where stderr goes, as -o. Default: kept with the attempt.")
@click.option("-j", "join", help="oe: stderr into the -o file; eo: stdout into the -e file.")
@click.option("-A", "account", help="Account to record against the job (qstat -f shows it).")
@click.option(
    "-V", "export_all", is_flag=True, help="Copy the submitting environment into the job."
)
@click.option("-S", "shell", help="Shell for a script with no #! line, e.g. /bin/bash.")
@click.option(
    "--allow-future",
    is_flag=True,
    help="Accept a job no node could hold today (more GPUs or memory than any has): one "
    "that can will join.",
)
@click.option("-m", "mail", help="Accepted, without effect: mail is not sent.")
@click.option("-M", "mail_to", help="Accepted, without effect: mail is not sent.")
@click.option("-r", "rerun", help="Accepted, without effect: evicted jobs are always requeued.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead.')
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def qsub(
    ctx: click.Context, args: Sequence[str], as_json: bool, signal_: str | None, **opts: Any
) -> None:
    """Submit a job: `ebb qsub [opts] SCRIPT [ARGS]` or `ebb qsub [opts] -- CMD ARGS`.

    #EBB and #PBS directive lines at the top of SCRIPT are honoured, as PBS Pro, OpenPBS
    and Torque scripts carry them (-l select=1:ncpus=8:ngpus=1:mem=32gb,
    -l nodes=1:ppn=8:gpus=1, -J / -t arrays, -o, -e, -j oe, -A, -V); a script with only
    #SBATCH lines is read as Slurm's (see ebb sbatch). Command-line flags win. A directive
    with no effect here (-m, -l place=...) is accepted with a note on stderr; a job that
    needs more than one node is refused. Prints only the job id (an array prints ID[]).

    Units, the same in flags, scripts, the SDK and policy files: sizes (gpumem, mem) need
    a unit, like 4GiB, 512MiB or 16GB (a bare number is refused, never guessed); durations
    are 30s, 5m, 2h, HH:MM:SS, DD:HH:MM:SS or a bare number of seconds.

    The job sees EBBTIDE_* variables and PBS's: PBS_JOBID, PBS_JOBNAME, PBS_O_WORKDIR,
    PBS_O_HOST, PBS_QUEUE, PBS_ARRAY_INDEX and PBS_ARRAYID (array tasks), PBS_NODEFILE.

    Under the policy's kubernetes section, the slice is rounded to what the fleet's
    resource profile grants (qstat -f shows both), and a slice the profile cannot
    express, a --signal other than TERM, or a job with no image is refused.
    """
    if not args:
        raise UserError("qsub needs a SCRIPT, or -- followed by a command")
    opts = {**opts, "signal": signal_}
    allow_future = opts.pop("allow_future")
    dashdash = bool(ctx.meta.get("ebb_dashdash"))
    script = None if dashdash else (args[0], read_script(args[0]))
    rest = list(args if dashdash else args[1:])
    submitted = None
    if fast.socket_url() is not None:  # a server on this host: no store, no heavy imports
        submitted = fast.qsub(opts, rest, script=script, allow_future=allow_future)
    if submitted is not None:
        ids, is_array, notes = submitted["ids"], submitted["array"], submitted["notes"]
    else:
        from ebbtide.queue.qsub import qsub_spec

        notes = []
        spec = qsub_spec(opts, rest, script=script, notes=notes)
        ids, is_array = _submitted(spec, notes, allow_future)
    _say_submitted("qsub", ids, is_array, notes, as_json)
    if not as_json:
        click.echo(f"{ids[0]}[]" if is_array else str(ids[0]))


def _submitted(spec: Any, notes: list[str], allow_future: bool) -> tuple[list[int], bool]:
    """Submit ``spec`` through the SDK's client; its ids and whether it is an array.
    What the client says about how the spec was taken is added to ``notes``."""
    client = _client(create=True)
    ids = client.submit_many(spec, allow_future=allow_future)
    notes.extend(client.last_notes)  # how it was taken here (through a server: its notes)
    return ids, spec.array is not None


def _say_submitted(
    command: str, ids: list[int], is_array: bool, notes: list[str], as_json: bool
) -> None:
    """With ``as_json`` the ids and the notes on stdout; else one line on stderr per
    note (a directive accepted without full effect, ...)."""
    if as_json:
        out: dict[str, Any] = {"id": ids[0]}
        if is_array:
            out["array"] = True
            out["tasks"] = list(ids)
        if notes:
            out["notes"] = notes
        _echo_json(out)
        return
    for note in notes:
        click.echo(f"ebb {command}: note: {note}", err=True)


@click.command(
    "sbatch",
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["--help"],
    },
)
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead.')
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sbatch(args: Sequence[str], as_json: bool) -> None:
    """Submit a Slurm batch script: `ebb sbatch [OPTIONS] SCRIPT [ARGS]` or
    `ebb sbatch [OPTIONS] --wrap "CMD"`.

    #SBATCH lines at the top of SCRIPT and sbatch options before it are read as Slurm
    reads them (options win): -J/--job-name, --gres=gpu[:TYPE]:N, -G/--gpus,
    --gpus-per-node, -t/--time, -a/--array (1-10, 0-15:4, 1-100%5), -o/--output and
    -e/--error (%j %A %a %x %u %N; default slurm-%j.out in the job's directory, stderr
    with stdout), --signal=[B:]SIG[@SECS] (the eviction warning; B: to the script's shell
    alone; SECS its time to checkpoint, i.e. the eviction deadline), -d/--dependency
    (afterok, afternotok, afterany), -D/--chdir, -p/--partition (the queue, or an alias
    the policy gives it), -A/--account and -c/--cpus-per-task and --mem (recorded),
    --export (ALL by default, NONE, VAR[=value]), -H/--hold, --requeue. Options with no
    meaning here (--mail-type, --qos, --exclusive, ...) are accepted with a note on
    stderr; more than one node or task is refused, and so is a job no node could hold
    today unless --allow-future.

    Prints "Submitted batch job ID" (--parsable: the id alone). The job sees EBBTIDE_*
    variables and Slurm's: SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_SUBMIT_DIR,
    SLURM_SUBMIT_HOST, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID (and _MIN, _MAX, _STEP,
    _COUNT), SLURM_JOB_PARTITION, SLURM_JOB_NODELIST, SLURM_CPUS_PER_TASK,
    SLURM_RESTART_COUNT. A Slurm eviction is a warning signal, then the kill at the
    deadline: the job checkpoints and exits 99 (or ends) and is requeued.
    """
    from ebbtide.queue.qsub import load_script
    from ebbtide.queue.slurm import parse_sbatch_command_line

    words = list(args)
    allow_future = "--allow-future" in words
    if allow_future:  # ebbtide's own, not sbatch's
        words.remove("--allow-future")
    cli_opts, given, rest = parse_sbatch_command_line(words)
    directives = None
    if cli_opts.command is not None:
        if rest:
            raise UserError(f"--wrap takes the command; unexpected {shown(rest[0])}")
    else:
        if not rest:
            raise UserError('sbatch needs a SCRIPT, or --wrap "CMD"')
        text, directives = load_script(rest[0], dialect="slurm")
        cli_opts.script = text
        cli_opts.args = rest[1:]
    from ebbtide.queue.qsub import build_spec_kwargs
    from ebbtide.queue.spec import JobSpec

    notes: list[str] = []
    spec = JobSpec(**build_spec_kwargs(cli_opts, directives, notes=notes))
    ids, is_array = _submitted(spec, notes, allow_future)
    _say_submitted("sbatch", ids, is_array, notes, as_json)
    if not as_json:
        click.echo(str(ids[0]) if "--parsable" in given else f"Submitted batch job {ids[0]}")


# -- qstat ------------------------------------------------------------------------------


def _fmt_time(t: float | None) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _slice_text(job: Any) -> str:
    share = f"{job.gpus}gpu" if job.gpus else f"{job.compute_pct:g}%"
    return f"{share}/{format_mib(job.memory_mib)}"


def _full_lines(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """``qstat -f``'s lines: every field, with the slice asked for and the slice granted
    in words where the slice is (``slice granted: 25% 5GiB (qgpu)``), a running job's
    state with its pause or suspension (``running (suspended to host)``), what it used
    where that was measured (``used: compute p95 12%, peak 20%; memory …``) and a hint
    when it asks for far more."""
    from ebbtide.kube.profiles import slice_words
    from ebbtide.queue.rightsizing import Used

    lines: list[tuple[str, Any]] = []
    for key, value in data.items():
        if key in ("slice_asked", "slice_granted"):
            continue
        if key in ("usage", "hint"):
            if value is None:
                continue  # nothing measured (a source that cannot attribute, or not run)
            if key == "usage":
                used = Used(**value)
                counted = f"{used.attempts} attempt{'s' if used.attempts > 1 else ''}"
                value = f"{used.words()} ({counted}, {used.samples} samples)"
                key = "used"
            lines.append((key, value))
            continue
        if key == "submitted":
            lines.extend((name, shown) for name, shown in value.items() if shown is not None)
            continue
        if key == "state" and value == "running" and data.get("suspended_at"):
            value = "running (suspended to host)"
        elif key == "state" and value == "running" and data.get("paused_at"):
            value = "running (paused)"
        if key != "slice":
            lines.append((key, value))
            continue
        asked, granted = data["slice_asked"], data["slice_granted"]
        lines.append(("slice asked", slice_words(**asked)))
        words = slice_words(granted["compute_pct"], granted["gpus"], granted["memory_mib"])
        profile = f" ({granted['profile']})" if granted["profile"] else ""
        lines.append(("slice granted", words + profile))
        if granted["note"]:
            lines.append(("rounded", granted["note"]))
    return lines


@click.command("qstat")
@click.option(
    "-f",
    "full",
    is_flag=True,
    help="Each job in full (qstat -f 12 13; alone: every job listed). --json: one job's "
    "object, or a list for several.",
)
@click.option("-u", "user", help="Only this user's jobs.")
@click.option("-Q", "queues", is_flag=True, help="Show queues with job counts per state.")
@click.option(
    "-s",
    "--state",
    "states",
    multiple=True,
    help=f"Only these states: {JOB_STATES_HELP}; or PBS's letters: Q queued, R running, "
    "H held, W waiting, E evicting, F finished (-s QR: both).",
)
@click.option(
    "-t", "tasks", is_flag=True, help="Show every task of an array (default: one line each)."
)
@click.option(
    "-x",
    "finished",
    is_flag=True,
    help="Finished jobs too (succeeded, failed, cancelled), as PBS's qstat -x.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every task).")
@click.argument("ids", nargs=-1)
def qstat(
    full: str | None,
    user: str | None,
    queues: bool,
    states: Sequence[str],
    tasks: bool,
    finished: bool,
    as_json: bool,
    ids: Sequence[str],
) -> None:
    """Show the jobs that have not finished (oldest first; -x: finished ones too, -s:
    these states), only the jobs IDS in any state (`ebb qstat 12 13[]`), jobs in full
    (-f 12, -f 12 13, -f alone: every job listed), or queues (-Q).

    An array is one line, `12[1-100]`, with its tasks counted by state; -t shows each
    task. In -f, times are local ISO timestamps (Unix seconds in --json).
    """
    from ebbtide.queue.states import FINAL_STATES, JobState

    asked = wanted = _states(states)
    unfinished_only = wanted is None and not finished and not ids
    if unfinished_only:  # as PBS's qstat and Slurm's squeue
        wanted = [s for s in JobState if s not in FINAL_STATES]
    named = _parse_ids(ids)
    if fast.socket_url() is not None and not (full or ids or queues or as_json):
        rows = fast.qstat_rows([s.value for s in wanted or ()], user)
        if rows is not None:  # a server on this host answered: its table
            _echo_table(rows, expand=tasks, unfinished_only=unfinished_only)
            return
    if ids:  # jobs named: no store is an error
        client = _client()
    elif (client := _listing_client(as_json, {} if queues else [])) is None:
        return  # nothing submitted here yet: an empty list, as on a new cluster
    if queues:
        stats = client.queue_stats()
        if as_json:
            _echo_json(stats)
            return
        width = max(len(s.value) for s in JobState)  # "dispatched" whole
        click.echo(f"{'queue':<16} " + " ".join(f"{s.value:>{width}}" for s in JobState))
        for q, counts in sorted(stats.items()):
            click.echo(
                f"{q:<16} " + " ".join(f"{counts.get(s.value, 0):>{width}}" for s in JobState)
            )
        return
    if full:
        if ids:
            chosen = _expand_ids(client, named)
        else:
            chosen = [row[0] for row in client.table(["id"], state=wanted, owner=user)]
        described = [client.describe(job_id) for job_id in chosen]
        described = [d for d in described if not ids or asked is None or d["state"] in asked]
        if as_json:  # one job named by its id: its object, as ever; else a list
            one = len(named) == 1 and not named[0].whole_array and len(described) == 1
            _echo_json(described[0] if one else described)
            return
        for i, data in enumerate(described):
            if i:
                click.echo("")
            for key, value in _full_lines(data):
                click.echo(f"{key:>20}: {_shown_value(key, value)}")
        return
    if ids:
        jobs = [client.get(job_id) for job_id in _expand_ids(client, named)]
        jobs = [j for j in jobs if asked is None or j.state in asked]
    elif not as_json:  # the table's fields alone: far cheaper than whole jobs
        from ebbtide.client import TABLE_COLUMNS

        rows = client.table(TABLE_COLUMNS, state=wanted, owner=user)
        jobs = [SimpleNamespace(**dict(zip(TABLE_COLUMNS, row, strict=True))) for row in rows]
    else:
        jobs = client.list(state=wanted, owner=user)
    if as_json:
        _echo_json([client.as_dict(j) for j in jobs])
        return
    _echo_table(jobs, expand=tasks, unfinished_only=unfinished_only)


def _echo_table(jobs: Sequence[Any], *, expand: bool, unfinished_only: bool = False) -> None:
    """``qstat``'s table: a line per job, or per array unless ``expand``; when it lists
    only unfinished jobs and there are none, a note says where the finished ones are."""
    if not jobs and unfinished_only:
        click.echo("ebb: note: no job is waiting or running; -x lists finished jobs", err=True)
    rows = [
        _row(group[0]) if len(group) == 1 else _array_row(group)
        for group in _grouped(jobs, expand=expand)
    ]
    # the ID column is as wide as its longest id (an array's 12345[1-1000] too)
    width = max([6, *(len(ident) for ident, _ in rows)])
    lines = [
        f"{'ID':>{width}} {'NAME':<20} {'USER':<10} {'QUEUE':<10} {'PRI':>4} {'STATE':<10} "
        f"{'ATT':>3} {'NODE/DEV':<14} {'SLICE':<12} {'START':>8}  REASON"
    ]
    lines.extend(f"{ident:>{width}} {rest}" for ident, rest in rows)
    click.echo("\n".join(lines))


def _grouped(jobs: Sequence[Any], *, expand: bool) -> list[list[Any]]:
    """Jobs in order, the tasks of each array (next to each other, as ids are given)
    together in one group unless ``expand``."""
    groups: list[list[Any]] = []
    for j in jobs:
        if (
            not expand
            and j.array_id is not None
            and groups
            and groups[-1][0].array_id == j.array_id
        ):
            groups[-1].append(j)
        else:
            groups.append([j])
    return groups


def _row(j: Any) -> tuple[str, str]:
    """A job's line of the table: its id, and the rest."""
    where = f"{j.node}/{j.devices}" if j.node else "-"
    return str(j.id), (
        f"{j.name[:20]:<20} {j.owner[:10]:<10} {j.queue[:10]:<10} {j.priority:>4} "
        f"{_state_text(j):<10} {j.attempts:>3} {where[:14]:<14} {_slice_text(j):<12} "
        f"{_fmt_time(j.started_at):>8}  {j.reason}"
    )


def _array_row(tasks: Sequence[Any]) -> tuple[str, str]:
    """One line for an array's tasks: ``12[1-100]``, its state if they share one, and
    how many tasks are in each state (its id, and the rest)."""
    first = tasks[0]
    indices = [t.array_index for t in tasks]
    ident = f"{first.array_id}[{min(indices)}-{max(indices)}]"
    counts = Counter(_state_text(t) for t in tasks)
    state = next(iter(counts)) if len(counts) == 1 else "mixed"
    name = first.name.rsplit("[", 1)[0]
    started = min((t.started_at for t in tasks if t.started_at), default=None)
    spread = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return ident, (
        f"{name[:20]:<20} {first.owner[:10]:<10} {first.queue[:10]:<10} "
        f"{first.priority:>4} {state:<10} {'-':>3} {'-':<14} {_slice_text(first):<12} "
        f"{_fmt_time(started):>8}  {len(tasks)} tasks: {spread} (-t for each)"
    )


#: PBS's job state letters (``qselect -s QR``), as ebbtide's states.
PBS_STATE_LETTERS = {
    "Q": ("queued",),
    "R": ("running",),
    "H": ("held",),
    "W": ("waiting",),
    "E": ("evicting",),
    "F": ("succeeded", "failed", "cancelled"),
}


def _states(states: Sequence[str]) -> list[Any] | None:
    """``-s`` values (names, or PBS letters like ``QR``) as job states; None: all."""
    from ebbtide.queue.states import JobState

    wanted: list[JobState] = []
    for text in states:
        if text and all(ch in PBS_STATE_LETTERS for ch in text):
            wanted.extend(JobState(s) for ch in text for s in PBS_STATE_LETTERS[ch])
            continue
        try:
            wanted.append(JobState(text.lower()))
        except ValueError:
            raise UserError(
                f"-s: expected one of {JOB_STATES_HELP}, or PBS letters (Q R H W E F), "
                f"got {shown(text)}"
            ) from None
    return wanted or None


def _shown_value(key: str, value: Any) -> Any:
    """A ``qstat -f`` value for people: times (``*_at``, ``backoff_until``) as local ISO
    timestamps."""
    if (key.endswith("_at") or key == "backoff_until") and isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    return value


def _state_text(j: Any) -> str:
    """``suspended`` for a running job whose GPU memory was moved to host memory (online
    memory was short), ``paused`` for one frozen in place by a compute spike, else its
    state."""
    if j.state == "running" and getattr(j, "suspended_at", None):
        return "suspended"
    if j.state == "running" and getattr(j, "paused_at", None):
        return "paused"
    return str(j.state)


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
                if job.state in final:
                    return  # ended before it ever started
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


# -- qalter -----------------------------------------------------------------------------


@click.command("qalter", context_settings={"help_option_names": ["--help"]})
@click.argument("ids", nargs=-1, required=True)
@click.option("-N", "name", help="New job name.")
@click.option("-p", "priority", help="New priority, -1024..1023.")
@click.option(
    "-l",
    "resources",
    multiple=True,
    help="New resources: gpu=, gpumem=, walltime=, deadline=, checkpoint_interval= (as qsub).",
)
@click.option("--deadline", help="New eviction deadline, 1s..1h.")
@click.option("--kind", type=click.Choice(["training", "inference", "batch"]))
@click.option("--json", "as_json", is_flag=True, help="Print the altered jobs as qstat --json.")
def qalter(
    ids: Sequence[str],
    name: str | None,
    priority: str | None,
    resources: Sequence[str],
    deadline: str | None,
    kind: str | None,
    as_json: bool,
) -> None:
    """Change jobs that have not started (held, waiting or queued): `ebb qalter 12 -l
    gpu=50%,walltime=4:00:00 -p 10`. `12[]` alters every task of an array. A running job
    keeps the slice it was given; qdel and qsub again to change it."""
    from ebbtide.client import ALTERABLE_FIELDS
    from ebbtide.queue.qsub import parse_resources
    from ebbtide.units import parse_int

    changes: dict[str, Any] = {}
    for text in resources:
        for key, value in parse_resources(text).items():
            if key not in ALTERABLE_FIELDS:
                raise UserError(f"-l: {key} cannot be altered; give gpu, gpumem, walltime, "
                                "deadline or checkpoint_interval")  # fmt: skip
            changes[key] = value
    if deadline is not None:
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
        raise UserError("qalter needs something to change: -N, -p, -l, --deadline or --kind")
    parsed = _parse_ids(ids)
    client = _client()
    altered = [client.alter(job_id, **changes) for job_id in _expand_ids(client, parsed)]
    if as_json:
        _echo_json([client.as_dict(j) for j in altered])
        return
    for job in altered:
        click.echo(f"{job.id}: altered ({', '.join(f'{k}={v}' for k, v in changes.items())})")


# -- qdel / qhold / qrls ----------------------------------------------------------------


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


def _expand_ids(client: Any, ids: Sequence[JobRef]) -> list[int]:
    """The jobs :func:`_parse_ids` named, an array as each of its tasks."""
    out: list[int] = []
    for ref in ids:
        if not ref.whole_array and ref.index is None:
            out.append(ref.id)
            continue
        tasks = client.list(array_id=ref.id)
        if not tasks:
            raise UserError(f"no array with id {ref.id}")
        if ref.whole_array:
            out.extend(t.id for t in tasks)
            continue
        task = next((t.id for t in tasks if t.array_index == ref.index), None)
        if task is None:
            indices = [t.array_index for t in tasks]
            raise UserError(
                f"array {ref.id} has no task {ref.index} (its tasks: {min(indices)}-"
                f"{max(indices)}, {len(indices)} of them)"
            )
        out.append(task)
    return out


def _one_job(text: str) -> JobRef:
    """The one job ``text`` names (``12``, or an array's task ``12[3]``), for commands
    that act on one job (``ebb logs``, ``ebb events``); checked before any store is
    opened (:func:`_expand_ids` finds a task's id)."""
    [ref] = _parse_ids([text])
    if ref.whole_array:
        raise UserError(f"ID: {shown(text, 60)} is a whole array; name one task, like {ref.id}[1]")
    return ref


def _act(ids: Sequence[str], action: str, as_json: bool) -> None:
    parsed = _parse_ids(ids)
    client = _client()
    results = []
    failed = False
    for job_id in _expand_ids(client, parsed):
        try:
            job = getattr(client, action)(job_id)
            results.append({"id": job_id, "ok": True, "state": job.state, "reason": job.reason})
        except UserError as exc:
            failed = True
            results.append({"id": job_id, "ok": False, "error": str(exc)})
            if not as_json:
                click.echo(f"ebb: error: {exc}", err=True)
    if as_json:
        _echo_json(results)
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


@click.command("events")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the events as a JSON list.")
def events(job_id: str, as_json: bool) -> None:
    """Show what happened to a job, oldest first."""
    ref = _one_job(job_id)
    client = _client()
    evs = client.events(_expand_ids(client, [ref])[0])
    if as_json:
        _echo_json(evs)
        return
    for e in evs:
        extra = {k: v for k, v in e.items() if k not in ("type", "time", "attempt")}
        att = f"#{e['attempt']}" if e["attempt"] else "  "
        detail = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        click.echo(f"{_fmt_time(e['time'])} {att:>3} {e['type']:<16} {detail}")


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
    if log_tail.truncated:
        click.echo(
            f"ebb: only the end of the log is shown ({log_tail.size} bytes in all); "
            "--tail BYTES for more",
            err=True,
        )
