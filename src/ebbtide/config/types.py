"""Field types for config files: numbers, durations and sizes as people write them.

A duration is a number of seconds or a string like ``"30s"``, ``"10m"``, ``"9h"``,
``"02:00:00"``; a size is a number of MiB or a string like ``"40GiB"``.  Where a number
is expected a boolean is an error: YAML 1.1 reads ``yes``, ``no``, ``on`` and ``off``
as booleans, so ``deadline_s: on`` would otherwise mean 1 second.  Every duration and
size is finite and bounded (:data:`~ebbtide.units.MAX_DURATION_S`,
:data:`~ebbtide.units.MAX_MEMORY_MIB`); :func:`between` narrows a duration further.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from ebbtide import units

_BOOLEAN_HINT = "YAML reads yes, no, on, off, true and false as booleans"


def _not_bool(value: Any, expected: str) -> Any:
    if isinstance(value, bool):
        raise ValueError(
            f"expected {expected}, got the boolean {str(value).lower()} ({_BOOLEAN_HINT})"
        )
    return value


def _number(value: Any) -> Any:
    return _not_bool(value, "a number")


def _duration(value: Any) -> Any:
    return units.parse_duration_s(_not_bool(value, units.DURATION_FORMS))


def _size_mib(value: Any) -> Any:
    if isinstance(value, str):
        return units.parse_memory_mib(value)
    return _not_bool(value, units.MEMORY_FORMS)


#: Refuses a boolean where a number belongs.  Put it after the bounds, so the JSON Schema
#: keeps them: ``Annotated[float, Field(ge=0, le=100), NOT_BOOL]``.
NOT_BOOL = BeforeValidator(_number)
#: Seconds; accepts ``"30s"``, ``"10m"``, ``"02:00:00"`` or a number (at most 366 days).
Duration = Annotated[float, BeforeValidator(_duration, json_schema_input_type=str | float)]
#: MiB; accepts ``"40GiB"``, ``"512MiB"`` or a number (MiB), at most 1 TiB.
SizeMiB = Annotated[
    int,
    BeforeValidator(_size_mib, json_schema_input_type=str | int),
    Field(le=units.MAX_MEMORY_MIB),
]


def _format_s(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def between(low_s: float, high_s: float) -> AfterValidator:
    """Narrow a :data:`Duration` to ``low_s`` … ``high_s`` seconds (both included):
    ``Annotated[Duration, between(1, 3600)]``."""

    def check(value: float) -> float:
        if not low_s <= value <= high_s:
            raise ValueError(
                f"must be from {_format_s(low_s)} to {_format_s(high_s)}, got {_format_s(value)}"
            )
        return value

    return AfterValidator(check)
