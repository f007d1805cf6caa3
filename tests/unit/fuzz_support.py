"""What the ``test_fuzz_*`` property tests share: reproducible settings, input strategies
for the numbers people mistype, and the checks that an accepted job or policy is sane."""

from __future__ import annotations

import math
import re
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ebbtide import units
from ebbtide.config.policy import (
    MAX_COUNT,
    MAX_TIMEOUT_S,
    MIN_DISPATCH_TIMEOUT_S,
    MIN_HEARTBEAT_TIMEOUT_S,
    Policy,
)
from ebbtide.queue.spec import (
    MAX_ARGV_ENV_BYTES,
    MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
    MAX_DEADLINE_S,
    MAX_DEPENDENCIES,
    MAX_PATH_BYTES,
    MAX_SCRIPT_BYTES,
    MIN_DEADLINE_S,
    MIN_JOB_DURATION_S,
    JobSpec,
)
from ebbtide.scheduling.cron import next_fire


def fuzz(max_examples: int) -> settings:
    """Reproducible in CI (derandomized, no example database), no per-example deadline."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


#: Numbers as people (and fault injectors) write them: fine, mistyped and absurd.
NUMBER_TEXT = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "2",
            "64",
            "65",
            "-1",
            "+1",
            "0.5",
            ".5",
            "5.",
            "1.0",
            "25%",
            "100%",
            "0.01%",
            "0.001%",
            "33.333%",
            "150%",
            "inf",
            "-inf",
            "nan",
            "NaN",
            "infinity",
            "1e-300",
            "1e300",
            "1e2",
            "1_000",
            "0x10",
            "٣",
            "²",
            "",
            " ",
            "%",
            "1 %",
            "99999999999999999999",
            "9223372036854775807",
            "9223372036854775808",
            "2147483647",
            "2147483648",
            "1" * 400,
            "0." + "0" * 300 + "1",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.decimals(allow_nan=False, allow_infinity=False, places=6).map(str),
)
#: Units that follow a number in a size or a duration.
UNIT_TEXT = st.sampled_from(
    ["", "s", "ms", "us", "m", "min", "h", "d", "GiB", "MiB", "TiB", "GB", "KB", "b", "%", "x"]
)
QUANTITY_TEXT = st.one_of(
    st.builds(lambda n, u: n + u, NUMBER_TEXT, UNIT_TEXT),
    st.builds(lambda a, b, c: f"{a}:{b}:{c}", NUMBER_TEXT, NUMBER_TEXT, NUMBER_TEXT),
    st.text(max_size=20),
)

#: Values that are usually right, by what they are; mixed with the rest so that a good
#: share of the generated jobs and policies is accepted and checked for sanity.
GOOD = {
    "gpu": st.sampled_from(["25%", "0.5", ".25", "1", "2", "64", "100%", "0.01%", "33.33%"]),
    "gpumem": st.sampled_from(["4GiB", "512MiB", "1TiB", "16GB", "1048576", "1.5GiB"]),
    "duration": st.sampled_from(["30s", "1s", "10m", "1h", "02:00:00", "90", "1.5s", "1d"]),
    "deadline": st.sampled_from(["1s", "30s", "5m", "1h", "3600"]),
    "int": st.sampled_from(["0", "1", "3", "100", "-1024", "1023"]),
    "array": st.sampled_from(["1-10", "0-99999", "5", "1-100:2%4", "2147483647"]),
    "signal": st.sampled_from(["TERM", "USR1", "usr2", "SIGINT", "10", "HUP", "XCPU"]),
    "name": st.sampled_from(["train", "a.b-c_[1]", "x" * 128]),
    "path": st.sampled_from(["/tmp", "rel/dir", "/ck"]),
    "env": st.sampled_from(["A=1", "A=1,B=two", "HOME", "A='x,y'", "EMPTY="]),
    "depend": st.sampled_from(["depend=afterok:12", "depend=afterany:1:2,afternotok:3"]),
}


def mostly(
    good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], one_in: int = 4
) -> st.SearchStrategy[Any]:
    """``bad`` about once in ``one_in`` draws, ``good`` otherwise (and ``good`` is what
    shrinking goes to: the simplest draw)."""
    return st.integers(1, one_in).flatmap(lambda i: bad if i == one_in else good)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _finite_in(value: float | None, low: float, high: float) -> bool:
    return value is None or (math.isfinite(value) and low <= value <= high)


def _os_text(text: str, max_bytes: int) -> bool:
    return "\0" not in text and len(text.encode()) <= max_bytes


def assert_spec_in_bounds(spec: JobSpec) -> None:
    """An accepted job: every number within its bound, every string one the OS takes,
    and it survives the store's round trip (the store re-validates what it reads)."""
    assert units.GPU_SHARE_STEP_PCT <= spec.compute_pct <= 100
    assert round(spec.compute_pct, 2) == spec.compute_pct
    assert 0 <= spec.gpus <= units.MAX_GPUS
    assert spec.gpus == 0 or spec.compute_pct == 100
    assert 1 <= spec.memory_mib <= units.MAX_MEMORY_MIB
    assert -1024 <= spec.priority <= 1023
    assert 1 <= spec.max_attempts <= 100
    assert _finite_in(spec.walltime_s, MIN_JOB_DURATION_S, units.MAX_DURATION_S)
    assert _finite_in(spec.checkpoint_interval_s, MIN_JOB_DURATION_S, units.MAX_DURATION_S)
    assert _finite_in(spec.deadline_s, MIN_DEADLINE_S, MAX_DEADLINE_S)
    assert units.signal_name(spec.signal) in units.WARNING_SIGNALS
    assert len(spec.depends) <= MAX_DEPENDENCIES
    assert all(1 <= d.job_id <= units.MAX_INT64 for d in spec.depends)
    if spec.array is not None:
        assert 0 <= spec.array.start <= spec.array.end <= MAX_ARRAY_INDEX
        assert 1 <= len(spec.array.indices()) <= MAX_ARRAY_TASKS
    assert all(_ENV_NAME.fullmatch(k) for k in spec.env)
    argv = [*(spec.command or []), *spec.args, *(f"{k}={v}" for k, v in spec.env.items())]
    assert all(_os_text(a, 128 * 1024) for a in argv)
    assert sum(len(a.encode()) + 1 for a in argv) <= MAX_ARGV_ENV_BYTES
    assert spec.script is None or _os_text(spec.script, MAX_SCRIPT_BYTES)
    for path in (spec.cwd, spec.checkpoint_dir):
        assert path is None or (path and _os_text(path, MAX_PATH_BYTES))
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def _numbers(value: Any) -> list[float]:
    """Every number held anywhere in a model (recursively)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, BaseModel):
        return [n for name in type(value).model_fields for n in _numbers(getattr(value, name))]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _numbers(v)]
    return []


def assert_policy_in_bounds(policy: Policy) -> None:
    """An accepted policy: every number finite and bounded, timeouts within what the
    node agent's timing needs, every cron window opens some day."""
    biggest = max(units.MAX_DURATION_S, units.MAX_MEMORY_MIB, MAX_COUNT)
    for number in _numbers(policy):
        assert math.isfinite(number) and -1024 <= number <= biggest, number
    d = policy.defaults
    assert MIN_HEARTBEAT_TIMEOUT_S <= d.heartbeat_timeout_s <= MAX_TIMEOUT_S
    assert MIN_DISPATCH_TIMEOUT_S <= d.dispatch_timeout_s <= MAX_TIMEOUT_S
    assert MIN_DEADLINE_S <= d.deadline_s <= MAX_DEADLINE_S
    for q in policy.queues.values():
        for deadline in (q.deadline_s, q.max_deadline_s):
            assert deadline is None or MIN_DEADLINE_S <= deadline <= MAX_DEADLINE_S
    for w in [*policy.cron_windows, *policy.blackouts]:
        from ebbtide.scheduling.cron import parse_cron

        trigger = parse_cron(w.schedule, w.tz)
        assert next_fire(trigger, 946684800.0, w.tz) is not None  # from 2000-01-01
