"""A friendly field and the raw field it sets, given together, must agree.

``JobSpec(gpu="25%", compute_pct=50)`` used to give 25% without a word, and
``JobSpec(gpumem="4GiB", memory_mib=100)`` 4096 MiB: whichever was read last won.  Now a
disagreement is a :class:`SpecError` naming both fields; the same value twice is fine.
"""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.errors import SpecError
from ebbtide.queue.spec import JobSpec


@pytest.mark.parametrize(
    ("fields", "friendly", "raw"),
    [
        ({"gpu": "25%", "compute_pct": 50}, "gpu", "compute_pct"),
        ({"gpu": "2", "gpus": 1}, "gpu", "gpus"),
        ({"gpu": "25%", "gpus": 1}, "gpu", "gpus"),
        ({"gpumem": "4GiB", "memory_mib": 100}, "gpumem", "memory_mib"),
        ({"walltime": "1h", "walltime_s": 60}, "walltime", "walltime_s"),
        ({"deadline": "30s", "deadline_s": 60}, "deadline", "deadline_s"),
        (
            {"checkpoint_interval": "10m", "checkpoint_interval_s": 60},
            "checkpoint_interval",
            "checkpoint_interval_s",
        ),
        ({"gpu": "25%", "compute_pct": None}, "gpu", "compute_pct"),
    ],
)
def test_a_friendly_and_a_raw_field_that_disagree_are_refused(
    fields: dict[str, Any], friendly: str, raw: str
) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(command=["true"], **fields)
    assert info.value.field == friendly
    message = str(info.value)
    assert raw in message and "not both" in message
    assert "\n" not in message


def test_the_message_says_what_each_field_gave() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(command=["true"], gpu="25%", compute_pct=50)
    assert str(info.value) == (
        "gpu: sets compute_pct to 25, but compute_pct=50 is given too; "
        "give gpu or compute_pct, not both"
    )


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"gpu": "25%", "compute_pct": 25}, "compute_pct", 25.0),
        ({"gpu": "25%", "compute_pct": 25.0, "gpus": 0}, "compute_pct", 25.0),
        ({"gpu": "2", "gpus": 2, "compute_pct": 100}, "gpus", 2),
        ({"gpumem": "4GiB", "memory_mib": 4096}, "memory_mib", 4096),
        ({"walltime": "02:00:00", "walltime_s": 7200}, "walltime_s", 7200.0),
        ({"deadline": "30s", "deadline_s": 30.0}, "deadline_s", 30.0),
        ({"walltime": None, "walltime_s": 60}, "walltime_s", 60.0),
    ],
)
def test_both_with_the_same_value_are_accepted(
    fields: dict[str, Any], field: str, value: float
) -> None:
    assert getattr(JobSpec(command=["true"], **fields), field) == value


def test_a_spec_round_trips_through_its_own_fields() -> None:
    spec = JobSpec(command=["true"], gpu="25%", gpumem="4GiB", walltime="1h", deadline="30s")
    again = JobSpec(**spec.model_dump(exclude_unset=True))
    assert again == spec
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def test_altering_replaces_the_raw_fields_first() -> None:
    """What ``Client.alter`` does: the raw fields a change replaces are dropped first, so
    the new ``gpu`` does not meet the old ``compute_pct``."""
    from ebbtide.client_fields import REPLACED_BY

    kept = JobSpec(command=["true"], gpu="25%", gpumem="4GiB").model_dump(exclude_unset=True)
    changes = {"gpu": "50%", "gpumem": "8GiB"}
    for field in changes:
        for replaced in REPLACED_BY[field]:
            kept.pop(replaced, None)
    spec = JobSpec(**kept, **changes)
    assert (spec.compute_pct, spec.gpus, spec.memory_mib) == (50.0, 0, 8192)
