"""Property: ``JobSpec(**fields)`` on any fields is a :class:`SpecError` or a job within
bounds, never another exception (the SDK's front door)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ebbtide.errors import SpecError
from ebbtide.queue.spec import CONVENIENCE_INPUTS, JobSpec
from tests.unit.fuzz_support import (
    GOOD,
    NUMBER_TEXT,
    QUANTITY_TEXT,
    assert_spec_in_bounds,
    fuzz,
    mostly,
)

FIELDS = sorted({*JobSpec.model_fields, *CONVENIENCE_INPUTS})

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    NUMBER_TEXT,
    QUANTITY_TEXT,
    st.sampled_from(["KILL", "STOP", "USR1", "TERM", "SIGUSR2", "9", "10", "0", "SEGV"]),
)
ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ARGV = st.lists(st.text(max_size=12), min_size=0, max_size=4)
ENV = st.dictionaries(
    st.one_of(st.sampled_from(["A", "PATH", "A=B", "", "1X", "A\0", "_x"]), st.text(max_size=6)),
    st.text(max_size=12),
    max_size=3,
)
DEPENDS = st.lists(
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["afterok", "afterany", "later"]), "job_id": SCALARS}
    ),
    max_size=3,
)
ARRAY = st.one_of(
    st.fixed_dictionaries(
        {"start": SCALARS, "end": SCALARS},
        optional={"step": SCALARS, "limit": SCALARS},
    ),
    ANY,
)
#: Values that fit each field's shape often enough to get past the type checks.
SHAPED: dict[str, st.SearchStrategy[Any]] = {
    "command": ARGV,
    "args": ARGV,
    "script": st.text(max_size=40),
    "env": ENV,
    "depends": DEPENDS,
    "array": ARRAY,
    "gpu": mostly(st.one_of(GOOD["gpu"], st.sampled_from([0.25, 1, 2, 0.5])), NUMBER_TEXT),
    "gpumem": mostly(GOOD["gpumem"], QUANTITY_TEXT),
    "walltime": mostly(GOOD["duration"], QUANTITY_TEXT),
    "deadline": mostly(GOOD["deadline"], QUANTITY_TEXT),
    "checkpoint_interval": mostly(GOOD["duration"], QUANTITY_TEXT),
    "signal": mostly(GOOD["signal"], SCALARS),
    "priority": mostly(st.integers(-1024, 1023), SCALARS),
    "max_attempts": mostly(st.integers(1, 100), SCALARS),
    "kind": mostly(st.sampled_from(["training", "inference", "batch"]), SCALARS),
    "name": mostly(GOOD["name"], SCALARS),
    "queue": mostly(st.just("default"), SCALARS),
    "cwd": mostly(GOOD["path"], SCALARS),
    "checkpoint_dir": mostly(GOOD["path"], SCALARS),
    "compute_pct": mostly(st.sampled_from([0.01, 12.5, 100.0, 50]), SCALARS),
    "memory_mib": mostly(st.integers(1, 2**20), SCALARS),
    "walltime_s": mostly(st.floats(0.1, 1e6), SCALARS),
    "deadline_s": mostly(st.floats(1, 3600), SCALARS),
    "hold": st.booleans(),
}


@st.composite
def spec_fields(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from([*FIELDS, "bogus"]), max_size=6, unique=True))
    fields = {name: draw(mostly(SHAPED.get(name, SCALARS), ANY)) for name in names}
    if draw(st.booleans()):
        fields.setdefault("command", draw(ARGV.filter(bool)))
    return fields


@fuzz(500)
@given(spec_fields())
def test_jobspec_is_a_spec_error_or_a_sane_job(fields: dict[str, Any]) -> None:
    try:
        spec = JobSpec(**fields)
    except SpecError as exc:
        assert str(exc) and exc.field
        return
    assert_spec_in_bounds(spec)


#: The field each convenience input fills (an error may name either).
TARGETS = {
    "gpu": "compute_pct",
    "gpumem": "memory_mib",
    "walltime": "walltime_s",
    "deadline": "deadline_s",
    "checkpoint_interval": "checkpoint_interval_s",
}


@fuzz(300)
@given(st.sampled_from(sorted(TARGETS)), ANY)
def test_convenience_inputs_on_anything(name: str, value: Any) -> None:
    try:
        spec = JobSpec(command=["true"], **{name: value})
    except SpecError as exc:
        assert exc.field in (name, TARGETS[name]), exc
        return
    assert_spec_in_bounds(spec)
