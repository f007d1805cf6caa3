"""``-l`` lists and clock durations that used to be read as something the user did not mean.

* ``walltime=25:99:00`` was 95940 s: after the first field that is not zero, minutes and
  seconds are 0-59 (and hours after days 0-23).  The first may run past its clock, as
  PBS allows (``25:00:00``, ``90:00``, and ``00:00:60`` in a published PBS Pro script).
* ``gpu=10%,gpu=20%`` ran at 20%, and ``gpu=25%,,gpumem=1GiB`` passed its empty item:
  both are refused by ``parse_resources`` in ``ebbtide/queue/qsub/resources.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.errors import SpecError
from ebbtide.queue.qsub import parse_resources
from ebbtide.queue.spec import JobSpec
from ebbtide.units import parse_duration_s

# ---------------------------------------------------------------- clock durations


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("25:99:00", ["minutes must be 0-59", "'25:99:00'", "99 minutes"]),
        ("1:00:60", ["seconds must be 0-59", "'1:00:60'", "60 seconds"]),
        ("2:60", ["seconds must be 0-59", "60 seconds"]),
        ("1:24:00:00", ["hours must be 0-23", "24 hours"]),
        ("1:02:75:00", ["minutes must be 0-59", "75 minutes"]),
    ],
)
def test_a_clock_field_past_its_range_is_refused(text: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_s(text)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("25:00:00", 90000.0),  # hours past 24, as PBS allows
        ("100:30:00", 361800.0),
        ("90:00", 5400.0),  # MM:SS: the minutes lead
        ("00:00:60", 60.0),  # pbspro_naoj-cfca-gpu.sh, a published script
        ("0:90:00", 5400.0),
        ("02:00:00", 7200.0),
        ("4:0:0", 14400.0),
        ("1:23:59:59.5", 172799.5),
        ("2:00:00:00", 172800.0),
    ],
)
def test_clock_forms_people_write_still_work(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("key", ["walltime", "deadline", "checkpoint_interval"])
def test_every_duration_resource_checks_its_clock_fields(key: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_resources(f"{key}=0:10:99")
    assert str(info.value).startswith(f"-l {key}: seconds must be 0-59")


@pytest.mark.parametrize("key", ["walltime", "deadline", "checkpoint_interval"])
def test_the_sdk_checks_clock_fields_too(key: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(command=["true"], **{key: "0:10:99"})
    assert info.value.field == key
    assert "seconds must be 0-59" in str(info.value)


def _qsub(tmp_path: Path, resources: str) -> tuple[int, str, str]:
    """``ebb qsub -l RESOURCES -- true``, then ``ebb qstat``: (exit code, qsub's stderr,
    qstat's stdout)."""
    env = {"EBBTIDE_HOME": str(tmp_path / "home")}
    runner = CliRunner()
    result = runner.invoke(cli, ["qsub", "-l", resources, "--", "true"], env=env)
    listed = runner.invoke(cli, ["qstat"], env=env)
    assert listed.exit_code == 0, listed.output
    return result.exit_code, result.stderr, listed.stdout


def test_qsub_refuses_a_bad_walltime_in_one_line_and_submits_nothing(tmp_path: Path) -> None:
    code, stderr, listed = _qsub(tmp_path, "walltime=25:99:00")
    assert code != 0
    assert stderr == "ebb: error: -l walltime: minutes must be 0-59 in '25:99:00', got 99 minutes\n"
    assert " true " not in listed


# ---------------------------------------------------------------- -l lists


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu=10%,gpu=20%", "-l: gpu given twice (10% and 20%)"),
        ("gpumem=1GiB,gpu=25%,GPUMEM=2GiB", "-l: gpumem given twice (1GiB and 2GiB)"),
        ("walltime=1h,walltime=1h", "-l: walltime given twice (1h and 1h)"),
    ],
)
def test_a_resource_named_twice_in_one_list_is_refused(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_resources(text)
    assert str(info.value) == message


@pytest.mark.parametrize("text", ["gpu=25%,,gpumem=1GiB", ",gpu=25%", "gpu=25%, ,gpumem=1GiB"])
def test_an_empty_item_is_refused(text: str) -> None:
    with pytest.raises(SpecError, match=r"^-l: .*empty item"):
        parse_resources(text)


@pytest.mark.parametrize("resources", ["gpu=10%,gpu=20%", "gpu=25%,,gpumem=1GiB"])
def test_qsub_refuses_a_bad_list_in_one_line_and_submits_nothing(
    tmp_path: Path, resources: str
) -> None:
    code, stderr, listed = _qsub(tmp_path, resources)
    assert code != 0, listed
    assert stderr.startswith("ebb: error: -l: ") and stderr.count("\n") == 1
    assert " true " not in listed


@pytest.mark.parametrize(
    ("text", "kwargs"),
    [
        ("gpu=25%,", {"gpu": "25%"}),  # one comma at the end is harmless
        ("gpu=25%,ngpus=1", {"gpu": "1"}),  # two names for the GPU request: the last wins
        ("gpu=25%,gpumem=1GiB", {"gpu": "25%", "gpumem": "1GiB"}),
    ],
)
def test_lists_that_stay_accepted(text: str, kwargs: dict[str, str]) -> None:
    assert parse_resources(text) == kwargs


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400.0),
        ("90:30", 5430.0),
        ("100:00:00", 360000.0),
        ("1-23:59:59", 172799.0),
        # the first field that is not zero may run past its clock, as -l walltime's
        ("00:90:00", 5400.0),
        ("0:90", 90.0),
        ("0-36:00:00", 129600.0),
    ],
)
def test_slurm_time_takes_its_forms(text: str, seconds: float) -> None:
    from ebbtide.queue.slurm import slurm_time_s

    assert slurm_time_s(text) == seconds


@pytest.mark.parametrize("text", ["25:99:00", "5:60", "1-24", "1-0:60"])
def test_slurm_time_refuses_a_field_out_of_range(text: str) -> None:
    """As ``-l walltime=25:99:00``: a trial's trap, stored as 95,940 s."""
    from ebbtide.queue.slurm import slurm_time_s

    # the message -l walltime's clock check gives (one rule, units.clock_value)
    with pytest.raises(
        ValueError, match=rf"^(hours|minutes|seconds) must be 0-(23|59) in '{text}'"
    ):
        slurm_time_s(text)
