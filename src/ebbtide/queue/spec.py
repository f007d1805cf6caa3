"""``JobSpec``: what a user submits, validated.

(Longer than our modules should be: it is one model, ``JobSpec``, with a validator per field
and the bounds each field has, so that every rule a submission must follow is in one place;
the qsub and sbatch dialects that produce it already stand alone.)

A bad spec raises :class:`~ebbtide.errors.SpecError` naming the field and the allowed
values.  Sizes and durations accept the forms people write (``"4GiB"``, ``"30s"``,
``"02:00:00"``, ``"25%"``) and are stored normalised (MiB, seconds, percent).

Every number is bounded (ids to what the store holds, durations, sizes, counts) and every
string is checked for what the OS cannot take: NUL bytes, text that is not UTF-8,
arguments and environments longer than ``exec`` accepts.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ebbtide import units
from ebbtide.errors import SpecError
from ebbtide.scriptfile import MAX_SCRIPT_BYTES
from ebbtide.units import MAX_DURATION_S, MAX_GPUS, MAX_INT64, MAX_MEMORY_MIB, shown

JobKind = Literal["training", "inference", "batch"]
DependencyKind = Literal["afterok", "afternotok", "afterany"]

#: Eviction deadline when neither the job nor its queue says otherwise, in seconds.
DEFAULT_DEADLINE_S = 30.0
#: GPU memory requested when the job does not say, in MiB.
DEFAULT_MEMORY_MIB = 1024
#: Compute share of one GPU requested when the job does not say, in percent.
DEFAULT_COMPUTE_PCT = 10.0
#: Exit code by which a job says "I checkpointed, requeue me" (as in Grid Engine).
REQUEUE_EXIT_CODE = 99
#: Shortest eviction deadline, in seconds: the node agent notices within a 50 ms tick and
#: kills 0.15 s before the deadline, and the job needs the rest to checkpoint.
MIN_DEADLINE_S = 1.0
#: Longest eviction deadline a job may ask for, in seconds: the online side waits this long.
MAX_DEADLINE_S = 3600.0
#: Shortest walltime or checkpoint interval, in seconds: two of the node agent's 50 ms
#: ticks, the finest it can enforce or see.
MIN_JOB_DURATION_S = 0.1
#: Longest single argument or ``NAME=value`` environment entry, in bytes (Linux's
#: ``MAX_ARG_STRLEN``, 128 KiB with its NUL).
MAX_ARG_BYTES = 128 * 1024 - 1
#: Most bytes the command, its arguments and the environment may hold together (half of
#: Linux's usual 2 MiB ``ARG_MAX``; the agent adds its own variables).
MAX_ARGV_ENV_BYTES = 1024 * 1024
#: Longest path (``cwd``, ``checkpoint_dir``), in bytes (Linux's ``PATH_MAX`` less its NUL).
MAX_PATH_BYTES = 4095
#: Highest array index (``-J``): it fits a signed 32-bit integer in any language.
MAX_ARRAY_INDEX = 2**31 - 1
#: Most tasks one array may have.
MAX_ARRAY_TASKS = 100_000
#: Most jobs one job may depend on.
MAX_DEPENDENCIES = 1000
#: Most CPUs a job may record (``ncpus``, ``--cpus-per-task``).
MAX_CPUS = 4096
#: Longest account or submit-host name, in characters.
MAX_LABEL_CHARS = 255
#: Which scheduler's variables a job sees besides ``EBBTIDE_*`` (``PBS_JOBID`` and
#: friends, or ``SLURM_JOB_ID`` and friends).
Compat = Literal["pbs", "slurm"]
#: Longest container image reference, in characters (a registry host, a path, a tag and
#: a digest fit in far less).
MAX_IMAGE_CHARS = 512

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,128}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Dependency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DependencyKind
    job_id: Annotated[int, Field(gt=0, le=MAX_INT64)]
    #: on the whole array ``job_id`` names (PBS's ``12[]``): its tasks' states together
    array: bool = False
    #: on one task of the array ``job_id`` names, by its index (PBS's ``12[3]``): the
    #: store puts the task's own id in its place at submission
    task: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)] | None = None

    @model_validator(mode="after")
    def _array_or_task(self) -> Dependency:
        if self.array and self.task is not None:
            raise ValueError(
                f"name the whole array ({self.job_id}[]) or one of its tasks "
                f"({self.job_id}[{self.task}]), not both"
            )
        return self


#: A dependency's job as ``-W depend=`` and the SDK's text form write it: ``12``, ``12[]``
#: (the whole array), ``12[3]`` (its task of index 3); ASCII digits, at most 30.
DEPEND_ID = r"([0-9]{1,30})(?:\[([0-9]{0,30})\])?"
_DEPEND_ID_RE = re.compile(DEPEND_ID)


def dependency_fields(match: re.Match[str]) -> dict[str, Any]:
    """A matched ``DEPEND_ID`` as :class:`Dependency` fields (without ``kind``)."""
    out: dict[str, Any] = {"job_id": int(match.group(1))}
    index = match.group(2)
    if index == "":
        out["array"] = True
    elif index is not None:
        out["task"] = int(index)
    return out


ARRAY_FORMS = "a range like 1-100, 1-100:2 (step), 1-100%4 (at most 4 at once) or 1-100:2%4"
# Numbers are ASCII digits, at most 30 of them (more is never a sane value).
_ARRAY_RE = re.compile(r"([0-9]{1,30})(?:-([0-9]{1,30}))?(?::([0-9]{1,30}))?(?:%([0-9]{1,30}))?")


def parse_array_text(text: str) -> dict[str, int]:
    """``1-100:2%4`` as :class:`ArraySpec` fields (a single ``N`` means ``N-N``); a
    ``ValueError`` saying what is wrong otherwise."""
    m = _ARRAY_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"expected {ARRAY_FORMS}, got {shown(text, 60)}")
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) is not None else start
    result = {"start": start, "end": end}
    if max(start, end) > MAX_ARRAY_INDEX:
        raise ValueError(f"array indices go up to {MAX_ARRAY_INDEX}, got {text!r}")
    if m.group(3) is not None:
        result["step"] = int(m.group(3))
        if result["step"] < 1:
            raise ValueError(f"the :step must be at least 1, got {text!r}")
        if result["step"] > MAX_ARRAY_INDEX:
            raise ValueError(f"the :step must be at most {MAX_ARRAY_INDEX}, got {text!r}")
    if m.group(4) is not None:
        result["limit"] = int(m.group(4))
        if result["limit"] < 1:
            raise ValueError(f"the %limit (tasks at once) must be at least 1, got {text!r}")
        if result["limit"] > MAX_ARRAY_TASKS:
            raise ValueError(
                f"the %limit (tasks at once) must be at most {MAX_ARRAY_TASKS}, got {text!r}"
            )
    if end < start:
        raise ValueError(f"the range ends ({end}) before it starts ({start}) in {text!r}")
    return result


class ArraySpec(BaseModel):
    """``-J 1-100:2%4``: indices ``start..end`` by ``step``, at most ``limit`` at once.
    The text form (``array="1-100%4"``) is accepted wherever an ArraySpec is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _text_form(cls, data: Any) -> Any:
        return parse_array_text(data) if isinstance(data, str) else data

    start: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)]
    end: Annotated[int, Field(ge=0, le=MAX_ARRAY_INDEX)]
    step: Annotated[int, Field(ge=1, le=MAX_ARRAY_INDEX)] = 1
    limit: Annotated[int, Field(ge=1, le=MAX_ARRAY_TASKS)] | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ArraySpec:
        if self.end < self.start:
            raise ValueError(f"array end {self.end} is before its start {self.start}")
        if len(self.indices()) > MAX_ARRAY_TASKS:
            raise ValueError(f"an array may have at most {MAX_ARRAY_TASKS} tasks")
        return self

    def indices(self) -> range:
        return range(self.start, self.end + 1, self.step)


class JobSpec(BaseModel):
    """A job as submitted.

    Give either ``command`` (an argv list) or ``script`` (the text of a script, run with
    its ``#!`` interpreter or ``/bin/sh``; ``args`` are passed to it).

    The slice request is ``gpu`` — a share of one GPU (``"25%"``, ``0.25``) or a whole
    number of GPUs (``1``, ``2``) — and ``gpumem``, GPU memory per device (``"4GiB"``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str | None = None
    command: list[str] | None = None
    script: str | None = None
    #: the script's file as given to ``qsub``/``sbatch`` (recorded and shown: the text in
    #: ``script`` is what runs)
    script_path: str | None = None
    args: list[str] = Field(default_factory=list)
    kind: JobKind = "batch"
    #: compute share per device, in percent of one GPU's SMs (100 for whole GPUs), to
    #: two decimals
    compute_pct: Annotated[float, Field(ge=units.GPU_SHARE_STEP_PCT, le=100)] = DEFAULT_COMPUTE_PCT
    #: number of whole GPUs; 0 means a fractional slice of one GPU
    gpus: Annotated[int, Field(ge=0, le=MAX_GPUS)] = 0
    #: GPU memory per device, in MiB
    memory_mib: Annotated[int, Field(gt=0, le=MAX_MEMORY_MIB)] = DEFAULT_MEMORY_MIB
    queue: str = "default"
    priority: Annotated[int, Field(ge=-1024, le=1023)] = 0
    #: wall-clock limit of one attempt, in seconds
    walltime_s: Annotated[float, Field(ge=MIN_JOB_DURATION_S, le=MAX_DURATION_S)] | None = None
    #: eviction deadline (decision → slice free), in seconds; None: the queue's default
    deadline_s: Annotated[float, Field(ge=MIN_DEADLINE_S, le=MAX_DEADLINE_S)] | None = None
    #: the warning signal sent at eviction (a number; names are accepted on input)
    signal: int = int(signal.SIGTERM)
    #: how often the job checkpoints, in seconds, if it says (used by admission)
    checkpoint_interval_s: (
        Annotated[float, Field(ge=MIN_JOB_DURATION_S, le=MAX_DURATION_S)] | None
    ) = None
    #: where the job keeps its checkpoints (None: its own directory under the agent's
    #: home); the fields of an output path (``%j``, ``%A``, ``%a``, ...) are filled in
    checkpoint_dir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    #: attempts that may fail before the job fails; evictions do not count
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 1
    #: an online compute spike may pause it (frozen in place, keeping its GPU memory)
    #: rather than evict it; False for jobs that cannot stop (collectives with timeouts);
    #: None: its queue's default (``pause`` in the policy, default yes)
    pause: bool | None = None
    depends: Annotated[list[Dependency], Field(max_length=MAX_DEPENDENCIES)] = Field(
        default_factory=list
    )
    array: ArraySpec | None = None
    hold: bool = False
    #: the container image the job runs in under the Kubernetes executor
    #: (``registry.example.com/team/train:1.4``); None: the queue's or the policy's
    image: str | None = None
    #: the account (project) the job is charged to (``-A``, ``--account``): recorded and
    #: shown, not enforced
    account: str | None = None
    #: CPUs and host memory the job asked for (``ncpus``, ``mem``, ``--cpus-per-task``,
    #: ``--mem``): recorded and shown; not enforced by the process executor
    cpus: Annotated[int, Field(ge=1, le=MAX_CPUS)] | None = None
    host_memory_mib: Annotated[int, Field(gt=0, le=MAX_MEMORY_MIB)] | None = None
    #: where the job's standard output and error go, as a path (relative to ``cwd``) that
    #: may hold ``%j`` (job id), ``%A`` (array id), ``%a`` (array index), ``%x`` (name),
    #: ``%u`` (user), ``%N`` (node) and ``%%``; the same path for both joins them.  None:
    #: the attempt's own log (``ebb logs``).  The first attempt starts the file afresh;
    #: later attempts append to it
    stdout: str | None = None
    stderr: str | None = None
    #: PBS's ``-j``: ``oe`` sends stderr where stdout goes, ``eo`` stdout where stderr
    #: goes (to the path given, else to the attempt's own log: ``ebb logs ID`` and ``ebb
    #: logs ID -e`` show the one stream); None: each to its own
    join: Literal["oe", "eo"] | None = None
    #: the warning signal goes to the script's shell alone (Slurm's ``--signal=B:``), which
    #: passes it on with a ``trap``; False: to every process of the job
    signal_shell_only: bool = False
    #: which scheduler's variables the job sees besides ``EBBTIDE_*``
    compat: Compat = "pbs"
    #: the host it was submitted from (``PBS_O_HOST``, ``SLURM_SUBMIT_HOST``)
    submit_host: str | None = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise spec_error(exc, data) from None

    @model_validator(mode="before")
    @classmethod
    def _convenience_forms(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "gpu" in data:
            try:
                pct, whole = units.parse_gpu(data.pop("gpu"))
            except ValueError as exc:
                raise ValueError(f"gpu: {exc}") from None
            _check_same(data, "gpu", {"compute_pct": pct, "gpus": whole})
            data["compute_pct"], data["gpus"] = pct, whole
        for key, parse, target in (
            ("gpumem", units.parse_memory_mib, "memory_mib"),
            ("walltime", units.parse_duration_s, "walltime_s"),
            ("deadline", units.parse_duration_s, "deadline_s"),
            ("checkpoint_interval", units.parse_duration_s, "checkpoint_interval_s"),
        ):
            if key in data:
                raw = data.pop(key)
                if raw is None:
                    continue
                try:
                    value = parse(raw)
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None
                _check_same(data, key, {target: value})
                data[target] = value
        return data

    @field_validator("signal", mode="before")
    @classmethod
    def _signal(cls, value: Any) -> int:
        return units.parse_warning_signal(value)

    @field_validator("compute_pct")
    @classmethod
    def _compute_pct(cls, value: float) -> float:
        if abs(round(value, 2) - value) > 1e-9:
            raise ValueError(
                f"a share is given to {units.GPU_SHARE_STEP_PCT:g}% (two decimals of a "
                f"percent), got {value!r}"
            )
        return round(value, 2)

    @field_validator("depends", mode="before")
    @classmethod
    def _depends_as_text(cls, value: Any) -> Any:
        """``"afterok:12"`` or ``"afterok:12:13"`` (qsub's ``-W depend=`` form) as the
        dependencies it names; the dicts and :class:`Dependency` values as they are."""
        if not isinstance(value, list):
            return value
        out: list[Any] = []
        for item in value:
            if not isinstance(item, str):
                out.append(item)
                continue
            kind, _, ids = item.partition(":")
            named = [_DEPEND_ID_RE.fullmatch(i.strip()) for i in ids.split(":")]
            if not ids or not all(named):
                raise ValueError(
                    f"expected KIND:ID[:ID] like 'afterok:12' (12[]: the whole array 12, "
                    f"12[3]: its task 3) or {{'kind': 'afterok', 'job_id': 12}}, got "
                    f"{shown(item, 60)}"
                )
            out.extend({"kind": kind.strip(), **dependency_fields(m)} for m in named if m)
        return out

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.fullmatch(value):
            raise ValueError("use 1-128 letters, digits, '_', '-', '.' (no spaces)")
        return value

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", value):
            raise ValueError("use 1-64 letters, digits, '_' or '-'")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("must be a non-empty argv list, like ['python', 'train.py']")
        for i, arg in enumerate(value or []):
            _check_os_text(arg, MAX_ARG_BYTES, f"argument {i}")
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for i, arg in enumerate(value):
            _check_os_text(arg, MAX_ARG_BYTES, f"argument {i}")
        return value

    @field_validator("script")
    @classmethod
    def _script(cls, value: str | None) -> str | None:
        if value is not None:
            if not value.strip():
                raise ValueError("must not be empty")
            _check_os_text(value, MAX_SCRIPT_BYTES, "the script")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ENV_NAME_RE.fullmatch(key):
                raise ValueError(
                    f"{shown(key)} is not a variable name (letters, digits and '_', not "
                    "starting with a digit)"
                )
            _check_os_text(item, MAX_ARG_BYTES - len(key) - 1, f"the value of {key}")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return None if value is None else check_image(value)

    @field_validator("cwd", "checkpoint_dir", "stdout", "stderr", "script_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None:
            if not value:
                raise ValueError("must not be empty (leave it unset instead)")
            _check_os_text(value, MAX_PATH_BYTES, "the path")
        return value

    @field_validator("account", "submit_host")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(
            rf"[A-Za-z0-9_.@+\-]{{1,{MAX_LABEL_CHARS}}}", value
        ):
            raise ValueError(
                f"use 1-{MAX_LABEL_CHARS} letters, digits, '_', '-', '.', '@' or '+', got "
                f"{shown(value, 60)}"
            )
        return value

    @model_validator(mode="after")
    def _one_of_command_script(self) -> JobSpec:
        if (self.command is None) == (self.script is None):
            raise ValueError(
                "command: give exactly one of command (an argv list) or script (its text)"
            )
        if self.gpus >= 1 and self.compute_pct != 100:
            if "compute_pct" not in self.model_fields_set:  # (gpus=2, blamed on compute_pct)
                raise ValueError(
                    f"gpus: ask for whole GPUs with gpu={self.gpus} (it sets gpus, and "
                    "compute_pct to 100); gpu='25%' is a share of one"
                )
            raise ValueError("compute_pct: whole GPUs take all their compute; leave it at 100")
        argv = [*(self.command or []), *self.args, *(f"{k}={v}" for k, v in self.env.items())]
        size = sum(len(a.encode()) + 1 for a in argv)
        if size > MAX_ARGV_ENV_BYTES:
            raise ValueError(
                f"command: the command, args and env hold {size} bytes together; at most "
                f"{MAX_ARGV_ENV_BYTES} (1 MiB) fit in what the OS passes to a program"
            )
        return self

    @classmethod
    def from_script(
        cls, path: str | os.PathLike[str], *args: str, notes: list[str] | None = None
    ) -> JobSpec:
        """The job ``ebb qsub PATH ARGS...`` submits, read as it reads it: the script's
        text, run with ``args``, and its ``#PBS`` and ``#EBB`` directive lines (``#SBATCH``
        ones in a script with no ``#PBS`` line); ``spec=JobSpec(script=text)`` runs the
        text and reads none of its lines.  Submit it with fields on top to override
        them, as the command line overrides a script's (``client.submit(spec,
        queue="night")``).  What qsub would note (a directive without effect here) is
        added to ``notes``.  Raises :class:`SpecError` naming the file and line."""
        from ebbtide.queue.qsub import script_spec

        return script_spec(path, args, notes=notes)

    def display_name(self) -> str:
        if self.name:
            return self.name
        if self.command:
            return re.sub(r"[^A-Za-z0-9_.\-]", "_", self.command[0].rsplit("/", 1)[-1])[:64]
        return "script"


class SliceRequest(Protocol):
    """Anything that asks for a slice: a :class:`JobSpec`, a
    :class:`ebbtide.kube.profiles.Slice`."""

    @property
    def compute_pct(self) -> float: ...
    @property
    def gpus(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...


class SliceGrant(SliceRequest, Protocol):
    """What the node really grants for a job's slice request, in the request's units
    (:class:`ebbtide.kube.profiles.Grant` is one): the store keeps it as the job's slice,
    which the planner packs, while the spec keeps what was asked."""

    @property
    def profile(self) -> str: ...
    @property
    def note(self) -> str: ...


def check_image(value: str) -> str:
    """A container image reference as Kubernetes takes it: not empty, no whitespace, at
    most :data:`MAX_IMAGE_CHARS` characters.  Raises ``ValueError`` saying which."""
    if not value:
        raise ValueError("must not be empty (leave it unset instead)")
    if len(value) > MAX_IMAGE_CHARS:
        raise ValueError(
            f"is {len(value)} characters long; an image reference has at most {MAX_IMAGE_CHARS}"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError(
            f"{shown(value, 60)} holds whitespace or a control character; an image "
            "reference is one word, like registry.example.com/team/train:1.4"
        )
    return value


def _check_same(data: dict[str, Any], key: str, sets: dict[str, Any]) -> None:
    """A ``ValueError`` naming both fields if ``data`` also gives a field that ``key``
    sets (``gpu`` and ``compute_pct``), with another value: neither silently wins."""
    for field, value in sets.items():
        if field not in data:
            continue
        given = data[field]
        try:
            same = not isinstance(given, bool) and float(given) == float(value)
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(
                f"{key}: sets {field} to {value:g}, but {field}={shown(given)} is given "
                f"too; give {key} or {field}, not both"
            )


def _check_os_text(text: str, max_bytes: int, what: str) -> None:
    """What the OS takes: UTF-8 text with no NUL byte, at most ``max_bytes`` long."""
    if "\0" in text:
        raise ValueError(f"{what} holds a NUL byte, which no program can be passed")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid UTF-8 text") from None
    if size > max_bytes:
        raise ValueError(f"{what} is {size} bytes long; at most {max_bytes} are allowed")


#: The field each convenience input becomes, and how its bounds read.
_CONVENIENCE_OF = {
    "deadline_s": "deadline",
    "walltime_s": "walltime",
    "checkpoint_interval_s": "checkpoint_interval",
    "memory_mib": "gpumem",
}
_BOUNDS = {
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
}


def _bound_message(loc: str, err: Any, data: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """A bound broken, in the caller's words (a trial's trap: ``deadline="2h"`` was told
    ``deadline_s: Input should be less than or equal to 3600``): the input it was given
    as (``deadline``), the bound in its unit, and what was given."""
    kind = _BOUNDS.get(err["type"])
    if kind is None or not isinstance(err.get("ctx"), dict) or kind[0] not in err["ctx"]:
        return None
    bound = err["ctx"][kind[0]]
    name = _CONVENIENCE_OF.get(loc, loc)
    given = data.get(name) if data is not None and name != loc else None
    if given is None:
        name, given = loc, err.get("input")
    if loc == "memory_mib" and isinstance(bound, int | float):
        limit = f"{bound:g} MiB ({units.format_mib(bound)})"
    elif loc.endswith("_s") and isinstance(bound, int | float):
        limit = f"{bound:g}s"
    else:
        limit = f"{bound}"
    return name, f"must be {kind[1]} {limit}, got {units.shown(given)}"


def spec_error(exc: ValidationError, data: Mapping[str, Any] | None = None) -> SpecError:
    """Turn pydantic's error list into one :class:`SpecError` naming each field (a bound
    broken: as the input was given, ``data``)."""
    messages = []
    first_field = ""
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = err["msg"].removeprefix("Value error, ")
        if (said := _bound_message(loc, err, data)) is not None:
            loc, msg = said
        if err["type"] == "extra_forbidden":
            msg = _unknown_field_message(loc)
        elif loc == "gpus" and err["type"].startswith("int_"):  # gpus="25%": meant gpu=
            msg += f"; gpu= takes {units.GPU_FORMS}"
        if ": " in msg and loc == "spec":
            loc, msg = msg.split(": ", 1)
        first_field = first_field or loc
        messages.append(f"{loc}: {msg}")
    error = SpecError(first_field, "; ".join(m.split(": ", 1)[1] for m in messages[:1]))
    error.args = ("; ".join(messages),)
    return error


#: Inputs accepted besides the fields themselves (converted by ``_convenience_forms``).
CONVENIENCE_INPUTS = ("gpu", "gpumem", "walltime", "deadline", "checkpoint_interval")


def _unknown_field_message(name: str) -> str:
    known = sorted({*JobSpec.model_fields, *CONVENIENCE_INPUTS})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field; {hint}known fields: {', '.join(known)}"
