"""``ebbtide.integrations.lightning``: a Lightning fit warned mid-training checkpoints,
exits 99, and the next attempt resumes from that checkpoint to the very weights of an
uninterrupted run.

The job is ``examples/lightning_train.py`` (a tiny CPU model: two linear layers, SGD with
momentum, a step LR schedule; every step a whole epoch, so the data position is exact),
run by ``tests/fixtures/frameworks/lightning_paced.py``, which pauses it at a chosen
point until the warning arrives.  Skipped unless ``lightning`` and ``torch`` are installed
(the ``lightning`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.framework_jobs import (
    FIXTURES,
    REQUEUE_EXIT_CODE,
    agent_env,
    checkpoints_reported,
    run,
    run_warned,
    status_lines,
    warning_signal,
)
from tests.unit.framework_jobs import skip_without as _skip_without

_skip_without("torch", "lightning", extra="lightning")

PACED = FIXTURES / "lightning_paced.py"
MAX_STEPS = 16
#: The example's flags in every run: validation after steps 10 and (not reached) 20.
EXAMPLE_ARGS = ["--max-steps", str(MAX_STEPS), "--val-every", "10", "--accelerator", "cpu"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same training, never warned: what every resumed run must end with."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    out = directory / "out.json"
    ended = run(
        [str(PACED), "--", *EXAMPLE_ARGS, "--out", str(out)], agent_env(directory), directory
    )
    assert ended.code == 0, ended.output
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["first_step"] == 1 and result["global_step"] == MAX_STEPS
    return result


@pytest.mark.parametrize(
    ("signal_name", "pause_at", "saved_step", "how"),
    [
        # Lightning's own SIGTERM handler (chained to ebbtide's) stops the fit at the end
        # of step 3 with SIGTERMException (exit code 0): on_exception saves, makes it 99
        ("TERM", "train:3", 3, "when Lightning stopped on SIGTERM"),
        # a signal Lightning does not know: the callback's check after step 4
        ("USR1", "train:3", 4, "after a training step"),
        # in the middle of the validation after step 10, by the callback's own check
        ("USR1", "val:10", 10, "during validation"),
    ],
)
def test_warned_fit_resumes_from_its_checkpoint_to_the_same_weights(
    tmp_path: Path,
    uninterrupted: dict[str, Any],
    signal_name: str,
    pause_at: str,
    saved_step: int,
    how: str,
) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = agent_env(tmp_path, EBBTIDE_WARNING_SIGNAL=signal_name)
    ready = tmp_path / "ready"
    first = run_warned(
        [str(PACED), "--pause-at", pause_at, "--ready", str(ready), "--", *EXAMPLE_ARGS],
        env,
        tmp_path,
        ready,
        warning_signal(signal_name),
    )

    # attempt 1: a full checkpoint of the step it stopped at, reported, then exit 99
    assert first.code == REQUEUE_EXIT_CODE, first.output
    assert f"warned {how}: saved" in first.output
    [reported] = checkpoints_reported(tmp_path)
    assert reported == checkpoints / f"ebbtide-step{saved_step}.ckpt"
    assert reported.is_file()
    assert sorted(p.name for p in checkpoints.iterdir()) == [reported.name]  # no temporaries
    progress = [s for s in status_lines(tmp_path) if s["type"] == "progress"]
    assert progress and progress[-1]["total"] == MAX_STEPS
    assert 1 <= progress[-1]["done"] <= saved_step

    # attempt 2: resumes at that step (not at 0) and ends as the uninterrupted run did
    out = tmp_path / "out.json"
    env2 = env | {"EBBTIDE_ATTEMPT": "2", "EBBTIDE_RESUME_FROM": str(reported)}
    second = run([str(PACED), "--", *EXAMPLE_ARGS, "--out", str(out)], env2, tmp_path)
    assert second.code == 0, second.output
    assert f"attempt 2: resumed at step {saved_step}" in second.output
    assert "starts from scratch" not in second.output
    resumed = json.loads(out.read_text())
    assert resumed["first_step"] == saved_step + 1
    assert resumed["global_step"] == MAX_STEPS
    expected_losses = {k: v for k, v in uninterrupted["losses"].items() if int(k) > saved_step}
    assert resumed["losses"] == expected_losses
    assert resumed["weights"] == uninterrupted["weights"]
    results = [s for s in status_lines(tmp_path) if s["type"] == "result"]
    assert results[-1]["value"]["step"] == MAX_STEPS
