"""Slurm's ``sbatch`` options, as ``#SBATCH`` lines and on ``ebb sbatch``'s command line.

(Longer than our modules should be: it is one dialect: the table of ``sbatch``'s options and
a short translator for each, read against Slurm's manual option by option.)

Each option is translated into the :class:`~ebbtide.queue.qsub.QsubOptions` that
``ebb qsub`` would take for it, so one builder checks every value and names where it came
from (``train.sbatch line 4: -l walltime: ...``).  What has a meaning here is mapped:

=================================  ================================================
``-J/--job-name``                  the job's name
``--gres=gpu[:TYPE]:N``,           whole GPUs (the type is not matched: a note says so)
``-G/--gpus``, ``--gpus-per-node``
``-t/--time``                      walltime (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``)
``-a/--array``                     array (``1-10``, ``0-15:4``, ``1-100%5``)
``-o/--output``, ``-e/--error``    where output goes (``%j %A %a %x %u %N``)
``--signal=[B:]SIG[@SECS]``        the warning signal; ``B:`` the script's shell alone;
                                   ``@SECS`` the time it has to checkpoint (deadline)
``-d/--dependency``                afterok, afternotok, afterany
``-D/--chdir``                     working directory
``-p/--partition``                 queue
``-A/--account``                   account (recorded)
``--export``                       ``ALL`` (the default), ``NONE``, ``VAR[=value]``
``-c/--cpus-per-task``, ``--mem``  recorded (``--mem`` in MB unless it says)
``-H/--hold``, ``--requeue``       held; requeue (ebbtide always requeues evicted jobs)
=================================  ================================================

Options with no meaning here (``--mail-type``, ``--qos``, ``--exclusive``, ...) are
accepted with a note; more than one node or task, and options that change what a job
is (``--wrap`` aside), are refused with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ebbtide import units
from ebbtide.errors import SpecError
from ebbtide.queue.qsub import QsubOptions

#: Short options and their long names.
SHORT = {
    "-J": "--job-name",
    "-G": "--gpus",
    "-t": "--time",
    "-a": "--array",
    "-o": "--output",
    "-e": "--error",
    "-d": "--dependency",
    "-D": "--chdir",
    "-p": "--partition",
    "-A": "--account",
    "-c": "--cpus-per-task",
    "-H": "--hold",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-q": "--qos",
    "-C": "--constraint",
    "-w": "--nodelist",
    "-x": "--exclude",
    "-Q": "--quiet",
    "-v": "--verbose",
    "-s": "--oversubscribe",
    "-L": "--licenses",
    "-k": "--no-kill",
    "-M": "--clusters",
    "-i": "--input",
}

#: Options that take no value.
FLAGS = frozenset(
    {
        "--hold",
        "--requeue",
        "--no-requeue",
        "--exclusive",
        "--quiet",
        "--verbose",
        "--oversubscribe",
        "--no-kill",
        "--parsable",
        "--overcommit",
        "--contiguous",
        "--spread-job",
        "--use-min-nodes",
        "--test-only",
        "--wait",
        "--get-user-env",
        "--ignore-pbs",
    }
)

#: Options accepted without effect, with what the submitter is told.
IGNORED = {
    "--mail-type": "mail is not sent; watch the job with ebb qstat or ebb events",
    "--mail-user": "mail is not sent; watch the job with ebb qstat or ebb events",
    "--qos": "there are no QOS levels; partitions (queues) and priorities (ebb qsub -p) order jobs",
    "--constraint": "node features are not matched",
    "--exclusive": "a job gets the slice it asks for, never a whole node",
    "--nodelist": "the scheduler picks the node",
    "--exclude": "the scheduler picks the node",
    "--nice": "use -p (priority) with ebb qsub",
    "--comment": "comments are not kept",
    "--hint": "CPU binding is not managed",
    "--mem-bind": "memory binding is not managed",
    "--cpu-bind": "CPU binding is not managed",
    "--gpu-bind": "GPU binding is not managed",
    "--gres-flags": "GPU placement flags are not used",
    "--distribution": "task distribution does not apply to one task",
    "--ntasks-per-node": "a job runs as one task",
    "--ntasks-per-core": "a job runs as one task",
    "--ntasks-per-socket": "a job runs as one task",
    "--threads-per-core": "CPU binding is not managed",
    "--sockets-per-node": "CPU binding is not managed",
    "--cores-per-socket": "CPU binding is not managed",
    "--open-mode": "the first attempt starts the output file afresh, later ones append",
    "--begin": "a start time is not honoured; submit held (--hold) and release with qrls",
    "--deadline": "Slurm's --deadline is not used (ebbtide's deadline is the eviction deadline)",
    "--licenses": "licenses are not counted",
    "--reservation": "there are no reservations",
    "--wckey": "workload keys are not used",
    "--tmp": "local disk is not reserved",
    "--oversubscribe": "a job gets the slice it asks for",
    "--no-kill": "a job runs on one node",
    "--propagate": "resource limits are the node's",
    "--switches": "a job runs on one node",
    "--time-min": "the walltime is --time",
    "--requeue": "ebbtide requeues a job it evicts, from its last checkpoint",
    "--no-requeue": "ebbtide requeues a job it evicts whatever --no-requeue says; a "
    "failed job is rerun only up to --max-attempts",
    "--quiet": "",
    "--verbose": "",
    "--parsable": "",
    "--clusters": "there is one fleet",
    "--get-user-env": "the job gets the submitter's environment (--export=ALL) by default",
    "--export-file": "give variables with --export",
    "--profile": "profiling data is not gathered",
    "--acctg-freq": "accounting is ebbtide's",
    "--uid": "jobs run as the user who submits them",
    "--gid": "jobs run with their owner's groups",
    "--overcommit": "a job gets the slice it asks for",
    "--contiguous": "a job runs on one node",
    "--spread-job": "a job runs on one node",
    "--use-min-nodes": "a job runs on one node",
    "--mcs-label": "not used",
    "--power": "not used",
    "--priority": "use -p (priority) with ebb qsub",
    "--cluster-constraint": "there is one fleet",
    "--container": "give an image with --image under Kubernetes",
    "--ignore-pbs": "",
    "--mem-per-cpu": "host memory is recorded from --mem only",
    "--mem-per-gpu": "host memory is recorded from --mem only",
    "--gpu-freq": "GPU clocks are not managed",
    "--cpus-per-gpu": "CPUs are recorded from --cpus-per-task",
    "--ntasks-per-gpu": "a job runs as one task",
    "--cpu-freq": "CPU clocks are not managed",
    "--kill-on-invalid-dep": "dependencies behave as ebb qsub -W depend's do",
}

DEPENDENCY_KINDS = ("afterok", "afternotok", "afterany")
SLURM_TIME_FORMS = (
    "minutes (30), MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 2:00:00 or 1-12:00:00"
)

_Handler = Callable[[QsubOptions, str, str, str], None]
#: Converts one option's value to an ``-l`` value (None: nothing to record), noting what
#: it does not honour.
_Convert = Callable[[str, str, str, list[str]], str | None]


def parse_sbatch_tokens(tokens: list[str], where: str) -> QsubOptions:
    """One ``#SBATCH`` line's options (``--job-name=x -t 10``) as :class:`QsubOptions`;
    values are checked by :func:`~ebbtide.queue.qsub.build_spec_kwargs`."""
    return _options(split_options(tokens, where)[0], where)


#: ``ebb sbatch``'s own flags, not sbatch's, taken among its options before the script
#: (``-h``/``--help``: sbatch's help, wherever among them).
OWN_FLAGS = frozenset({"--json", "--allow-future", "-h", "--help"})


def parse_sbatch_command_line(words: list[str]) -> tuple[QsubOptions, set[str], list[str]]:
    """``ebb sbatch``'s words: the options before the script as :class:`QsubOptions`,
    the names of the options given (``--parsable``, and ebbtide's own :data:`OWN_FLAGS`),
    and the script with its arguments (which may hold anything, ``--json`` too)."""
    pairs, end = split_options(words, "command line", until_argument=True, own=OWN_FLAGS)
    mine = [(o, v) for o, v in pairs if o not in OWN_FLAGS]
    return _options(mine, "command line"), {option for option, _ in pairs}, words[end:]


def _options(pairs: list[tuple[str, str]], where: str) -> QsubOptions:
    opts = QsubOptions(compat="slurm")
    for option, value in pairs:
        apply(opts, option, value, where)
    return opts


def split_options(
    tokens: list[str],
    where: str | None,
    *,
    until_argument: bool = False,
    own: frozenset[str] = frozenset(),
) -> tuple[list[tuple[str, str]], int]:
    """``--opt=value``, ``--opt value``, ``-o value`` and ``-ovalue`` as (long name, value)
    pairs (value ``""`` for flags), and how many tokens they took.  A token that is not an
    option ends them (``until_argument``: the script on a command line) or is an error
    naming ``where`` (an ``#SBATCH`` line holds options only)."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--" and until_argument:  # the end of options: the script is next
            return found, i + 1
        if token.startswith("--"):
            option, sep, value = token.partition("=")
        elif token.startswith("-") and len(token) >= 2:
            option, value, sep = SHORT.get(token[:2], token[:2]), token[2:], token[2:]
        elif until_argument:
            break
        else:
            raise _error(where, f"unexpected argument {token!r}; #SBATCH lines hold options only")
        if option in own:  # a flag of ebbtide's own (``own``)
            if sep:
                raise _error(where, f"{option} takes no value")
            found.append((option, ""))
            i += 1
            continue
        known = option in FLAGS or option in _HANDLERS or option in IGNORED
        if not known:
            raise _error(where, f"unknown sbatch option {option}; see ebb sbatch --help")
        if option in FLAGS:
            if sep:
                raise _error(where, f"{option} takes no value")
            value = ""
        elif not sep:
            if i + 1 >= len(tokens):
                raise _error(where, f"{option} needs a value")
            i += 1
            value = tokens[i]
        found.append((option, value))
        i += 1
    return found, i


def apply(opts: QsubOptions, option: str, value: str, where: str) -> None:
    """Set what ``option value`` means on ``opts`` (or note that it means nothing here)."""
    if option in _HANDLERS:
        _HANDLERS[option](opts, option, value, where)
    elif IGNORED.get(option):
        shown_value = f"={value}" if value else ""
        opts.notes.append(
            f"{where}: {option}{shown_value}: accepted, without effect: {IGNORED[option]}"
        )


def _error(where: str | None, message: str) -> SpecError:
    return SpecError(where or "sbatch", message)


def _set(field: str) -> _Handler:
    def handler(opts: QsubOptions, option: str, value: str, where: str) -> None:
        setattr(opts, field, value)
        opts.origin[field] = where

    return handler


def _resource(key: str, convert: _Convert) -> _Handler:
    def handler(opts: QsubOptions, option: str, value: str, where: str) -> None:
        converted = convert(option, value, where, opts.notes)
        if converted is None:
            return
        opts.origin[f"resources.{len(opts.resources)}"] = where
        opts.resources.append(f"{key}={converted}")

    return handler


def slurm_time_s(text: str) -> float | None:
    """Slurm's ``--time`` in seconds (None for ``UNLIMITED``/``INFINITE``); a bare number
    is minutes.  Raises ``ValueError``."""
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = re.fullmatch(r"(?:([0-9]{1,6})-)?([0-9]{1,9})(?::([0-9]{1,9}))?(?::([0-9]{1,9}))?", value)
    if not m:
        raise ValueError(f"expected {SLURM_TIME_FORMS}, got {units.shown(text, 60)}")
    days, first, second, third = m.groups()
    parts = [p for p in (first, second, third) if p is not None]
    # as -l walltime (units.clock_value): the first field that is not zero may run past
    # its clock (0:90, 0-36:00:00), the ones after it not (25:99:00 is refused)
    if days is not None:  # D-H, D-H:M, D-H:M:S: in units of the last field given
        given = units.CLOCK_FIELDS[: 1 + len(parts)]
        total = units.clock_value(value, [days, *parts], given)
        for _, base in units.CLOCK_FIELDS[len(given) :]:
            total *= base
    elif len(parts) == 1:  # a bare number is minutes
        total = int(parts[0]) * 60.0
    else:  # M:S, H:M:S
        total = units.clock_value(value, parts, units.CLOCK_FIELDS[-len(parts) :])
    return float(total)


def _time(option: str, value: str, where: str, notes: list[str]) -> str | None:
    try:
        seconds = slurm_time_s(value)
    except ValueError as exc:
        raise _error(where, f"{option}: {exc}") from None
    if seconds is None or seconds == 0:  # Slurm: "a time limit of zero" is no limit
        notes.append(f"{where}: {option}={value}: no walltime; the job runs until it ends")
        return None
    if seconds < 0:
        raise _error(where, f"{option}: must be more than zero, got {value!r}")
    if seconds > units.MAX_DURATION_S:
        raise _error(where, f"{option}: must be at most 366 days, got {value!r}")
    return f"{seconds:g}"


def _gres(option: str, value: str, where: str, notes: list[str]) -> str | None:
    """``gpu[:TYPE][:N]`` (comma-separated with other gres) → N whole GPUs."""
    count: str | None = None
    for item in value.split(","):
        name, *rest = item.strip().split(":")
        if name != "gpu":
            raise _error(
                where, f"{option}: only GPUs (gpu[:TYPE]:N) can be asked for here, got {item!r}"
            )
        count = rest[-1] if rest and rest[-1].isdigit() else "1"
        if len(rest) == 2 or (len(rest) == 1 and not rest[0].isdigit()):
            notes.append(_type_note(where, option, rest[0]))
    return None if count is None else _gpu_count(option, count, where)


def _gpus(option: str, value: str, where: str, notes: list[str]) -> str | None:
    """``[TYPE:]N`` → N whole GPUs."""
    kind, sep, count = value.strip().rpartition(":")
    if sep:
        notes.append(_type_note(where, option, kind))
    return _gpu_count(option, count, where)


def _gpu_count(option: str, count: str, where: str) -> str:
    """``count`` if it is a number of whole GPUs ebbtide takes, else an error naming the
    option it came with (not the ``-l gpus`` it becomes)."""
    if not count.isdigit() or not 1 <= int(count) <= units.MAX_GPUS:
        raise _error(
            where,
            f"{option}: expected a whole number of GPUs from 1 to {units.MAX_GPUS}, got "
            f"{units.shown(count, 20)}",
        )
    return count


def _type_note(where: str, option: str, kind: str) -> str:
    return (
        f"{where}: {option}: GPU type {kind!r} is not matched; the job gets any GPU with "
        "the room it asks for"
    )


def _one(option: str, value: str, where: str, what: str) -> None:
    """A count that must be 1 here (``--nodes=1``, ``--ntasks=1``, ``--nodes=1-1``)."""
    low, _, high = value.strip().partition("-")
    if low.strip() != "1" or high.strip() not in ("", "1"):
        raise _error(
            where,
            f"{option}: asks for {units.shown(value, 30)} {what}; a job runs as one task on "
            "one node here (give the GPUs it needs with --gres=gpu:N)",
        )


def _cpus(option: str, value: str, where: str, notes: list[str]) -> str | None:
    return value


def _mem(option: str, value: str, where: str, notes: list[str]) -> str | None:
    """``--mem=16G`` (MB when it has no unit, as in Slurm); ``0`` (all of the node's) is
    not recorded."""
    text = value.strip()
    if text == "0":
        notes.append(f"{where}: {option}=0: no host memory is recorded")
        return None
    return f"{text}M" if re.fullmatch(r"[0-9]+", text) else text


def _array(opts: QsubOptions, option: str, value: str, where: str) -> None:
    if "," in value:
        raise _error(
            where,
            f"{option}: index lists ({units.shown(value, 40)}) are not supported; give one "
            "range like 1-100, 0-15:4 or 1-100%5",
        )
    opts.array = value
    opts.origin["array"] = where


def _dependency(opts: QsubOptions, option: str, value: str, where: str) -> None:
    if "?" in value:
        raise _error(where, f"{option}: '?' (any of) is not supported; every dependency must hold")
    for item in value.split(","):
        kind = item.split(":", 1)[0].strip()
        if kind not in DEPENDENCY_KINDS:
            raise _error(
                where,
                f"{option}: {kind!r} is not supported; use {', '.join(DEPENDENCY_KINDS)}",
            )
    opts.origin[f"depend.{len(opts.depend)}"] = where
    opts.depend.append(f"depend={value}")


def _signal(opts: QsubOptions, option: str, value: str, where: str) -> None:
    """``[R:][B:]SIG[@SECS]`` (flags in either order)."""
    text = value.strip()
    flags = ""
    while re.match(r"[RB]:", text, flags=re.IGNORECASE):
        flags += text[0].upper()
        text = text[2:]
    sig, sep, secs = text.partition("@")
    opts.signal = sig
    opts.origin["signal"] = where
    opts.signal_shell_only = "B" in flags
    if "R" in flags:
        opts.notes.append(f"{where}: {option}: R: (reservations) does not apply")
    if sep:
        # Slurm warns SECS before the time limit; here a warning comes at an eviction and
        # the job has its deadline to checkpoint, so SECS is that deadline
        opts.deadline = f"{secs.strip()}s" if secs.strip().isdigit() else secs
        opts.origin["deadline"] = where
        opts.origin["deadline.flag"] = f"{option} @SECS"  # what an error names


def _nodes(opts: QsubOptions, option: str, value: str, where: str) -> None:
    _one(option, value, where, "nodes")


def _ntasks(opts: QsubOptions, option: str, value: str, where: str) -> None:
    _one(option, value, where, "tasks")


def _name(opts: QsubOptions, option: str, value: str, where: str) -> None:
    """A job name; characters a name here cannot hold (spaces, ...) become ``_``."""
    name = re.sub(r"[^A-Za-z0-9_.\-\[\]]", "_", value)[:128]
    if name != value:
        opts.notes.append(f"{where}: {option}: the name is {name!r} ({value!r} as given)")
    opts.name = name
    opts.origin["name"] = where


def _partition(opts: QsubOptions, option: str, value: str, where: str) -> None:
    """A queue; of a list (``gpu,cpu``) the first."""
    first = value.split(",")[0].strip()
    if first != value.strip():
        opts.notes.append(f"{where}: {option}={value}: submitted to the first, {first!r}")
    opts.queue = first
    opts.origin["queue"] = where


def _hold(opts: QsubOptions, option: str, value: str, where: str) -> None:
    opts.hold = True
    opts.origin["hold"] = where


def _wrap(opts: QsubOptions, option: str, value: str, where: str) -> None:
    opts.command = ["/bin/sh", "-c", value]
    if opts.name is None:  # Slurm names a wrapped command "wrap"
        opts.name = "wrap"


def _input(opts: QsubOptions, option: str, value: str, where: str) -> None:
    if value.strip() != "/dev/null":
        raise _error(where, f"{option}: a job's standard input is /dev/null here")


_HANDLERS: dict[str, _Handler] = {
    "--job-name": _name,
    "--partition": _partition,
    "--hold": _hold,
    "--account": _set("account"),
    "--chdir": _set("cwd"),
    "--output": _set("stdout"),
    "--error": _set("stderr"),
    "--export": _set("export"),
    "--time": _resource("walltime", _time),
    "--gres": _resource("gpus", _gres),
    "--gpus": _resource("gpus", _gpus),
    "--gpus-per-node": _resource("gpus", _gpus),
    "--gpus-per-task": _resource("gpus", _gpus),
    "--cpus-per-task": _resource("ncpus", _cpus),
    "--mem": _resource("mem", _mem),
    "--array": _array,
    "--dependency": _dependency,
    "--signal": _signal,
    "--nodes": _nodes,
    "--ntasks": _ntasks,
    "--wrap": _wrap,
    "--input": _input,
}
