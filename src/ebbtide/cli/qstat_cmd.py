"""``ebb qstat``: list jobs (a table, an array on one line), one job in full (``-f``), or
the queues (``-Q``)."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import click

from ebbtide.cli import fast
from ebbtide.cli.common import _client, _echo_json, _listing_client
from ebbtide.cli.job_ids import _expand_ids, _parse_ids
from ebbtide.errors import UserError
from ebbtide.units import format_mib, shown

JOB_STATES_HELP = (
    "held, waiting, queued, dispatched, running, evicting, succeeded, failed, cancelled"
)
#: What ``qstat`` shows for a running job frozen in place by a compute spike, or with its
#: GPU memory moved to host memory: ``-s`` picks them out of ``running`` (which has them).
RUNNING_SUBSTATES = ("paused", "suspended")


def _fmt_time(t: float | None) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _slice_text(job: Any) -> str:
    share = f"{job.gpus}gpu" if job.gpus else f"{job.compute_pct:g}%"
    return f"{share}/{format_mib(job.memory_mib)}"


#: ``--json`` keys that repeat another under an older name (``device`` is ``devices``,
#: ``checkpoint`` is ``checkpoint_path``): ``qstat -f`` shows each value once.
_ALIASES = frozenset({"device", "checkpoint"})


def _full_lines(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """``qstat -f``'s lines: every field, with the slice asked for and the slice granted
    in words where the slice is (``slice granted: 25% 5GiB (qgpu)``), a running job's
    state with its pause or suspension (``running (suspended to host)``), what it used
    where that was measured (``used: compute p95 12%, peak 20%; memory …``) and a hint
    when it asks for far more."""
    from ebbtide.kube.profiles import slice_words
    from ebbtide.queue.rightsizing import Used

    lines: list[tuple[str, Any]] = []
    signal_name = (data.get("submitted") or {}).get("signal_name")
    for key, value in data.items():
        if key in ("slice_asked", "slice_granted") or key in _ALIASES:
            continue
        if key == "signal" and signal_name:
            value = f"{signal_name} ({value})"
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
            lines.extend(
                (name, _script_command(value) if name == "command" else shown)
                for name, shown in value.items()
                if shown is not None and name != "signal_name"  # (with signal, above)
            )
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
    help=f"Only these states: {JOB_STATES_HELP}; paused or suspended (running jobs "
    "frozen by a compute spike, or moved to host memory; running has them too); or PBS's "
    "letters: Q queued, R running, H held, W waiting, E evicting, F finished (-s QR: both). "
    "Repeat -s or give a comma list (-s failed,cancelled).",
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

    A running job frozen by a compute spike shows as paused, one whose GPU memory was
    moved to host memory as suspended. An array is one line, `12[1-100]`, with its tasks
    counted by state (mixed: not all in one); -t shows each task. In -f, times are local
    ISO timestamps (Unix seconds in --json).
    """
    from ebbtide.queue.states import FINAL_STATES, JobState

    chosen_states = _states(states)
    wanted = chosen_states.read
    unfinished_only = wanted is None and not finished and not ids
    if unfinished_only:  # as PBS's qstat and Slurm's squeue
        wanted = [s for s in JobState if s not in FINAL_STATES]
    named = _parse_ids(ids)
    if fast.socket_url() is not None and not (full or ids or queues or as_json):
        answered = fast.qstat_rows([s.value for s in wanted or ()], user)
        if answered is not None:  # a server on this host answered: its table
            rows = [j for j in answered[0] if chosen_states.keeps(j)]
            _echo_table(rows, expand=tasks, unfinished_only=unfinished_only, user=user)
            _note_no_scheduler(lambda: answered[1], rows)
            return
    if ids:  # jobs named: no store is an error
        client = _client()
    elif (client := _listing_client(as_json, {} if queues else [])) is None:
        return  # nothing submitted here yet: an empty list, as on a new cluster
    if queues:
        stats = client.queue_stats()
        if as_json:  # every state, 0 included, as the table shows them
            _echo_json(
                {q: {s.value: c.get(s.value, 0) for s in JobState} for q, c in stats.items()}
            )
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
        described = [d for d in described if chosen_states.keeps(SimpleNamespace(**d))]
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
        jobs = [j for j in jobs if chosen_states.keeps(j)]
    elif not as_json:  # the table's fields alone: far cheaper than whole jobs
        from ebbtide.client import TABLE_COLUMNS

        rows = client.table(TABLE_COLUMNS, state=wanted, owner=user)
        jobs = [SimpleNamespace(**dict(zip(TABLE_COLUMNS, row, strict=True))) for row in rows]
        jobs = [j for j in jobs if chosen_states.keeps(j)]
    else:
        jobs = [j for j in client.list(state=wanted, owner=user) if chosen_states.keeps(j)]
    if as_json:
        _echo_json([client.as_dict(j) for j in jobs])
        return
    _echo_table(jobs, expand=tasks, unfinished_only=unfinished_only, user=user)
    _note_no_scheduler(client.scheduler_running, jobs)


def _note_no_scheduler(running: Callable[[], bool | None], jobs: Sequence[Any]) -> None:
    """A trial's trap: with no scheduler running, a queued job's REASON stayed empty and
    nothing said why; one a scheduler had given went on being shown, as if it still held.
    A note says so when a job listed is queued or waiting (``running``: whether a
    scheduler leads, asked only then)."""
    from ebbtide.queue.states import JobState
    from ebbtide.waiting import NO_SCHEDULER_NOTE  # (light: the thin client says it too)

    waiting = [j for j in jobs if j.state in (JobState.QUEUED, JobState.WAITING)]
    if not waiting or running() is not False:
        return
    said = any(j.reason for j in waiting)
    stale = "; a REASON shown is what the last one said" if said else ""
    click.echo(f"ebb: note: {NO_SCHEDULER_NOTE}{stale}", err=True)


def _echo_table(
    jobs: Sequence[Any], *, expand: bool, unfinished_only: bool = False, user: str | None = None
) -> None:
    """``qstat``'s table: a line per job, or per array unless ``expand``; when it lists
    only unfinished jobs (of ``user``, with ``-u``) and there are none, a note says where
    the finished ones are."""
    if not jobs and unfinished_only:
        # a trial's trap: `qstat -u nobody` said "no job is waiting or running" beside others'
        whose = f"of {user} " if user else ""
        click.echo(
            f"ebb: note: no job {whose}is waiting or running; -x lists finished jobs", err=True
        )
    rows = [
        _row(group[0]) if len(group) == 1 else _array_row(group)
        for group in _grouped(jobs, expand=expand)
    ]
    # the ID column is as wide as its longest id (an array's 12345[1-1000] too)
    width = max([6, *(len(ident) for ident, _ in rows)])
    lines = [
        f"{'ID':>{width}} {'NAME':<20} {'USER':<10} {'QUEUE':<10} {'PRI':>5} {'STATE':<10} "
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
        f"{j.name[:20]:<20} {j.owner[:10]:<10} {j.queue[:10]:<10} {j.priority:>5} "
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
        f"{first.priority:>5} {state:<10} {'-':>3} {'-':<14} {_slice_text(first):<12} "
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


@dataclass(frozen=True)
class StateFilter:
    """What ``-s`` asked for."""

    #: the job states to read (None: all)
    read: list[Any] | None
    #: the job states asked for by name or letter
    states: frozenset[str]
    #: the running sub-states asked for (``paused``, ``suspended``)
    shown: frozenset[str]

    def keeps(self, j: Any) -> bool:
        """Whether job ``j`` is one asked for: in a state asked (``running`` has the
        paused and suspended ones), or shown as a sub-state asked (``-s paused``)."""
        return self.read is None or j.state in self.states or _state_text(j) in self.shown


def _states(states: Sequence[str]) -> StateFilter:
    """``-s`` values (names, or PBS letters like ``QR``; each may be a comma list, as
    Slurm's ``squeue -t PD,R``) as a :class:`StateFilter`."""
    from ebbtide.queue.states import JobState

    wanted: list[JobState] = []
    shown_asked: set[str] = set()
    # a trial's trap: `-s succeeded,failed` was refused, while `ebb events -t` takes commas
    for text in (part.strip() for given in states for part in given.split(",")):
        if text and all(ch in PBS_STATE_LETTERS for ch in text):
            wanted.extend(JobState(s) for ch in text for s in PBS_STATE_LETTERS[ch])
        elif text.lower() in RUNNING_SUBSTATES:
            shown_asked.add(text.lower())
        else:
            try:
                wanted.append(JobState(text.lower()))
            except ValueError:
                raise UserError(
                    f"-s: expected one of {JOB_STATES_HELP}, {', '.join(RUNNING_SUBSTATES)}, "
                    f"or PBS letters (Q R H W E F), got {shown(text)}"
                ) from None
    read = wanted + [JobState.RUNNING] * bool(shown_asked and JobState.RUNNING not in wanted)
    return StateFilter(read or None, frozenset(wanted), frozenset(shown_asked))


def _script_command(submitted: dict[str, Any]) -> Any:
    """A script job's ``command`` (``["script"]`` in ``--json``) in words."""
    if submitted.get("command") == ["script"]:
        where = submitted.get("script_path")
        return f"(the script{f' {where}' if where else ''}, with its args)"
    return submitted.get("command")


def _shown_value(key: str, value: Any) -> Any:
    """A ``qstat -f`` value for people (a trial's trap: Python's reprs, ``['python',
    'train.py']``, ``None``, ``{'loss': 0.1}``): times (``*_at``, ``backoff_until``) as
    local ISO timestamps, dependencies as ``-W depend=`` has them
    (``afterok:12[],afterany:13``), a command and its args as a shell would take them
    (``***``, what others see of an argument, as it is), other lists and mappings as
    compact JSON, nothing as ``-``."""
    if (key.endswith("_at") or key == "backoff_until") and isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    if key == "depends" and isinstance(value, list):
        from ebbtide.queue.dependencies import dependency_text

        return ",".join(dependency_text(d) for d in value if isinstance(d, dict)) or "none"
    if value is None:
        return "-"
    if key in ("command", "args") and isinstance(value, list):
        return " ".join(a if a == "***" else shlex.quote(str(a)) for a in value) or "none"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
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
