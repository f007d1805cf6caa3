"""Regression tests for bad policy files: each is a :class:`ConfigError` naming the file,
line, column and field path, never a crash and never silently accepted (duplicate keys,
YAML 1.1 booleans for numbers, absurd timeouts, crons that never fire, inf/nan, deep
nesting, alias bombs, values PyYAML cannot build, files that are not files)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from yaml.error import Mark

from ebbtide.config.loader import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES, _lines, _Problem
from ebbtide.config.policy import (
    MIN_DISPATCH_TIMEOUT_S,
    MIN_HEARTBEAT_TIMEOUT_S,
    load_policy,
    parse_policy,
)
from ebbtide.errors import ConfigError
from ebbtide.scheduling.cron import parse_cron

LINE = re.compile(r"^p\.yaml:(\d+):(\d+): (\S+): (.+)$")


def _problems(text: str) -> list[tuple[int, int, str, str]]:
    """Every problem of a policy text as (line, column, field path, message)."""
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    out = []
    for line in str(info.value).splitlines():
        m = LINE.match(line)
        assert m, f"not file:line:col: path: message: {line!r}"
        out.append((int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)))
    return out


def _one(text: str) -> tuple[int, int, str, str]:
    [problem] = _problems(text)
    return problem


# ------------------------------------------------------------------ duplicate keys


@pytest.mark.parametrize(
    ("text", "line", "col", "path"),
    [
        ("defaults:\n  deadline_s: 10s\n  deadline_s: 20s\n", 3, 3, "defaults.deadline_s"),
        ("defaults: {}\nqueues: {}\ndefaults: {}\n", 3, 1, "defaults"),
        ("queues:\n  gpu: {priority: 1, priority: 2}\n", 2, 22, "queues.gpu.priority"),
        ("queues:\n  gpu: {}\n  gpu: {}\n", 3, 3, "queues.gpu"),
        ('defaults: {deadline_s: 1m, "deadline_s": 2m}\n', 1, 28, "defaults.deadline_s"),
        (
            "windows:\n  - {name: a, kind: cron, schedule: '0 1 * * *', duration: 1h,"
            " duration: 2h}\n",
            2,
            64,
            "windows.0.duration",
        ),
    ],
)
def test_duplicate_keys_are_errors(text: str, line: int, col: int, path: str) -> None:
    problem = _one(text)
    assert problem[:3] == (line, col, path)
    assert "duplicate key" in problem[3] and "first given on line" in problem[3]


def test_every_duplicate_is_reported() -> None:
    problems = _problems("admins: []\nadmins: []\ndefaults: {a: 1, a: 2}\n")
    assert [(p[2], p[3].split(" (")[0]) for p in problems] == [
        ("admins", "duplicate key"),
        ("defaults.a", "duplicate key"),
        ("defaults.a", "unknown key"),  # reported beside them, not after a second run
    ]


def test_a_duplicate_key_does_not_hide_the_files_other_errors() -> None:
    """``ebb policy check`` reported only a duplicate key, and the file's other errors
    one fix later: each error is reported in one run, with its line and field."""
    problems = _problems(
        "defaults:\n"
        "  deadline_s: 10s\n"
        "  deadline_s: 20s\n"
        "  heartbeat_timeout_s: 0.000001\n"
        "queues:\n"
        "  gpu: {priority: on, colour: red}\n"
    )
    assert [(p[0], p[2]) for p in problems] == [
        (3, "defaults.deadline_s"),
        (4, "defaults.heartbeat_timeout_s"),
        (6, "queues.gpu.priority"),
        (6, "queues.gpu.colour"),
    ]
    assert "duplicate key (first given on line 2)" in problems[0][3]
    # checks across fields run once the fields are each valid: with a duplicate too
    crossed = _problems("queues:\n  a: {priority: 1}\n  a: {priority: 2}\n  b: {aliases: [a]}\n")
    assert [p[2] for p in crossed] == ["queues.a", "queues.b.aliases.0"], crossed
    # an error in a value given twice points at the one that counts: the last
    last = _problems("defaults:\n  deadline_s: 10s\n  deadline_s: yes\n")
    assert [(p[0], p[2]) for p in last] == [(3, "defaults.deadline_s")] * 2
    # a value that cannot be built at all is reported beside the duplicate
    built = _problems("admins: []\nadmins: []\ndefaults: {deadline_s: 2026-02-30}\n")
    assert [p[2] for p in built] == ["admins", "defaults.deadline_s"]


def test_a_files_errors_are_listed_in_file_order() -> None:
    """Duplicates came first, then validation's errors: lines 8, 3, 4, 8."""
    problems = _problems(
        "defaults:\n"
        "  deadline_s: 10s\n"
        "  heartbeat_timeout_s: 0.000001\n"
        "  colour: red\n"
        "queues:\n"
        "  a: {priority: 1, priority: 2}\n"
        "  b: {max_running: 1, max_running: 2}\n"
        "  c: {colour: red, priority: 1, priority: 2}\n"
        "admins: []\n"
        "admins: []\n"
    )
    assert [p[:3] for p in problems] == [
        (3, 3, "defaults.heartbeat_timeout_s"),
        (4, 3, "defaults.colour"),
        (6, 20, "queues.a.priority"),
        (7, 23, "queues.b.max_running"),
        (8, 7, "queues.c.colour"),
        (8, 33, "queues.c.priority"),
        (10, 1, "admins"),
    ]


def test_an_error_with_no_position_comes_last_in_its_order() -> None:
    """The loader's own errors carry no position when it has none to give."""

    def at(line: int, col: int) -> Mark:
        return Mark("p.yaml", 0, line - 1, col - 1, "", 0)

    problems = [
        _Problem(("late",), at(9, 1), "x"),
        _Problem(("nowhere",), None, "first unplaced"),
        _Problem(("early",), at(2, 5), "x"),
        _Problem(("again",), None, "second unplaced"),
        _Problem(("early", "left"), at(2, 1), "x"),
    ]
    assert [line.split(": ")[1] for line in _lines(problems, "p.yaml").splitlines()] == [
        "early.left",
        "early",
        "late",
        "nowhere",
        "again",
    ]


def test_merge_keys_may_override() -> None:
    policy = parse_policy(
        "queues:\n  base: &base {priority: 3, max_running: 2}\n"
        "  gpu:\n    <<: *base\n    priority: 5\n",
        "p.yaml",
    )
    assert (policy.queues["gpu"].priority, policy.queues["gpu"].max_running) == (5, 2)


# ------------------------------------------------------------------ YAML 1.1 booleans


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("defaults:\n  deadline_s: yes\n", "defaults.deadline_s"),
        ("defaults:\n  heartbeat_timeout_s: on\n", "defaults.heartbeat_timeout_s"),
        ("defaults:\n  margin_compute_pct: no\n", "defaults.margin_compute_pct"),
        ("defaults:\n  margin_memory_mib: off\n", "defaults.margin_memory_mib"),
        ("defaults:\n  forecast_compute_quantile: true\n", "defaults.forecast_compute_quantile"),
        ("queues:\n  gpu: {priority: on}\n", "queues.gpu.priority"),
        ("queues:\n  gpu: {max_running: yes}\n", "queues.gpu.max_running"),
        ("queues:\n  gpu: {max_fleet_share: yes}\n", "queues.gpu.max_fleet_share"),
        (
            "windows:\n  - {name: q, kind: lull, below: {compute_pct: on, memory: 1GiB},"
            " for: 10m, close_above: {compute_pct: 50, memory: 2GiB}}\n",
            "windows.0.below.compute_pct",
        ),
    ],
)
def test_booleans_where_numbers_belong(text: str, path: str) -> None:
    line, _col, where, message = _one(text)
    assert where == path
    assert "boolean" in message and "yes, no, on, off" in message, message
    assert line == 2


def test_booleans_still_work_where_booleans_belong() -> None:
    policy = parse_policy("queues:\n  gpu: {preemptible: no}\n", "p.yaml")
    assert policy.queues["gpu"].preemptible is False


# ------------------------------------------------------------------ absurd timeouts


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("heartbeat_timeout_s", "0.000001", ["from 2s to 1h", "1e-06s"]),
        ("heartbeat_timeout_s", "1ms", ["from 2s to 1h"]),
        ("heartbeat_timeout_s", "1.5s", ["from 2s to 1h"]),
        ("heartbeat_timeout_s", "2h", ["from 2s to 1h"]),
        ("dispatch_timeout_s", "100ms", ["from 2s to 1h"]),
        ("dispatch_timeout_s", "1d", ["from 2s to 1h"]),
        ("deadline_s", "0.5s", ["from 1s to 1h"]),
        ("deadline_s", "2h", ["from 1s to 1h"]),
        ("eviction_cooldown_s", "2d", ["from 0s to 1d"]),
        ("backoff_max_s", "400d", ["366 days"]),
        ("device_recovery_s", "99999999999999999999", ["366 days"]),
        ("forecast_history_s", "0.001", ["from 1s to 7d"]),
        ("forecast_warmup_s", "-1", ["must not be negative"]),
    ],
)
def test_timeouts_have_floors_and_ceilings(key: str, value: str, words: list[str]) -> None:
    line, col, path, message = _one(f"defaults:\n  {key}: {value}\n")
    assert (line, col, path) == (2, 3, f"defaults.{key}")
    for word in words:
        assert word in message, message


def test_floors_fit_the_agent_timing() -> None:
    from ebbtide.preemption.enforcer import KILL_LEAD_S
    from ebbtide.queue.spec import MIN_DEADLINE_S
    from ebbtide.workers.agent import HEARTBEAT_PERIOD_S, SAMPLE_PERIOD_S

    # the agent fences its attempts at half the timeout: two heartbeats may be missed
    assert MIN_HEARTBEAT_TIMEOUT_S / 2 >= 2 * HEARTBEAT_PERIOD_S
    assert MIN_DISPATCH_TIMEOUT_S >= 4 * HEARTBEAT_PERIOD_S
    # a deadline leaves the job most of itself after the agent's tick and kill lead
    assert MIN_DEADLINE_S - KILL_LEAD_S - SAMPLE_PERIOD_S >= MIN_DEADLINE_S / 2
    policy = parse_policy(
        "defaults: {heartbeat_timeout_s: 2s, dispatch_timeout_s: 2s, deadline_s: 1s}\n", "p"
    )
    assert policy.defaults.heartbeat_timeout_s == MIN_HEARTBEAT_TIMEOUT_S


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("queues:\n  gpu: {deadline_s: 100ms}\n", "queues.gpu.deadline_s"),
        ("queues:\n  gpu: {max_deadline_s: 0.2}\n", "queues.gpu.max_deadline_s"),
        ("queues:\n  gpu: {max_running: 99999999999999999999}\n", "queues.gpu.max_running"),
        ("queues:\n  gpu: {max_preemptions: 10000001}\n", "queues.gpu.max_preemptions"),
        ("queues:\n  gpu: {min_runtime_s: 30d}\n", "queues.gpu.min_runtime_s"),
        ("defaults:\n  margin_memory_mib: 2TiB\n", "defaults.margin_memory_mib"),
        ("defaults:\n  margin_memory_mib: 99999999999\n", "defaults.margin_memory_mib"),
        (
            "windows:\n  - {name: q, kind: lull, below: {compute_pct: 10, memory: 1GiB},"
            " for: 1ms, close_above: {compute_pct: 50, memory: 2GiB}}\n",
            "windows.0.for",
        ),
        (
            "windows:\n  - {name: a, kind: cron, schedule: '0 1 * * *', duration: 0.001s}\n",
            "windows.0.duration",
        ),
    ],
)
def test_other_numbers_are_bounded(text: str, path: str) -> None:
    assert _one(text)[2] == path


# ------------------------------------------------------------------ crons that never fire


@pytest.mark.parametrize(
    "schedule", ["0 0 31 2 *", "0 0 30 2 *", "0 0 30 feb *", "0 0 31 4,6,9,11 *", "0 0 31 apr *"]
)
def test_cron_that_never_fires_is_refused(schedule: str) -> None:
    line, col, path, message = _one(
        f"windows:\n  - name: w\n    kind: cron\n    schedule: '{schedule}'\n    duration: 1h\n"
    )
    assert (line, col, path) == (4, 5, "windows.0.schedule")
    assert "never fires" in message


@pytest.mark.parametrize(
    "schedule", ["0 0 29 2 *", "0 0 31 */2 *", "0 0 last feb *", "0 22 * * mon-fri", "* * * * *"]
)
def test_rare_crons_still_fire(schedule: str) -> None:
    parse_cron(schedule, ZoneInfo("Europe/Berlin"))


def test_never_firing_is_found_fast() -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match="never fires"):
        parse_cron("0 0 31 2 *", ZoneInfo("UTC"))
    assert time.monotonic() - started < 0.5


# ------------------------------------------------------------------ inf, nan, huge numbers


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (".inf", "defaults.deadline_s"),
        ("-.inf", "defaults.deadline_s"),
        (".nan", "defaults.deadline_s"),
        ("1.0e+999", "defaults.deadline_s"),
        (".nan", "defaults.margin_compute_pct"),
        (".inf", "defaults.forecast_compute_quantile"),
        (".inf", "defaults.margin_memory_mib"),
        (".nan", "defaults.forecast_history_s"),
    ],
)
def test_infinite_and_nan_numbers(value: str, path: str) -> None:
    key = path.split(".")[1]
    assert _one(f"defaults:\n  {key}: {value}\n")[2] == path


def test_an_integer_of_thousands_of_digits() -> None:
    line, col, path, message = _one("defaults:\n  margin_memory_mib: " + "9" * 5000 + "\n")
    assert (line, col, path) == (2, 22, "defaults.margin_memory_mib")
    assert "5000 characters" in message and len(message) < 200


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "windows:\n  - {name: a, kind: cron, schedule: '0 1 * * *', duration: 1h,"
            " except: [2026-02-30]}\n",
            "windows.0.except.0",
        ),
        ("admins: !!binary 'not base64!'\n", "admins"),
    ],
)
def test_values_yaml_cannot_build(text: str, path: str) -> None:
    problems = _problems(text) if "binary" not in text else None
    if problems is not None:
        assert problems[0][2] == path
    else:
        with pytest.raises(ConfigError, match=r"^p\.yaml:1:\d+: "):
            parse_policy(text, "p.yaml")


# ------------------------------------------------------------------ nesting and aliases


@pytest.mark.parametrize(
    "text",
    [
        "admins: " + "[" * 5000 + "]" * 5000 + "\n",
        "admins: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
        "- " * 5000 + "x\n",
    ],
)
def test_deep_nesting_is_a_clear_error(text: str) -> None:
    line, _col, path, message = _one(text)
    assert line == 1
    assert f"nested deeper than {MAX_DEPTH} levels" in message
    assert path.count(".") >= MAX_DEPTH - 1


def test_alias_bomb_is_refused() -> None:
    text = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n"
    text += "admins: *g\n"
    started = time.monotonic()
    problem = _one(text)
    assert f"more than {MAX_VALUES} values" in problem[3]
    assert time.monotonic() - started < 2


def test_alias_chain_deeper_than_the_text() -> None:
    text = "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 200))
    assert "nested deeper than" in _one(text)[3]


def test_alias_inside_its_own_anchor() -> None:
    line, _col, path, message = _one("admins: &a [bob, *a]\n")
    assert (line, path) == (1, "admins.1")
    assert "alias inside its own anchor" in message


def test_small_aliases_still_work() -> None:
    policy = parse_policy(
        "windows:\n"
        "  - {name: q1, kind: lull, below: &low {compute_pct: 10, memory: 1GiB}, for: 1m,"
        " close_above: &high {compute_pct: 50, memory: 2GiB}}\n"
        "  - {name: q2, kind: lull, below: *low, for: 2m, close_above: *high}\n",
        "p.yaml",
    )
    assert len(policy.lull_windows) == 2


# ------------------------------------------------------------------ the file itself


def test_syntax_error_on_a_control_character_has_a_position() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy("admins:\n  - bob\x07\n", "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:2:") and "#x0007" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: os.mkfifo(p), ["not a regular file"]),
        (lambda p: p.mkdir(), ["not a regular file"]),
        (lambda p: p.write_bytes(b"#" * (MAX_FILE_BYTES + 1)), ["1 MiB"]),
        (lambda p: p.write_bytes(b"admins: [bob]\n\xff\xfe\n"), [":2:1: (top):", "not UTF-8"]),
    ],
)
def test_policy_files_that_are_not_policy_files(tmp_path: Path, make, words) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ebbtide.yaml"
    make(path)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    message = str(info.value)
    assert message.startswith(str(path))
    for word in words:
        assert word in message, message


def test_dev_zero_as_a_policy_file() -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_policy(Path("/dev/zero"))


def test_many_problems_are_capped() -> None:
    text = "admins: [" + ", ".join(["[x]"] * 500) + "]\n"
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 51
    assert lines[-1] == "p.yaml: and 450 more problems"
