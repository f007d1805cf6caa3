"""``ebbtide.integrations.transformers``: a ``Trainer`` warned in the middle of an epoch
checkpoints at the end of the step, exits 99, and the next attempt resumes from that
checkpoint to the very losses and weights of an uninterrupted run.

The job is ``examples/hf_train.py`` (a tiny CPU model: two linear layers, AdamW, a linear
LR schedule, shuffled batches of 16 from 64 examples), run by
``tests/fixtures/frameworks/hf_paced.py``, which pauses it after a chosen step until the
warning arrives.  Skipped unless ``transformers``, ``accelerate`` and ``torch`` are
installed (the ``transformers`` extra).
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

_skip_without("torch", "transformers", "accelerate", extra="transformers")

PACED = FIXTURES / "hf_paced.py"
MAX_STEPS = 16
EXAMPLE_ARGS = ["--max-steps", str(MAX_STEPS), "--cpu"]
#: Paused after this step, warned there: the callback saves at the end of the next one
#: (the second step of the second epoch).
PAUSE_AT = 5


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same training, never warned: what the resumed run must end with."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    out = directory / "out.json"
    ended = run(
        [str(PACED), "--", *EXAMPLE_ARGS, "--out", str(out)], agent_env(directory), directory
    )
    assert ended.code == 0, ended.output
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["first_step"] == 1 and result["global_step"] == MAX_STEPS
    return result


def test_warned_train_resumes_from_its_checkpoint_to_the_same_weights(
    tmp_path: Path, uninterrupted: dict[str, Any]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = agent_env(tmp_path)
    ready = tmp_path / "ready"
    first = run_warned(
        [str(PACED), "--pause-at", str(PAUSE_AT), "--ready", str(ready), "--", *EXAMPLE_ARGS],
        env,
        tmp_path,
        ready,
        warning_signal("TERM"),
    )

    # attempt 1: the Trainer's full checkpoint of the next step, reported, then exit 99
    saved_step = PAUSE_AT + 1
    assert first.code == REQUEUE_EXIT_CODE, first.output
    assert "warned: saved" in first.output
    assert "attempt 1: steps" not in first.output  # nothing after train() ran
    [reported] = checkpoints_reported(tmp_path)
    assert reported == checkpoints / f"checkpoint-{saved_step}"
    saved = sorted(p.name for p in reported.iterdir())
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert name in saved
    progress = [s for s in status_lines(tmp_path) if s["type"] == "progress"]
    assert progress and progress[-1]["total"] == MAX_STEPS

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


def test_last_checkpoint_skips_folders_a_kill_left_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ebbtide.integrations.transformers import complete_checkpoints, last_checkpoint

    monkeypatch.delenv("EBBTIDE_RESUME_FROM", raising=False)
    for step, state in [
        (3, '{"global_step": 3}'),
        (10, '{"global_step": 10}'),
        (11, '{"global_step": 1'),  # killed while writing trainer_state.json
        (12, None),  # killed before it
        (13, '{"global_step": 7}'),  # not this folder's
    ]:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_text("")
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-final").mkdir()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-10"]
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    monkeypatch.setenv("EBBTIDE_RESUME_FROM", str(tmp_path / "checkpoint-3"))
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    assert complete_checkpoints(tmp_path / "missing") == []
