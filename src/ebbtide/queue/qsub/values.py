"""The values of qsub's other options: ``-J`` arrays, ``-W depend=``, ``-v`` and ``-V``
variables, and whole numbers (``-p``, ``--max-attempts``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ebbtide import units
from ebbtide.queue.qsub.options import _error, _probe
from ebbtide.queue.spec import (
    DEPEND_ID,
    MAX_ARRAY_INDEX,
    MAX_DEPENDENCIES,
    ArraySpec,
    dependency_fields,
    parse_array_text,
)

DEPENDENCY_KINDS = ("afterok", "afternotok", "afterany")
#: Integer options: field → (lowest, highest) allowed, as JobSpec allows.
_INT_RANGES = {"priority": (-1024, 1023), "max_attempts": (1, 100)}

DEPEND_FORMS = "depend=TYPE:ID[:ID...][,TYPE:ID...] with TYPE one of afterok, afternotok, afterany"

# Numbers are ASCII digits, at most 30 of them (more is never a sane value).
_JOB_ID_RE = re.compile(DEPEND_ID + r"(?:\.[A-Za-z0-9_.\-]+)?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _job_id(text: str, where: str | None) -> dict[str, Any]:
    """The job a dependency names, as :class:`~ebbtide.queue.spec.Dependency` fields:
    ``job_id``, and ``array`` for a whole array (``12[]``) or ``task`` for one of its
    tasks (``12[3]``)."""
    m = _JOB_ID_RE.fullmatch(text.strip())
    if not m or int(m.group(1)) < 1:
        raise _error(
            where,
            "-W",
            f"expected a job id like 12, 12.server, 12[] (the whole array) or 12[3] (its "
            f"task 3), got {units.shown(text, 60)}",
        )
    fields = dependency_fields(m)
    if fields["job_id"] > units.MAX_INT64:
        raise _error(
            where, "-W", f"job ids go up to {units.MAX_INT64}, got {units.shown(text, 60)}"
        )
    if fields.get("task", 0) > MAX_ARRAY_INDEX:
        raise _error(
            where, "-W", f"array indices go up to {MAX_ARRAY_INDEX}, got {units.shown(text, 60)}"
        )
    return fields


def parse_depend(text: str, *, where: str | None = None) -> list[dict[str, Any]]:
    """Parse ``-W depend=afterok:12:13,afterany:14`` into Dependency kwargs.

    Ids may carry a server suffix (``12.server``, stripped) or an array's brackets
    (``12[]``: the whole array 12, ``array: True``; ``12[3]``: its task of index 3,
    ``task: 3``).  Repeated dependencies are kept once.
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
            dep: dict[str, Any] = {"kind": kind, **_job_id(raw, where)}
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
