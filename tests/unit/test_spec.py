"""JobSpec validation: the forms people write are normalised; mistakes name their field."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from ebbtide.errors import SpecError, UserError
from ebbtide.queue.spec import (
    DEFAULT_COMPUTE_PCT,
    DEFAULT_DEADLINE_S,
    DEFAULT_MEMORY_MIB,
    JobSpec,
)

CMD = {"command": ["python", "train.py"]}


def test_defaults() -> None:
    spec = JobSpec(**CMD)
    assert spec.kind == "batch"
    assert (spec.compute_pct, spec.gpus, spec.memory_mib) == (
        DEFAULT_COMPUTE_PCT,
        0,
        DEFAULT_MEMORY_MIB,
    )
    assert spec.queue == "default"
    assert spec.priority == 0
    assert spec.deadline_s is None  # the queue's default applies
    assert DEFAULT_DEADLINE_S > 0
    assert spec.signal == int(signal.SIGTERM)
    assert spec.max_attempts == 1
    assert spec.depends == []
    assert spec.array is None
    assert spec.hold is False


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"gpu": "25%"}, {"compute_pct": 25.0, "gpus": 0}),
        ({"gpu": 0.25}, {"compute_pct": 25.0, "gpus": 0}),
        ({"gpu": "0.5"}, {"compute_pct": 50.0, "gpus": 0}),
        ({"gpu": "100%"}, {"compute_pct": 100.0, "gpus": 1}),
        ({"gpu": 1}, {"compute_pct": 100.0, "gpus": 1}),
        ({"gpu": 2}, {"compute_pct": 100.0, "gpus": 2}),
        ({"gpumem": "4GiB"}, {"memory_mib": 4096}),
        ({"gpumem": "512MiB"}, {"memory_mib": 512}),
        ({"gpumem": "1.5GiB"}, {"memory_mib": 1536}),
        ({"walltime": "02:00:00"}, {"walltime_s": 7200.0}),
        ({"walltime": "30:00"}, {"walltime_s": 1800.0}),
        ({"walltime": "2h"}, {"walltime_s": 7200.0}),
        ({"walltime": 90}, {"walltime_s": 90.0}),
        ({"deadline": "30s"}, {"deadline_s": 30.0}),
        ({"deadline": "5m"}, {"deadline_s": 300.0}),
        ({"deadline": None}, {"deadline_s": None}),
        ({"checkpoint_interval": "10m"}, {"checkpoint_interval_s": 600.0}),
        ({"signal": "USR1"}, {"signal": int(signal.SIGUSR1)}),
        ({"signal": "SIGUSR1"}, {"signal": int(signal.SIGUSR1)}),
        ({"signal": "usr1"}, {"signal": int(signal.SIGUSR1)}),
        ({"signal": 10}, {"signal": 10}),
        ({"signal": "10"}, {"signal": 10}),
        ({"signal": "INT"}, {"signal": int(signal.SIGINT)}),
        ({"kind": "training"}, {"kind": "training"}),
        ({"kind": "inference"}, {"kind": "inference"}),
        ({"priority": 1023}, {"priority": 1023}),
        ({"priority": -1024}, {"priority": -1024}),
        ({"name": "train-v2.1_[3]"}, {"name": "train-v2.1_[3]"}),
        ({"queue": "gpu-fast_1"}, {"queue": "gpu-fast_1"}),
        ({"max_attempts": 3}, {"max_attempts": 3}),
    ],
)
def test_valid_forms_are_normalised(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = JobSpec(**CMD, **fields)
    assert {k: getattr(spec, k) for k in expected} == expected


def test_script_instead_of_command() -> None:
    spec = JobSpec(script="#!/bin/sh\necho hi\n", args=["a"])
    assert spec.command is None
    assert spec.script is not None
    assert spec.display_name() == "script"


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"command": ["python", "train.py"]}, "python"),
        ({"command": ["/usr/bin/python3"]}, "python3"),
        ({"command": ["my job.sh"]}, "my_job.sh"),
        ({"command": ["x"], "name": "given"}, "given"),
    ],
)
def test_display_name(fields: dict[str, Any], name: str) -> None:
    assert JobSpec(**fields).display_name() == name


def test_array_and_dependencies() -> None:
    spec = JobSpec(
        **CMD,
        array={"start": 1, "end": 9, "step": 2, "limit": 2},
        depends=[{"kind": "afterok", "job_id": 4}, {"kind": "afterany", "job_id": 5}],
    )
    assert spec.array is not None
    assert list(spec.array.indices()) == [1, 3, 5, 7, 9]
    assert spec.array.limit == 2
    assert [(d.kind, d.job_id) for d in spec.depends] == [("afterok", 4), ("afterany", 5)]


def test_round_trips_through_json() -> None:
    spec = JobSpec(**CMD, gpu="25%", gpumem="4GiB", deadline="30s", signal="USR1")
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec


# ------------------------------------------------------------------ mistakes


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({**CMD, "kind": "gpu"}, "kind", ["training", "inference", "batch"]),
        ({**CMD, "gpu": "lots"}, "gpu", ["25%", "0.25", "lots"]),
        ({**CMD, "gpu": "150%"}, "gpu", ["100", "150%"]),
        ({**CMD, "gpu": 1.5}, "gpu", ["whole number"]),
        ({**CMD, "gpu": 0}, "gpu", ["positive"]),
        ({**CMD, "gpumem": "4 parsecs"}, "gpumem", ["4GiB", "parsecs"]),
        ({**CMD, "gpumem": "much"}, "gpumem", ["4GiB", "much"]),
        ({**CMD, "walltime": "soon"}, "walltime", ["02:00:00", "soon"]),
        ({**CMD, "deadline": "1 fortnight"}, "deadline", ["30s"]),
        ({**CMD, "signal": "NOPE"}, "signal", ["NOPE", "USR1"]),
        ({**CMD, "priority": 1024}, "priority", ["1023"]),
        ({**CMD, "priority": -1025}, "priority", ["-1024"]),
        ({**CMD, "max_attempts": 0}, "max_attempts", ["1"]),
        ({}, "command", ["command", "script"]),
        ({**CMD, "script": "echo hi"}, "command", ["command", "script"]),
        ({"command": []}, "command", ["non-empty"]),
        ({"command": [""]}, "command", ["non-empty"]),
        ({**CMD, "name": "has space"}, "name", ["letters", "digits"]),
        ({**CMD, "name": "x" * 129}, "name", ["1-128"]),
        ({**CMD, "queue": "no/slash"}, "queue", ["letters", "digits"]),
        ({**CMD, "array": {"start": 5, "end": 3}}, "array", ["5", "3"]),
        ({**CMD, "depends": [{"kind": "after", "job_id": 1}]}, "depends.0.kind", ["afterok"]),
        ({**CMD, "depends": [{"kind": "afterok", "job_id": 0}]}, "depends.0.job_id", ["0"]),
    ],
)
def test_bad_spec_names_field_and_allowed_values(
    fields: dict[str, Any], field: str, words: list[str]
) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(**fields)
    err = info.value
    assert err.field == field
    message = str(err)
    assert message.startswith(f"{field}: ")
    for word in words:
        assert word in message
    # one branch of the tree: the CLI reports it as a user mistake, callers may catch ValueError
    assert isinstance(err, UserError)
    assert isinstance(err, ValueError)


def test_unknown_field_is_named_with_the_known_ones() -> None:
    """A typo (``gpumemory``) is rejected, and the message says which fields exist."""
    with pytest.raises(SpecError) as info:
        JobSpec(**CMD, gpumemory="4GiB")
    assert info.value.field == "gpumemory"
    message = str(info.value)
    assert "gpumemory" in message
    # the allowed values of a field *name* are the known names
    assert "gpumem" in message.replace("gpumemory", "")


def test_whole_gpus_with_a_partial_share_names_a_field() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(**CMD, gpus=2, compute_pct=50)
    assert info.value.field in {"gpu", "gpus", "compute_pct"}
    assert "compute_pct" in str(info.value)


def test_several_mistakes_are_all_reported() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(**CMD, kind="gpu", priority=5000)
    assert info.value.field == "kind"
    assert "kind:" in str(info.value)
    assert "priority:" in str(info.value)


def test_assignment_is_validated() -> None:
    spec = JobSpec(**CMD)
    with pytest.raises(ValueError, match="priority"):
        spec.priority = 5000


def test_the_image_is_one_word_of_at_most_512_characters() -> None:
    assert JobSpec(**CMD).image is None
    assert JobSpec(**CMD, image="registry.example.com/ml/train:1.4").image == (
        "registry.example.com/ml/train:1.4"
    )
    assert JobSpec(**CMD, image="i" * 512).image == "i" * 512
    for bad, words in [
        ("", "must not be empty"),
        ("train 1.4", "holds whitespace"),
        ("train\t1", "holds whitespace"),
        ("i" * 513, "at most 512"),
    ]:
        with pytest.raises(SpecError) as caught:
            JobSpec(**CMD, image=bad)
        assert caught.value.field == "image"
        assert words in str(caught.value)


def test_depends_takes_qsubs_text_form_too() -> None:
    """A trial's trap: ``depends=["afterok:3"]`` (the form ``-W depend=`` takes) was
    refused with "Input should be a valid dictionary or instance of Dependency"."""
    spec = JobSpec(
        command=["x"], depends=["afterok:3", "afterany:4:5", {"kind": "afterok", "job_id": 6}]
    )
    assert [(d.kind, d.job_id) for d in spec.depends] == [
        ("afterok", 3),
        ("afterany", 4),
        ("afterany", 5),
        ("afterok", 6),
    ]
    with pytest.raises(ValueError, match="expected KIND:ID\\[:ID\\] like 'afterok:12'"):
        JobSpec(command=["x"], depends=["afterok"])
    with pytest.raises(ValueError, match=r"depends\.0\.kind"):
        JobSpec(command=["x"], depends=["afterwhat:3"])


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"deadline": "2h"}, "deadline: must be at most 3600s, got '2h'"),
        ({"deadline": "0.5s"}, "deadline: must be at least 1s, got '0.5s'"),
        ({"walltime": 0}, "walltime: must be at least 0.1s, got 0"),
        ({"deadline_s": 7200}, "deadline_s: must be at most 3600s, got 7200"),
        ({"priority": 5000}, "priority: must be at most 1023, got 5000"),
    ],
)
def test_a_bound_broken_is_said_as_the_input_was_given(fields: dict[str, Any], says: str) -> None:
    """A trial's trap: the SDK's ``deadline="2h"`` was told ``deadline_s: Input should be
    less than or equal to 3600``, the field it is stored as and pydantic's words."""
    with pytest.raises(SpecError) as caught:
        JobSpec(command=["true"], **fields)
    assert str(caught.value) == says
    assert caught.value.field == says.split(":")[0]


def test_the_raw_gpus_field_is_told_to_use_gpu_not_blamed_on_compute_pct() -> None:
    # (a trial's traps: gpus=2 said "compute_pct: whole GPUs take all their compute",
    # a field the caller never gave; gpus="25%" said only "a valid integer")
    with pytest.raises(SpecError) as caught:
        JobSpec(command=["x"], gpus=2)
    assert caught.value.field == "gpus"
    assert "ask for whole GPUs with gpu=2" in str(caught.value)
    with pytest.raises(SpecError, match=r"gpus: .*; gpu= takes a share of one GPU \(25%"):
        JobSpec(command=["x"], gpus="25%")
    with pytest.raises(SpecError, match="compute_pct: whole GPUs take all their compute"):
        JobSpec(command=["x"], gpus=2, compute_pct=50)  # both given: the old message
    assert JobSpec(command=["x"], gpu=2).gpus == 2
