"""Field types for config files: durations and sizes as people write them.

A duration is a number of seconds or a string like ``"30s"``, ``"10m"``, ``"9h"``,
``"02:00:00"``; a size is a number of MiB or a string like ``"40GiB"``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from ebbtide import units


def _duration(value: Any) -> Any:
    if isinstance(value, str):
        return units.parse_duration_s(value)
    return value


def _size_mib(value: Any) -> Any:
    if isinstance(value, str):
        return units.parse_memory_mib(value)
    return value


#: Seconds; accepts ``"30s"``, ``"10m"``, ``"02:00:00"`` or a number.
Duration = Annotated[float, BeforeValidator(_duration, json_schema_input_type=str | float)]
#: MiB; accepts ``"40GiB"``, ``"512MiB"`` or a number (MiB).
SizeMiB = Annotated[int, BeforeValidator(_size_mib, json_schema_input_type=str | int)]
