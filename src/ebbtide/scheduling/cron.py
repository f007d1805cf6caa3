"""Standard 5-field cron, evaluated with APScheduler 3's ``CronTrigger``.

Crontab counts days of the week from Sunday (0 and 7 are Sunday); APScheduler counts them
from Monday (0 is Monday), and ``CronTrigger.from_crontab`` passes numbers through
unconverted.  So the day-of-week field is expanded here into day names, which both agree
on.  Where crontab fires when *either* a restricted day-of-month or a restricted
day-of-week matches, APScheduler needs *both*; rather than silently change a schedule's
meaning, restricting both is refused.  So is a schedule that never fires (``0 0 31 2 *``).
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

#: Day names in crontab order: index = crontab number (0 = Sunday).
_CRON_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
#: A schedule that does not fire between these never fires: the span holds seven leap
#: days, one on each day of the week, so every day of the month and month (and "last
#: fri") that ever comes round comes round in it.
_PROBE_START = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_PROBE_END = dt.datetime(2029, 1, 1, tzinfo=dt.UTC)


def _day_number(token: str, expr: str) -> int:
    """A crontab day number 0-7 (7 kept as 7 so ranges like 5-7 compare right)."""
    token = token.strip().lower()
    if token.isdigit():
        n = int(token)
        if not 0 <= n <= 7:
            raise ValueError(f"{expr!r}: day of week {n} is out of 0-7 (0 and 7 are Sunday)")
        return n
    if token[:3] in _CRON_DAYS and len(token) in (3,):
        return _CRON_DAYS.index(token[:3])
    raise ValueError(f"{expr!r}: unknown day of week {token!r} (use 0-7 or sun..sat)")


def _expand_days(field: str, expr: str) -> str:
    """Crontab day-of-week field → comma-separated day names for APScheduler."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        rng, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(f"{expr!r}: bad step {step_text!r} in day of week")
            step = int(step_text)
        if rng == "*":
            lo, hi = 0, 6
        elif "-" in rng:
            a, b = rng.split("-", 1)
            lo, hi = _day_number(a, expr), _day_number(b, expr)
            if hi < lo:
                raise ValueError(f"{expr!r}: day range {rng!r} runs backwards")
        else:
            lo = hi = _day_number(rng, expr)
        days.update(d % 7 for d in range(lo, hi + 1, step))
    # APScheduler accepts names; order them Monday first for readability
    return ",".join(_CRON_DAYS[d] for d in sorted(days, key=lambda d: (d - 1) % 7))


def parse_cron(expr: str, tz: ZoneInfo) -> CronTrigger:
    """A ``CronTrigger`` for a standard crontab expression; ``ValueError`` says what is wrong."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expr!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}"
        )
    minute, hour, dom, month, dow = fields
    if dom not in ("*", "?") and dow not in ("*", "?"):
        raise ValueError(
            f"{expr!r}: restrict either the day of month or the day of week, not both "
            "(crontab would match either; say which you mean with two windows)"
        )
    days = _expand_days(dow.replace("?", "*"), expr)
    spec: dict[str, str | None] = {
        "minute": minute,
        "hour": hour,
        "day": None if dom in ("*", "?") else dom,
        "month": month,
        "day_of_week": days,
    }
    try:
        trigger = CronTrigger(**spec, timezone=tz)
        probe = CronTrigger(**spec, timezone=dt.UTC, start_date=_PROBE_START, end_date=_PROBE_END)
    except ValueError as exc:
        raise ValueError(f"{expr!r}: {exc}") from None
    if probe.get_next_fire_time(None, _PROBE_START) is None:
        raise ValueError(f"{expr!r}: never fires (no month it names has that day)")
    return trigger


def next_fire(trigger: CronTrigger, after: float, tz: ZoneInfo) -> float | None:
    """The first fire time at or after ``after`` (Unix seconds), or None."""
    now = dt.datetime.fromtimestamp(after, tz)
    fire = trigger.get_next_fire_time(None, now)
    return fire.timestamp() if fire is not None else None
