"""Window definitions in the policy file: when offline work may run.

- ``cron``: opens on a standard 5-field cron schedule (in an IANA timezone) for a
  ``duration`` or ``until`` a local time; ``except`` lists dates (holidays) it skips.
- ``lull``: opens on a device when its online compute and memory stay below ``below`` for
  ``for``; closes when either rises above ``close_above`` (hysteresis).
- ``blackout``: a cron window during which no offline work runs at all; it always wins.

Offline work may run on a device when any window that admits its queue is open there
(union), unless a blackout is open.  A policy with no windows admits everything always.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ConfigDict, Field, field_validator, model_validator

from ebbtide.config.base import Strict
from ebbtide.config.types import NOT_BOOL, Duration, SizeMiB, between

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$"
_HHMM = re.compile(r"([01]?[0-9]|2[0-3]):([0-5][0-9])")
#: Longest a window may stay open, in seconds (31 days).
MAX_WINDOW_S = 31 * 86400.0
#: Longest quiet a lull window may wait for, in seconds (a day).
MAX_LULL_FOR_S = 86400.0


class _Window(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Annotated[str, Field(pattern=_NAME)]
    #: device pool (from ``devices.pools``) the window applies to; all devices if unset
    pool: str | None = None


class _Scheduled(_Window):
    #: standard 5-field cron: minute hour day-of-month month day-of-week (0 and 7 = Sunday)
    schedule: str
    #: how long each opening lasts (elapsed time, so DST shifts the local close)
    duration: Duration | None = None
    #: or: the local time (HH:MM) at which each opening closes
    until: str | None = None
    timezone: str = "UTC"
    #: dates (in the window's timezone) on which it does not open
    except_: Annotated[list[dt.date], Field(alias="except")] = Field(default_factory=list)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        # APScheduler (and asyncio, which it imports) only for a policy that has a cron
        from ebbtide.scheduling.cron import parse_cron

        parse_cron(value, ZoneInfo("UTC"))  # raises ValueError with the reason
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"unknown timezone {value[:64]!r}; use an IANA name like Europe/Berlin or UTC"
            ) from None
        return value

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: float | None) -> float | None:
        if value is not None and not 1 <= value <= MAX_WINDOW_S:
            raise ValueError("must be at least 1s and at most 31 days")
        return value

    @field_validator("until", mode="before")
    @classmethod
    def _until_number(cls, value: object) -> object:
        # YAML 1.1 reads an unquoted 7:30 as 450 (base 60), and 7.30 as a float
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 24 * 60:
            shown = f"{value // 60}:{value % 60:02d}"
            raise ValueError(
                f"expected a local time HH:MM, got the number {value}: YAML reads an "
                f'unquoted {shown} as a number; write it quoted: "{shown}"'
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(
                f"expected a local time HH:MM, got the number {value}; write it quoted, "
                'like "07:30"'
            )
        return value

    @field_validator("until")
    @classmethod
    def _until(cls, value: str | None) -> str | None:
        if value is not None and not _HHMM.fullmatch(value):
            raise ValueError(f"expected a local time HH:MM, got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_end(self) -> _Scheduled:
        if (self.duration is None) == (self.until is None):
            raise ValueError("give exactly one of duration (like 9h) or until (like 07:00)")
        return self

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def until_time(self) -> dt.time | None:
        if self.until is None:
            return None
        m = _HHMM.fullmatch(self.until)
        assert m is not None
        return dt.time(int(m.group(1)), int(m.group(2)))


class CronWindow(_Scheduled):
    kind: Literal["cron"]
    #: queues the window admits; every queue if unset
    queues: list[str] | None = None
    #: fraction of each device's capacity offline work may hold while it is open
    max_offline_share: Annotated[float, Field(gt=0, le=1), NOT_BOOL] = 1.0


class BlackoutWindow(_Scheduled):
    kind: Literal["blackout"]


class Thresholds(Strict):
    #: online compute, in percent of the device
    compute_pct: Annotated[float, Field(ge=0, le=100), NOT_BOOL]
    #: online memory, in MiB (``"40GiB"`` accepted)
    memory: Annotated[SizeMiB, Field(ge=0)]


class LullWindow(_Window):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["lull"]
    #: the window opens when online usage stays below both of these ...
    below: Thresholds
    #: ... for this long (the agent samples every 50 ms: at least a second)
    for_: Annotated[Duration, between(1, MAX_LULL_FOR_S), Field(alias="for")]
    #: and closes when online usage rises above either of these
    close_above: Thresholds
    queues: list[str] | None = None
    max_offline_share: Annotated[float, Field(gt=0, le=1), NOT_BOOL] = 1.0

    @model_validator(mode="after")
    def _hysteresis(self) -> LullWindow:
        if (
            self.close_above.compute_pct < self.below.compute_pct
            or self.close_above.memory < self.below.memory
        ):
            raise ValueError("close_above must be at or above below (hysteresis), field by field")
        return self


Window = Annotated[CronWindow | LullWindow | BlackoutWindow, Field(discriminator="kind")]
