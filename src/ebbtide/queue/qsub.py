"""qsub-style option parsing: ``-l``, ``-J``, ``-W depend=``, ``-v`` and script directives.

Pure functions, no I/O except :func:`load_script` reading the script file; shared by
``ebb qsub`` and the server's ``POST /qsub``.  The click command (or the request)
collects the raw option strings into a :class:`QsubOptions`, reads the script's
``#PBS`` / ``#EBB`` directive lines into another, and :func:`build_spec_kwargs` merges the
two (the command line wins) into keyword arguments for
:class:`~ebbtide.queue.spec.JobSpec`.

Every error is a :class:`~ebbtide.errors.SpecError` whose message says where the bad
value came from: the flag (``-l gpumem: ...``) or the file and line
(``train.sh line 3: -J: ...``).  Numbers past their bounds are errors that name the
bound; a script must be a regular file of at most
:data:`~ebbtide.scriptfile.MAX_SCRIPT_BYTES`.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pydantic import ValidationError

from ebbtide import units
from ebbtide.errors import SpecError
from ebbtide.queue.spec import (
    MAX_CPUS,
    MAX_DEADLINE_S,
    MAX_DEPENDENCIES,
    MIN_DEADLINE_S,
    ArraySpec,
    JobSpec,
    parse_array_text,
)
from ebbtide.scriptfile import read_script

#: Directive prefixes recognised at the top of a script.
DIRECTIVE_PREFIXES = ("#EBB", "#PBS", "#SBATCH")

KNOWN_RESOURCES = (
    "gpu",
    "gpumem",
    "walltime",
    "deadline",
    "checkpoint_interval",
    "ngpus",
    "gpus",
    "ncpus",
    "mem",
    "select",
    "nodes",
)
#: PBS / Torque resources accepted without effect (each with a line for the submitter).
_PBS_IGNORED_WORDS = """place host vnode vmem pmem pvmem file software arch naccesspolicy
    nice cput pcput mpiprocs ompthreads accelerator accelerator_model gpu_model model feature
    qos other opsys procs tpn epilogue prologue mppwidth mppnppn mppdepth partition ssinodes
    preempt_targets nodect site min_walltime max_walltime scratch localscratch tmpdir jobfs
    storage"""
PBS_IGNORED_RESOURCES = frozenset(_PBS_IGNORED_WORDS.split())
DEPENDENCY_KINDS = ("afterok", "afternotok", "afterany")
JOB_KINDS = ("training", "inference", "batch")
#: Integer options: field → (lowest, highest) allowed, as JobSpec allows.
_INT_RANGES = {"priority": (-1024, 1023), "max_attempts": (1, 100)}

DEPEND_FORMS = "depend=TYPE:ID[:ID...][,TYPE:ID...] with TYPE one of afterok, afternotok, afterany"

# Numbers are ASCII digits, at most 30 of them (more is never a sane value).
_JOB_ID_RE = re.compile(r"([0-9]{1,30})(?:\[\])?(?:\.[A-Za-z0-9_.\-]+)?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Which unit parser validates each ``-l`` resource.
_RESOURCE_PARSERS = {
    "gpu": units.parse_gpu,
    "gpumem": units.parse_memory_mib,
    "walltime": units.parse_duration_s,
    "deadline": units.parse_duration_s,
    "checkpoint_interval": units.parse_duration_s,
}


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


def _check_resource(key: str, value: str, where: str | None, flag: str) -> None:
    """Check one resource value with its unit parser and JobSpec's limits."""
    try:
        parsed: Any = _RESOURCE_PARSERS[key](value)
    except ValueError as exc:
        raise _error(where, flag, str(exc)) from None
    if not isinstance(parsed, tuple) and parsed <= 0:
        raise _error(where, flag, f"must be more than zero, got {value!r}")
    if key == "deadline" and parsed > MAX_DEADLINE_S:
        raise _error(where, flag, f"must be at most {MAX_DEADLINE_S:g}s (1h), got {value!r}")
    if key == "deadline" and parsed < MIN_DEADLINE_S:
        raise _error(where, flag, f"must be at least {MIN_DEADLINE_S:g}s, got {value!r}")
    _probe({key: value}, where, flag)


def parse_resources(
    text: str, *, where: str | None = None, notes: list[str] | None = None
) -> dict[str, Any]:
    """Parse one ``-l`` list (``gpu=25%,gpumem=4GiB``) into JobSpec kwargs.

    Besides ebbtide's own resources, what PBS Pro, OpenPBS and Torque scripts carry:
    ``ngpus=N`` / ``gpus=N`` (whole GPUs), ``ncpus=N`` and ``mem=SIZE`` (recorded as
    ``cpus`` and ``host_memory_mib``), a one-chunk ``select=1:ncpus=…:ngpus=…:mem=…``
    and Torque's ``nodes=1:ppn=…:gpus=…``.  More than one node is refused (a job runs on
    one node); resources with no meaning here (PBS's ``place``, ``vmem``, ...; a site's
    own, like ``system=polaris``) are accepted with a line in ``notes``, but a name close
    to a known one (``gpumen``) is refused as the typo it likely is.  Values are
    checked with their unit parsers, so a bad one is reported as ``-l gpumem: ...``.
    """
    result: dict[str, Any] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep:
            raise _error(where, "-l", f"expected KEY=VALUE, got {item!r}")
        if key in ("select", "nodes"):
            result.update(_parse_chunk(key, value, where, notes))
            continue
        if key in KNOWN_RESOURCES:
            result.update(_one_resource(key, value, where))
            continue
        close = difflib.get_close_matches(key, KNOWN_RESOURCES, n=1, cutoff=0.75)
        if key in PBS_IGNORED_RESOURCES:
            close = []
        if close or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", key):
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _error(
                where, "-l", f"unknown resource {key!r}; {hint}known: {', '.join(KNOWN_RESOURCES)}"
            )
        # PBS's own (place, vmem, ...) and a site's (system=..., filesystems=...)
        why = "not used here" if key in PBS_IGNORED_RESOURCES else "a site resource, not used here"
        _note(notes, where, f"-l {key}={value}", f"accepted, without effect: {why}")
    return result


def _one_resource(key: str, value: str, where: str | None) -> dict[str, Any]:
    """One checked ``-l KEY=VALUE`` as JobSpec kwargs (``ngpus``/``gpus`` → ``gpu``,
    ``ncpus`` → ``cpus``, ``mem`` → ``host_memory_mib``)."""
    flag = f"-l {key}"
    if key in ("ngpus", "gpus"):
        try:
            units.parse_int(value, 1, units.MAX_GPUS)
        except ValueError:
            raise _error(
                where,
                flag,
                f"expected a whole number of GPUs from 1 to {units.MAX_GPUS}, got {value!r}",
            ) from None
        key = "gpu"
    if key == "ncpus":
        try:
            return {"cpus": units.parse_int(value, 1, MAX_CPUS)}
        except ValueError:
            raise _error(
                where, flag, f"expected a whole number of CPUs from 1 to {MAX_CPUS}, got {value!r}"
            ) from None
    if key == "mem":
        try:
            mib = units.parse_memory_mib(_pbs_size(value))
        except ValueError as exc:
            raise _error(where, flag, str(exc)) from None
        if mib <= 0:
            raise _error(where, flag, f"must be more than zero, got {value!r}")
        return {"host_memory_mib": mib}
    _check_resource(key, value, where, flag)
    return {key: value}


#: PBS's size units: ``kb``, ``mb``, ``gb``, ``tb`` are powers of 1024 there.
_PBS_SIZE_RE = re.compile(r"\s*([0-9.]+)\s*([kmgt])b\s*", re.IGNORECASE)


def _pbs_size(value: str) -> str:
    """A PBS size (``mem=32gb``: 32 GiB, as PBS reads it) in the units' own words
    (``32GiB``); anything else as it is."""
    m = _PBS_SIZE_RE.fullmatch(value)
    return f"{m.group(1)}{m.group(2).upper()}iB" if m else value


#: What a PBS ``select`` chunk or a Torque ``nodes`` spec may carry, as ``-l`` keys.
_CHUNK_KEYS = {"ncpus": "ncpus", "ppn": "ncpus", "ngpus": "ngpus", "gpus": "ngpus", "mem": "mem"}


def _parse_chunk(
    key: str, value: str, where: str | None, notes: list[str] | None
) -> dict[str, Any]:
    """``select=1:ncpus=8:ngpus=1:mem=32gb`` (PBS Pro) or ``nodes=1:ppn=8:gpus=1``
    (Torque): one node's worth, as JobSpec kwargs; more than one node is refused."""
    flag = f"-l {key}"
    if "+" in value:
        raise _error(
            where,
            flag,
            f"{units.shown(value, 60)} asks for several kinds of chunk; a job runs on one "
            "node here, so give one chunk (select=1:ngpus=2:...)",
        )
    count, *parts = value.split(":")
    if re.fullmatch(r"[0-9]{1,30}", count):
        if int(count) != 1:
            raise _error(
                where,
                flag,
                f"asks for {int(count)} {'chunks' if key == 'select' else 'nodes'}; a job "
                f"runs on one node here, so ask for 1 ({key}=1:...) with the GPUs it needs",
            )
    elif key == "nodes" and count:
        _note(notes, where, f"-l nodes={count}", "a job runs on the node the scheduler picks")
    else:
        raise _error(where, flag, f"expected {key}=1:KEY=VALUE:..., got {units.shown(value, 60)}")
    result: dict[str, Any] = {}
    for part in parts:
        name, sep, amount = part.partition("=")
        name = name.strip().lower()
        if name in _CHUNK_KEYS and sep:
            result.update(_one_resource(_CHUNK_KEYS[name], amount.strip(), where))
        elif key == "nodes" and not sep:
            _note(notes, where, f"-l nodes=…:{name}", "node features are not matched")
        else:
            _note(notes, where, f"-l {key}=…:{part}", "accepted, without effect here")
    return result


def _note(notes: list[str] | None, where: str | None, what: str, why: str) -> None:
    """One line for the submitter about something accepted without (full) effect."""
    if notes is not None:
        notes.append(f"{where}: {what}: {why}" if where else f"{what}: {why}")


def parse_array(text: str, *, where: str | None = None) -> dict[str, int]:
    """Parse ``-J 1-100:2%4`` into ArraySpec kwargs; a single ``N`` means ``N-N``."""
    try:
        result = parse_array_text(text)
        ArraySpec(**result)
    except ValueError as exc:
        message = str(exc)
        if isinstance(exc, ValidationError):
            message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise _error(where, "-J", message) from None
    return result


def _job_id(text: str, where: str | None) -> int:
    m = _JOB_ID_RE.fullmatch(text.strip())
    if not m or int(m.group(1)) < 1:
        raise _error(
            where,
            "-W",
            f"expected a job id like 12, 12.server or 12[], got {units.shown(text, 60)}",
        )
    if int(m.group(1)) > units.MAX_INT64:
        raise _error(
            where, "-W", f"job ids go up to {units.MAX_INT64}, got {units.shown(text, 60)}"
        )
    return int(m.group(1))


def parse_depend(text: str, *, where: str | None = None) -> list[dict[str, Any]]:
    """Parse ``-W depend=afterok:12:13,afterany:14`` into Dependency kwargs.

    Ids may carry a server suffix (``12.server``) or an array marker (``12[]``);
    both are stripped.  Repeated (kind, id) pairs are kept once.
    """
    attr, sep, value = text.strip().partition("=")
    if not sep or attr.strip() != "depend":
        raise _error(where, "-W", f"only {DEPEND_FORMS} is accepted, got {text!r}")
    result: list[dict[str, Any]] = []
    for item in value.split(","):
        kind, *ids = item.strip().split(":")
        if kind not in DEPENDENCY_KINDS:
            raise _error(
                where,
                "-W",
                f"unknown dependency type {kind!r}; known: {', '.join(DEPENDENCY_KINDS)}",
            )
        if not ids:
            raise _error(where, "-W", f"{kind} needs at least one job id, like {kind}:12")
        for raw in ids:
            dep = {"kind": kind, "job_id": _job_id(raw, where)}
            if dep not in result:
                result.append(dep)
                _check_dependency_count(len(result), where)
    return result


def _check_dependency_count(count: int, where: str | None) -> None:
    if count > MAX_DEPENDENCIES:
        raise _error(where, "-W", f"a job may depend on at most {MAX_DEPENDENCIES} jobs")


def _split_env(text: str) -> list[str]:
    """Split ``A=1,B='x,y'`` on commas outside quotes, dropping the quotes."""
    items, current, quote = [], [], ""
    for char in text:
        if quote:
            if char == quote:
                quote = ""
            else:
                current.append(char)
        elif char in "'\"":
            quote = char
        elif char == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if quote:
        raise ValueError(f"unclosed {quote} quote in {text!r}")
    items.append("".join(current))
    return items


def parse_env(
    text: str, environ: Mapping[str, str] | None = None, *, where: str | None = None
) -> dict[str, str]:
    """Parse ``-v VAR=val,VAR2`` into a dict; a bare ``VAR`` takes its value from ``environ``
    (the submitting environment, ``os.environ`` by default), as in PBS."""
    environ = os.environ if environ is None else environ
    try:
        items = _split_env(text)
    except ValueError as exc:
        raise _error(where, "-v", str(exc)) from None
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not name and not sep:
            continue
        if not _ENV_NAME_RE.fullmatch(name):
            raise _error(
                where,
                "-v",
                f"expected VAR=value or VAR (a variable name), got {units.shown(item.strip(), 60)}",
            )
        if not sep:
            if name not in environ:
                raise _error(where, "-v", f"{name} is not set in the submitting environment")
            value = environ[name]
        _probe({"env": {name: value}}, where, "-v")
        result[name] = value
    return result


def _strip_comment(line: str) -> str:
    """Drop a trailing ``# comment`` (a ``#`` that starts a word, outside quotes)."""
    quote, escaped = "", False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            quote = "" if char == quote else quote
        elif char == "\\":
            escaped = True
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def parse_directives(
    script_text: str, *, source: str = "script", prefixes: tuple[str, ...] = ("#EBB", "#PBS")
) -> list[tuple[int, list[str]]]:
    """Find the directive lines (by default ``#EBB`` and ``#PBS``) at the top of a script,
    as ``(lineno, tokens)``.

    Scanning skips an optional ``#!`` first line, blank lines and plain ``#`` comments,
    and stops at the first line that is none of these (the first command), as PBS and
    Slurm do.
    """
    return [
        (lineno, tokens)
        for lineno, prefix, tokens in directive_lines(script_text, source=source)
        if prefix in prefixes
    ]


def directive_lines(
    script_text: str, *, source: str = "script"
) -> list[tuple[int, str, list[str]]]:
    """Every ``#EBB``, ``#PBS`` and ``#SBATCH`` line at the top of a script, as
    ``(lineno, prefix, tokens)`` (see :func:`parse_directives`)."""
    found: list[tuple[int, str, list[str]]] = []
    # lines end at "\n" only, as for the shell (str.splitlines also splits at form feeds
    # and other separators, which would put errors on the wrong line)
    for lineno, line in enumerate(script_text.split("\n"), start=1):
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        for prefix in DIRECTIVE_PREFIXES:
            rest = stripped[len(prefix) :]
            if stripped.startswith(prefix) and (not rest or rest[0].isspace()):
                try:
                    tokens = shlex.split(_strip_comment(rest))
                except ValueError as exc:
                    raise SpecError(f"{source} line {lineno}", f"cannot split: {exc}") from None
                if tokens:
                    found.append((lineno, prefix, tokens))
                break
    return found


def parse_directive_tokens(tokens: list[str], where: str) -> QsubOptions:
    """Parse one directive line's options (``-N train -l gpu=1``) into :class:`QsubOptions`.

    Values are checked later, by :func:`build_spec_kwargs`, which names ``where``.
    """
    opts = QsubOptions()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option, value = token, None
        if token.startswith("--") and "=" in token:
            option, value = token.split("=", 1)
        elif token[:2] in _DIRECTIVE_OPTIONS and len(token) > 2 and not token.startswith("--"):
            option, value = token[:2], token[2:]
        if token[:2] in PBS_IGNORED and not token.startswith("--"):
            option, value = token[:2], token[2:] or None
            takes, why = PBS_IGNORED[option]
            if takes and value is None:
                if i + 1 >= len(tokens):
                    raise SpecError(where, f"{option} needs a value")
                value = tokens[i + 1]
                i += 1
            i += 1
            shown_value = f" {value}" if takes else ""
            opts.notes.append(f"{where}: {option}{shown_value}: accepted, without effect: {why}")
            continue
        if option not in _DIRECTIVE_OPTIONS:
            if token.startswith("-"):
                raise SpecError(where, f"unknown directive option {option}")
            raise SpecError(where, f"unexpected argument {token!r}; directives hold options only")
        name, takes_value = _DIRECTIVE_OPTIONS[option]
        if not takes_value:
            if value is not None:
                raise SpecError(where, f"{option} takes no value")
            if name == "pause":
                opts.pause = option == "--pause"
            elif name == "export":
                opts.export = "ALL"
            else:
                opts.hold = True
            opts.origin[name] = where
            i += 1
            continue
        if value is None:
            if i + 1 >= len(tokens):
                raise SpecError(where, f"{option} needs a value")
            value = tokens[i + 1]
            i += 1
        i += 1
        if name in _LIST_FIELDS:
            entries = getattr(opts, name)
            opts.origin[f"{name}.{len(entries)}"] = where
            entries.append(value)
        else:
            setattr(opts, name, value)
            opts.origin[name] = where
    return opts


def _accumulate(base: QsubOptions, top: QsubOptions) -> QsubOptions:
    """Combine two option sets from one source: later values win, lists append."""
    merged = QsubOptions(origin=dict(base.origin))
    for f in fields(QsubOptions):
        if f.name == "origin":
            continue
        old, new = getattr(base, f.name), getattr(top, f.name)
        if f.name in _LIST_FIELDS:
            setattr(merged, f.name, old + new)
            for i in range(len(new)):
                if f"{f.name}.{i}" in top.origin:
                    merged.origin[f"{f.name}.{len(old) + i}"] = top.origin[f"{f.name}.{i}"]
        elif new is not None and new is not False:
            setattr(merged, f.name, new)
            if f.name in top.origin:
                merged.origin[f.name] = top.origin[f.name]
        else:
            setattr(merged, f.name, old)
    return merged


def parse_script_directives(
    script_text: str, *, source: str = "script", dialect: str = "pbs"
) -> QsubOptions:
    """All directive lines of a script as one :class:`QsubOptions` (later lines win).

    ``#EBB`` lines always count.  For ``ebb qsub`` (``dialect`` ``pbs``) the ``#PBS``
    lines do; a script with ``#SBATCH`` lines and no ``#PBS`` line is read as Slurm's.
    For ``ebb sbatch`` (``slurm``) the ``#SBATCH`` lines do.  Lines of the other kind are
    left, with a note saying so.
    """
    from ebbtide.queue import slurm

    lines = directive_lines(script_text, source=source)
    kinds = {prefix for _, prefix, _ in lines}
    if dialect == "pbs" and "#SBATCH" in kinds and "#PBS" not in kinds:
        dialect = "slurm"
    read = "#SBATCH" if dialect == "slurm" else "#PBS"
    opts = QsubOptions(compat=dialect)
    unread = [lineno for lineno, prefix, _ in lines if prefix not in ("#EBB", read)]
    if unread:
        other = "#PBS" if read == "#SBATCH" else "#SBATCH"
        opts.notes.append(
            f"{source} line{'s' if len(unread) > 1 else ''} {', '.join(map(str, unread))}: "
            f"{other} lines not read; this is read as a "
            f"{'Slurm' if dialect == 'slurm' else 'PBS'} script "
            f"({'ebb qsub' if other == '#PBS' else 'ebb sbatch'} reads them)"
        )
    for lineno, prefix, tokens in lines:
        where = f"{source} line {lineno}"
        if prefix == "#EBB":
            line_opts = parse_directive_tokens(tokens, where)
        elif prefix != read:
            continue
        elif prefix == "#SBATCH":
            line_opts = slurm.parse_sbatch_tokens(tokens, where)
        else:
            line_opts = parse_directive_tokens(tokens, where)
        opts = _accumulate(opts, line_opts)
    return opts


def load_script(path: str | os.PathLike[str], *, dialect: str = "pbs") -> tuple[str, QsubOptions]:
    """Read a job script (:func:`~ebbtide.scriptfile.read_script`: errors name ``SCRIPT``);
    return its text and its directives, read as ``dialect``'s (see
    :func:`parse_script_directives`)."""
    text = read_script(path)
    return text, parse_script_directives(text, source=os.fspath(path), dialect=dialect)


def _int(name: str, value: str, where: str | None, flag: str) -> int:
    low, high = _INT_RANGES[name]
    try:
        return units.parse_int(value, low, high)
    except ValueError:
        raise _error(
            where,
            flag,
            f"expected a whole number from {low} to {high}, got {units.shown(value, 60)}",
        ) from None


def _pick(cli: QsubOptions, directives: QsubOptions, name: str) -> tuple[Any, str | None]:
    """An option's value and where it came from: the command line's, else the script's."""
    value = getattr(cli, name)
    if value is not None:
        return value, cli.origin.get(name)
    return getattr(directives, name), directives.origin.get(name)


def build_spec_kwargs(
    cli: QsubOptions,
    directives: QsubOptions | None = None,
    environ: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Merge script directives under command-line options and convert to JobSpec kwargs.

    Directives accepted without effect add a line each to ``notes``, for the submitter.

    The command line wins field by field; ``-l`` resources merge key by key (the command
    line winning), and within one source ``--deadline`` wins over ``-l deadline``.
    ``-v`` and ``-W depend`` lists from the command line replace the script's.  Only
    options that were given appear in the result, so JobSpec's defaults apply to the rest.
    """
    directives = directives if directives is not None else QsubOptions()
    notes = [] if notes is None else notes
    notes.extend(directives.notes)
    notes.extend(cli.notes)
    kwargs: dict[str, Any] = {}
    compat = cli.compat or directives.compat or "pbs"

    def pick(name: str) -> tuple[Any, str | None]:
        return _pick(cli, directives, name)

    for name in ("name", "queue", "kind", "signal", "checkpoint_dir", "cwd", "image", "account"):
        value, where = pick(name)
        if value is None:
            continue
        if name == "kind" and value not in JOB_KINDS:
            raise _error(where, "--kind", f"expected one of {', '.join(JOB_KINDS)}, got {value!r}")
        if name == "signal":
            try:
                units.parse_warning_signal(value)
            except ValueError as exc:
                raise _error(where, "--signal", str(exc)) from None
        _probe({name: value}, where, _FLAGS[name])
        kwargs[name] = value
    for name in ("priority", "max_attempts"):
        value, where = pick(name)
        if value is not None:
            kwargs[name] = _int(name, value, where, _FLAGS[name])

    resources: dict[str, str] = {}
    for src in (directives, cli):
        for i, text in enumerate(src.resources):
            where = src.origin.get(f"resources.{i}")
            resources.update(parse_resources(text, where=where, notes=notes))
        if src.deadline is not None:
            where = src.origin.get("deadline")
            _check_resource("deadline", src.deadline, where, "--deadline")
            resources["deadline"] = src.deadline
    kwargs.update(resources)

    value, where = pick("array")
    if value is not None:
        kwargs["array"] = parse_array(value, where=where)

    src = cli if cli.depend else directives
    depends: list[dict[str, Any]] = []
    for i, text in enumerate(src.depend):
        where = src.origin.get(f"depend.{i}")
        attr = text.strip().partition("=")[0].strip()
        if attr in PBS_IGNORED_ATTRIBUTES:
            _note(notes, where, f"-W {text.strip()}", PBS_IGNORED_ATTRIBUTES[attr])
            continue
        for dep in parse_depend(text, where=where):
            if dep not in depends:
                depends.append(dep)
                _check_dependency_count(len(depends), where)
    if depends:
        kwargs["depends"] = depends

    export, where = pick("export")
    if export is None and compat == "slurm":
        export = "ALL"  # Slurm's default: the job starts with the submitter's environment
    env: dict[str, str] = export_env(export, environ, where=where) if export else {}
    src = cli if cli.env else directives
    for i, text in enumerate(src.env):
        env.update(parse_env(text, environ, where=src.origin.get(f"env.{i}")))
    if env:
        kwargs["env"] = env

    if cli.hold or directives.hold:
        kwargs["hold"] = True
    pause = cli.pause if cli.pause is not None else directives.pause
    if pause is not None:
        kwargs["pause"] = pause
    kwargs.update(_outputs(cli, directives, compat, array="array" in kwargs, notes=notes))
    shell_only = (cli if cli.signal is not None else directives).signal_shell_only
    if shell_only:
        kwargs["signal_shell_only"] = True
    if compat != "pbs":
        kwargs["compat"] = compat
    if cli.script is not None:
        kwargs["script"] = _with_shell(cli.script, *pick("shell"), notes)
    if cli.command is not None:
        kwargs["command"] = cli.command
    if cli.args:
        kwargs["args"] = cli.args
    return kwargs


#: Variables of the submitting environment never copied into a job by ``-V`` or
#: ``--export=ALL``, besides the credentials in ``PRIVATE_VARIABLES``: ebbtide's own
#: settings, the scheduler variables the job gets afresh, and the shell's bookkeeping.
_NOT_EXPORTED_PREFIXES = ("EBBTIDE_", "PBS_", "SLURM_")
_NOT_EXPORTED = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})


def export_env(
    text: str, environ: Mapping[str, str] | None = None, *, where: str | None = None
) -> dict[str, str]:
    """``-V`` / ``--export=ALL|NONE|[ALL,]VAR[=value],...`` as the variables to give the
    job: ``ALL`` copies the submitting environment (less ebbtide's settings and
    credentials, ``PBS_*``/``SLURM_*`` and the shell's own); ``NONE`` nothing; named
    variables as ``-v`` takes them."""
    from ebbtide.config.settings import PRIVATE_VARIABLES

    environ = os.environ if environ is None else environ
    first, _, rest = text.partition(",")
    result: dict[str, str] = {}
    if first.strip().upper() == "ALL":
        for name, value in environ.items():
            if (
                _ENV_NAME_RE.fullmatch(name)
                and name not in PRIVATE_VARIABLES
                and name not in _NOT_EXPORTED
                and not name.startswith(_NOT_EXPORTED_PREFIXES)
                and "\0" not in value
            ):
                result[name] = value
    elif first.strip().upper() != "NONE":
        rest = text
    if rest.strip():
        result.update(parse_env(rest, environ, where=where))
    return result


def _outputs(
    cli: QsubOptions, directives: QsubOptions, compat: str, *, array: bool, notes: list[str]
) -> dict[str, str]:
    """Where stdout and stderr go: ``-o``/``-e``/``-j`` (PBS), ``--output``/``--error``
    (Slurm, ``slurm-%j.out`` by default, stderr with stdout unless ``--error``)."""
    stdout, out_where = _pick(cli, directives, "stdout")
    stderr, err_where = _pick(cli, directives, "stderr")
    join, join_where = _pick(cli, directives, "join")
    if compat == "slurm":
        stdout = stdout or ("slurm-%A_%a.out" if array else "slurm-%j.out")
        stderr = stderr or stdout
    else:
        stdout = _pbs_path(stdout, "o", out_where, notes)
        stderr = _pbs_path(stderr, "e", err_where, notes)
        if join is not None:
            join = join.strip().lower()
            if join not in ("oe", "eo", "n"):
                raise _error(
                    join_where, "-j", f"expected oe (stderr into stdout), eo or n, got {join!r}"
                )
            target = stdout if join == "oe" else stderr
            if join != "n" and target is None:
                _note(
                    notes,
                    join_where,
                    f"-j {join}",
                    "with no -o/-e path, stdout and stderr stay with the attempt "
                    "(ebb logs ID, ebb logs ID --stderr)",
                )
            elif join != "n":
                stdout = stderr = target
    result: dict[str, str] = {}
    for field_name, value, where, flag in (
        ("stdout", stdout, out_where, "-o"),
        ("stderr", stderr, err_where, "-e"),
    ):
        if value is not None:
            _probe({field_name: value}, where, flag)
            result[field_name] = value
    return result


def _pbs_path(value: str | None, letter: str, where: str | None, notes: list[str]) -> str | None:
    """A PBS ``-o``/``-e`` path: ``[host:]path``; a directory gets PBS's file name in it
    (``NAME.oID``)."""
    if value is None:
        return None
    host, sep, path = value.partition(":")
    if sep and path and "/" not in host:
        value = path
        _note(notes, where, f"-{letter} {host}:", "written on the node that runs the job")
    if value.endswith("/") or os.path.isdir(os.path.expanduser(value)):
        value = os.path.join(value, f"%x.{letter}%j")
    return value


def _with_shell(script: str, shell: str | None, where: str | None, notes: list[str]) -> str:
    """PBS ``-S SHELL``: the interpreter of a script with no ``#!`` line."""
    if shell is None:
        return script
    if not shell.startswith("/") or any(ch.isspace() for ch in shell):
        raise _error(where, "-S", f"expected an absolute path like /bin/bash, got {shell!r}")
    if script.startswith("#!"):
        first = script.split("\n", 1)[0][2:].strip()
        if first.split()[:1] != [shell]:
            _note(notes, where, f"-S {shell}", f"the script's own #! line ({first}) is used")
        return script
    return f"#!{shell}\n{script}"


# -- the qsub command line, wherever it is turned into a spec ---------------------------

#: ``ebb qsub``'s options (their click names) that hold one string, or None.
QSUB_TEXT_OPTIONS = (
    "name",
    "queue",
    "priority",
    "array",
    "kind",
    "deadline",
    "signal",
    "checkpoint_dir",
    "cwd",
    "max_attempts",
    "image",
    "stdout",
    "stderr",
    "join",
    "account",
    "shell",
    "mail",
    "mail_to",
    "rerun",
)
#: ... a list of strings (a repeated flag).
QSUB_LIST_OPTIONS = ("resources", "depend", "env")
#: ... True or False (``pause``: or None, the queue's default).
QSUB_FLAG_OPTIONS = ("hold", "export_all", "pause")


def _checked_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """``opts`` with each value of the type its option has; a :class:`SpecError` for
    anything else (a thin client's request is not trusted to be well formed)."""
    known = {*QSUB_TEXT_OPTIONS, *QSUB_LIST_OPTIONS, *QSUB_FLAG_OPTIONS}
    for key in opts:
        if key not in known:
            raise SpecError("options", f"{units.shown(key, 40)} is not an option of qsub")
    checked: dict[str, Any] = {}
    for key in QSUB_TEXT_OPTIONS:
        value = opts.get(key)
        if value is not None and not isinstance(value, str):
            raise SpecError("options", f"{key}: expected text, got {type(value).__name__}")
        checked[key] = value
    for key in QSUB_LIST_OPTIONS:
        value = opts.get(key) or []
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise SpecError("options", f"{key}: expected a list of text")
        checked[key] = list(value)
    for key in QSUB_FLAG_OPTIONS:
        value = opts.get(key, None if key == "pause" else False)
        if not (isinstance(value, bool) or (key == "pause" and value is None)):
            raise SpecError("options", f"{key}: expected true or false")
        checked[key] = value
    return checked


def qsub_command_line(opts: Mapping[str, Any]) -> QsubOptions:
    """The command line's :class:`QsubOptions` from ``ebb qsub``'s option values, by their
    click names (``signal`` for ``--signal``, ``export_all`` for ``-V``); ``-m``, ``-M``
    and ``-r`` become notes, as the same directives in a script do."""
    o = _checked_options(opts)
    cli = QsubOptions(
        name=o["name"],
        queue=o["queue"],
        priority=o["priority"],
        resources=o["resources"],
        array=o["array"],
        depend=o["depend"],
        hold=o["hold"],
        pause=o["pause"],
        env=o["env"],
        kind=o["kind"],
        deadline=o["deadline"],
        signal=o["signal"],
        checkpoint_dir=o["checkpoint_dir"],
        cwd=o["cwd"],
        max_attempts=o["max_attempts"],
        image=o["image"],
        stdout=o["stdout"],
        stderr=o["stderr"],
        join=o["join"],
        account=o["account"],
        export="ALL" if o["export_all"] else None,
        shell=o["shell"],
    )
    for flag, key in (("-m", "mail"), ("-M", "mail_to"), ("-r", "rerun")):
        if o[key] is not None:
            why = PBS_IGNORED[flag][1]  # as a directive line would be told
            cli.notes.append(f"{flag} {o[key]}: accepted, without effect: {why}")
    return cli


def qsub_spec(
    opts: Mapping[str, Any],
    args: list[str],
    *,
    script: tuple[str, str] | None,
    environ: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> JobSpec:
    """The job ``ebb qsub`` submits: its options (as :func:`qsub_command_line` takes
    them), then either ``script`` (its name and text) with ``args`` for it, or, with no
    script, ``args`` as the command (``ebb qsub -- CMD ARGS``).  ``environ`` is the
    submitting environment (``-V``, a bare ``-v VAR``); notes for the submitter are
    added to ``notes``.  The same here, in the CLI, and in ``ebb server`` for a thin
    client that sent its command line."""
    cli = qsub_command_line(opts)
    directives = None
    if script is None:
        cli.command = list(args)
    else:
        name, text = script
        if not text.strip():
            raise SpecError("SCRIPT", f"{name!r} is empty")
        directives = parse_script_directives(text, source=name, dialect="pbs")
        cli.script = text
        cli.args = list(args)
    return JobSpec(**build_spec_kwargs(cli, directives, environ=environ, notes=notes))
