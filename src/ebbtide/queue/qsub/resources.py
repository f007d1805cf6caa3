"""The ``-l`` resource grammar: ebbtide's own resources, and what PBS Pro, OpenPBS and
Torque scripts ask for (``ngpus``, ``ncpus``, ``mem``, one ``select`` chunk, ``nodes``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from ebbtide import units
from ebbtide.queue.qsub.options import _error, _note, _probe
from ebbtide.queue.spec import MAX_CPUS, MAX_DEADLINE_S, MIN_DEADLINE_S

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

# Which unit parser validates each ``-l`` resource.
_RESOURCE_PARSERS = {
    "gpu": units.parse_gpu,
    "gpumem": units.parse_memory_mib,
    "walltime": units.parse_duration_s,
    "deadline": units.parse_duration_s,
    "checkpoint_interval": units.parse_duration_s,
}


def check_resource(key: str, value: str, where: str | None, flag: str) -> None:
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
    seen: dict[str, str] = {}
    items = text.split(",")
    if not items[-1].strip():
        items.pop()  # one comma at the end is harmless (gpu=25%,)
    for item in items:
        item = item.strip()
        if not item:
            raise _error(
                where, "-l", f"{units.shown(text, 60)} has an empty item; remove the extra comma"
            )
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep:
            raise _error(where, "-l", f"expected KEY=VALUE, got {item!r}")
        if key in seen:
            raise _error(where, "-l", f"{key} given twice ({seen[key]} and {value})")
        seen[key] = value
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


def replaced(earlier: dict[str, Any], later: dict[str, Any]) -> list[tuple[str, str]]:
    """What a later ``-l`` of the same source (the command line's, or a script's) gives
    again with another value than an earlier one did: (``-l KEY=VALUE``, why) for each,
    to note (a trial's trap: the earlier one was lost, unsaid; the last one counts, as
    PBS takes it)."""
    return [
        (
            f"-l {key}={later[key]}",
            f"replaces the {earlier[key]} an earlier -l gave: the last one counts",
        )
        for key in sorted(earlier.keys() & later.keys())
        if earlier[key] != later[key]
    ]


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
    if key == "gpumem":
        value = _pbs_size(value)  # read as mem= is: -l speaks PBS
    check_resource(key, value, where, flag)
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
