"""Standard 5-field cron on APScheduler: weekday names and numbers, Sunday as 0 and 7,
steps and ranges, refusals that name the problem, and fire times on real calendar dates.

Calendar anchors: 2026-11-23 is a Monday, 2026-11-29 a Sunday, 2026-03-29 and
2026-10-25 are Europe/Berlin's daylight-saving changes.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from ebbtide.scheduling.cron import next_fire, parse_cron

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def fires(expr: str, after: str, n: int, tz: ZoneInfo = UTC) -> list[dt.datetime]:
    """The first ``n`` fire times at or after ``after`` (local ISO time in ``tz``)."""
    trigger = parse_cron(expr, tz)
    t = dt.datetime.fromisoformat(after).replace(tzinfo=tz).timestamp()
    out = []
    for _ in range(n):
        fire = next_fire(trigger, t, tz)
        assert fire is not None
        out.append(dt.datetime.fromtimestamp(fire, tz))
        t = fire + 1
    return out


def local(times: list[dt.datetime]) -> list[str]:
    return [t.strftime("%Y-%m-%d %H:%M %a") for t in times]


def test_calendar_anchors() -> None:
    assert dt.date(2026, 11, 23).strftime("%a") == "Mon"
    assert dt.date(2026, 11, 29).strftime("%a") == "Sun"


# -- names and numbers agree ---------------------------------------------------------------

SPELLINGS = [
    pytest.param(["1-5", "mon-fri", "MON-FRI", "Mon-Fri", "1,2,3,4,5", "mon,tue,wed,thu,fri"],
                 id="weekdays"),
    pytest.param(["0", "7", "sun", "SUN", "0,7"], id="sunday-0-and-7"),
    pytest.param(["6,0", "6,7", "sat,sun", "6-7", "sat-7"], id="weekend"),
    pytest.param(["5-7", "fri-7", "5,6,0", "fri,sat,sun"], id="fri-sun"),
    pytest.param(["*/2", "0-6/2", "0,2,4,6", "sun,tue,thu,sat"], id="every-other-day"),
    pytest.param(["1-5/2", "mon-fri/2", "1,3,5", "mon,wed,fri"], id="step-in-range"),
    pytest.param(["*", "?", "0-6", "0-7", "sun-sat", "1-7"], id="every-day"),
    pytest.param(["3", "wed", "3-3", "wed-wed"], id="one-day"),
]  # fmt: skip


@pytest.mark.parametrize("spellings", SPELLINGS)
def test_day_of_week_spellings_agree(spellings: list[str]) -> None:
    expected = fires(f"0 22 * * {spellings[0]}", "2026-11-23T00:00", 15)
    for dow in spellings[1:]:
        assert fires(f"0 22 * * {dow}", "2026-11-23T00:00", 15) == expected, dow


# -- fire times on known dates -----------------------------------------------------------

FIRES = [
    # Sunday, as 0, as 7 and by name: 2026-11-29 and 2026-12-06 are Sundays
    ("0 22 * * 0", "2026-11-23T00:00",
     ["2026-11-29 22:00 Sun", "2026-12-06 22:00 Sun"]),
    ("0 22 * * 7", "2026-11-23T00:00",
     ["2026-11-29 22:00 Sun", "2026-12-06 22:00 Sun"]),
    ("0 22 * * sun", "2026-11-23T00:00",
     ["2026-11-29 22:00 Sun", "2026-12-06 22:00 Sun"]),
    # 1 is Monday (APScheduler's own numbering would make it Tuesday)
    ("0 22 * * 1", "2026-11-24T00:00",
     ["2026-11-30 22:00 Mon", "2026-12-07 22:00 Mon"]),
    # weekdays, over a weekend: Friday evening, then Monday
    ("0 22 * * 1-5", "2026-11-27T12:00",
     ["2026-11-27 22:00 Fri", "2026-11-30 22:00 Mon", "2026-12-01 22:00 Tue"]),
    ("0 22 * * mon-fri", "2026-11-27T12:00",
     ["2026-11-27 22:00 Fri", "2026-11-30 22:00 Mon", "2026-12-01 22:00 Tue"]),
    # 5-7: Friday to Sunday
    ("0 0 * * 5-7", "2026-11-23T00:00",
     ["2026-11-27 00:00 Fri", "2026-11-28 00:00 Sat", "2026-11-29 00:00 Sun",
      "2026-12-04 00:00 Fri"]),
    # */2 in the day of week: Sunday, Tuesday, Thursday, Saturday
    ("0 12 * * */2", "2026-11-23T00:00",
     ["2026-11-24 12:00 Tue", "2026-11-26 12:00 Thu", "2026-11-28 12:00 Sat",
      "2026-11-29 12:00 Sun", "2026-12-01 12:00 Tue"]),
    # steps over ranges in the other fields
    ("*/20 9-17/4 * * *", "2026-11-23T00:00",
     ["2026-11-23 09:00 Mon", "2026-11-23 09:20 Mon", "2026-11-23 09:40 Mon",
      "2026-11-23 13:00 Mon", "2026-11-23 13:20 Mon", "2026-11-23 13:40 Mon",
      "2026-11-23 17:00 Mon"]),
    ("15 8 1-10/3 * *", "2026-11-23T00:00",
     ["2026-12-01 08:15 Tue", "2026-12-04 08:15 Fri", "2026-12-07 08:15 Mon",
      "2026-12-10 08:15 Thu", "2027-01-01 08:15 Fri"]),
    ("0 0 1 */3 *", "2026-11-23T00:00",
     ["2027-01-01 00:00 Fri", "2027-04-01 00:00 Thu", "2027-07-01 00:00 Thu"]),
    # month names and a leap day
    ("0 6 29 feb *", "2026-11-23T00:00", ["2028-02-29 06:00 Tue"]),
    ("30 23 24 dec *", "2026-11-23T00:00",
     ["2026-12-24 23:30 Thu", "2027-12-24 23:30 Fri"]),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "after", "expected"), FIRES)
def test_fire_times_on_the_calendar(expr: str, after: str, expected: list[str]) -> None:
    assert local(fires(expr, after, len(expected))) == expected


def test_local_wall_time_is_kept_across_dst() -> None:
    got = fires("0 22 * * sat,sun", "2026-03-27T00:00", 4, BERLIN)
    assert local(got) == [
        "2026-03-28 22:00 Sat",
        "2026-03-29 22:00 Sun",
        "2026-04-04 22:00 Sat",
        "2026-04-05 22:00 Sun",
    ]
    # the clocks went forward in between: one hour less from UTC
    assert [t.utcoffset() for t in got[:2]] == [dt.timedelta(hours=1), dt.timedelta(hours=2)]
    got = fires("0 22 * * 6-7", "2026-10-24T00:00", 2, BERLIN)
    assert [t.utcoffset() for t in got] == [dt.timedelta(hours=2), dt.timedelta(hours=1)]
    assert got[1].timestamp() - got[0].timestamp() == 25 * 3600


def test_timezone_is_the_triggers() -> None:
    utc = fires("0 22 * * *", "2026-11-23T00:00", 1, UTC)[0]
    berlin = fires("0 22 * * *", "2026-11-23T00:00", 1, BERLIN)[0]
    assert utc.timestamp() - berlin.timestamp() == 3600


def test_next_fire_is_at_or_after() -> None:
    trigger = parse_cron("0 22 * * *", UTC)
    at = dt.datetime(2026, 11, 29, 22, tzinfo=UTC).timestamp()
    assert next_fire(trigger, at, UTC) == at
    assert next_fire(trigger, at + 0.5, UTC) == at + 86400
    assert next_fire(trigger, at - 0.5, UTC) == at


# -- refusals ----------------------------------------------------------------------------

BAD = [
    # wrong field count
    ("0 22 * *", ["expected 5 fields", "got 4"]),
    ("0 0 22 * * *", ["expected 5 fields", "got 6"]),
    ("", ["expected 5 fields", "got 0"]),
    ("@daily", ["expected 5 fields", "got 1"]),
    # out of range
    ("60 22 * * *", ["60", "59"]),
    ("0 24 * * *", ["24", "23"]),
    ("0 22 32 * *", ["32", "31"]),
    ("0 22 0 * *", ["0"]),
    ("0 22 * 13 *", ["13", "12"]),
    ("0 22 * * 8", ["day of week 8", "0-7", "Sunday"]),
    ("0 22 * * 1-8", ["day of week 8", "0-7"]),
    # unknown day name
    ("0 22 * * funday", ["unknown day of week", "'funday'", "sun..sat"]),
    ("0 22 * * monday", ["unknown day of week", "'monday'"]),
    ("0 22 * * mon-fry", ["unknown day of week", "'fry'"]),
    # backwards ranges
    ("0 22 * * 5-1", ["'5-1'", "backwards"]),
    ("0 22 * * fri-mon", ["'fri-mon'", "backwards"]),
    # day of month and day of week both restricted
    ("0 0 1 * mon", ["day of month", "day of week", "not both"]),
    ("0 0 13 * 5", ["day of month", "day of week", "not both"]),
    ("0 0 */2 * 1-5", ["day of month", "day of week", "not both"]),
    # steps
    ("0 22 * * */0", ["bad step", "'0'"]),
    ("0 22 * * */x", ["bad step", "'x'"]),
    ("*/0 22 * * *", ["*/0"]),
]


@pytest.mark.parametrize(("expr", "words"), BAD)
def test_bad_expressions_say_what_is_wrong(expr: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_cron(expr, UTC)
    message = str(info.value)
    assert message.startswith(repr(expr) + ":"), message
    for word in words:
        assert word in message, (word, message)


# -- known bugs: 7 (Sunday) as the start of a range ----------------------------------------


def test_7_to_7_is_sunday_only() -> None:
    # crontab: 7-7 is Sunday.  parse_cron maps the start 7 → 0 and the end back to 7,
    # so the range becomes 0..7: every day of the week.
    assert local(fires("0 22 * * 7-7", "2026-11-23T00:00", 2)) == [
        "2026-11-29 22:00 Sun",
        "2026-12-06 22:00 Sun",
    ]


def test_7_to_1_runs_backwards() -> None:
    # 7-1 is as backwards as 5-1, but parse_cron turns it into "sun,mon".
    with pytest.raises(ValueError, match="backwards"):
        parse_cron("0 22 * * 7-1", UTC)
