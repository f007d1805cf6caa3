"""The raw qsub options (:class:`QsubOptions`), the options a directive line may carry,
and how an error names where a bad value came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.queue.spec import JobSpec


@dataclass
class QsubOptions:
    """The raw qsub option values, as strings, from the command line or a script.

    ``None`` (or an empty list, or ``hold=False``) means "not given".  ``script`` is the
    script's *text* (see :func:`load_script`), ``command`` an argv list; ``args`` go to
    the script.  ``origin`` maps a field (``"array"``), or one entry of a list field
    (``"resources.0"``), to the script line it came from (``"train.sh line 3"``), so
    errors can point there; it is empty for command-line options.
    """

    name: str | None = None
    queue: str | None = None
    priority: str | None = None
    resources: list[str] = field(default_factory=list)
    array: str | None = None
    depend: list[str] = field(default_factory=list)
    hold: bool = False
    #: ``--pause`` (True) or ``--no-pause`` (False); None: the queue's default
    pause: bool | None = None
    env: list[str] = field(default_factory=list)
    kind: str | None = None
    deadline: str | None = None
    signal: str | None = None
    checkpoint_dir: str | None = None
    cwd: str | None = None
    max_attempts: str | None = None
    image: str | None = None
    #: where stdout / stderr go (``-o``, ``-e``, ``--output``, ``--error``)
    stdout: str | None = None
    stderr: str | None = None
    #: PBS ``-j oe`` / ``eo`` / ``n``
    join: str | None = None
    account: str | None = None
    #: ``-V`` / ``--export``: ``ALL``, ``NONE``, or Slurm's ``[ALL,]VAR[=value],...``
    export: str | None = None
    #: PBS ``-S``: the shell for a script with no ``#!`` line
    shell: str | None = None
    #: Slurm's ``--signal=B:``: the warning goes to the script's shell alone
    signal_shell_only: bool = False
    #: ``pbs`` or ``slurm``: whose directives these are, whose variables the job sees
    compat: str | None = None
    script: str | None = None
    command: list[str] | None = None
    args: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)
    #: one line per directive accepted without effect, for the submitter to read
    notes: list[str] = field(default_factory=list)


# Directive options: option → (QsubOptions field, takes a value).
_DIRECTIVE_OPTIONS: dict[str, tuple[str, bool]] = {
    "-N": ("name", True),
    "-q": ("queue", True),
    "-p": ("priority", True),
    "-l": ("resources", True),
    "-J": ("array", True),
    "-W": ("depend", True),
    "-h": ("hold", False),
    "--pause": ("pause", False),
    "--no-pause": ("pause", False),
    "-v": ("env", True),
    "-d": ("cwd", True),
    "--cwd": ("cwd", True),
    "--kind": ("kind", True),
    "--deadline": ("deadline", True),
    "--signal": ("signal", True),
    "--checkpoint-dir": ("checkpoint_dir", True),
    "--max-attempts": ("max_attempts", True),
    "--image": ("image", True),
    # PBS Pro, OpenPBS and Torque
    "-o": ("stdout", True),
    "-e": ("stderr", True),
    "-j": ("join", True),
    "-A": ("account", True),
    "-V": ("export", False),
    "-S": ("shell", True),
    "-t": ("array", True),  # Torque's array option
    "-w": ("cwd", True),  # Torque's working directory
}
#: PBS options accepted without effect, with what the submitter is told.
PBS_IGNORED: dict[str, tuple[bool, str]] = {
    "-m": (True, "mail is not sent; watch the job with ebb qstat or ebb events"),
    "-M": (True, "mail is not sent; watch the job with ebb qstat or ebb events"),
    "-r": (
        True,
        "ebbtide requeues a job it evicts whatever -r says; a failed job is rerun "
        "only up to --max-attempts",
    ),
    "-k": (True, "output is written where it goes as the job runs, not kept and copied"),
    "-P": (True, "projects are not used (-A records an account)"),
    "-a": (True, "a start time is not honoured; submit held (-h) and release with qrls"),
    "-c": (True, "checkpoints are the job's own (EBBTIDE_CHECKPOINT_DIR, exit 99)"),
    "-u": (True, "jobs run as the user who submits them"),
    "-C": (True, "the directive prefix is not changed"),
    "-z": (False, "the job id is always printed"),
}
#: PBS ``-W`` attributes accepted without effect, with what the submitter is told.
PBS_IGNORED_ATTRIBUTES = {
    "group_list": "the job runs with its owner's groups",
    "sandbox": "the job runs in its working directory",
    "umask": "files are made with the job's own umask",
    "block": "qsub returns at once; wait with ebb qstat",
    "stagein": "files are not staged; the job reads them where they are",
    "stageout": "files are not staged; the job writes them where they go",
    "x": "extra scheduler attributes are not used",
    "run_count": "runs are counted by ebbtide",
    "tolerate_node_failures": "a job runs on one node",
}
_LIST_FIELDS = frozenset({"resources", "depend", "env", "args", "notes"})
# How errors name each field's option.
_FLAGS = {f: opt for opt, (f, _) in reversed(_DIRECTIVE_OPTIONS.items())}


def _error(where: str | None, flag: str, message: str) -> SpecError:
    """``-l gpu: msg`` from the command line, ``job.sh line 3: -l gpu: msg`` from a script."""
    return SpecError(where, f"{flag}: {message}") if where else SpecError(flag, message)


def _probe(kwargs: dict[str, Any], where: str | None, flag: str) -> None:
    """Check values against :class:`JobSpec`'s own rules, reporting the flag on failure."""
    try:
        JobSpec(command=["true"], **kwargs)
    except SpecError as exc:
        raise _error(where, flag, exc.reason) from None


def _note(notes: list[str] | None, where: str | None, what: str, why: str) -> None:
    """One line for the submitter about something accepted without (full) effect."""
    if notes is not None:
        notes.append(f"{where}: {what}: {why}" if where else f"{what}: {why}")
