"""The framework callbacks' decisions, without a framework: ``LightningHooks`` driven by
a stand-in trainer (it only uses the trainer's public attributes), ``resume_path`` and
``ProgressThrottle``.  These run everywhere; the real Lightning and Hugging Face runs are
in ``test_integrations_lightning.py`` and ``test_integrations_transformers.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import ebbtide.job as job
from ebbtide.integrations.base import ProgressThrottle, resume_path
from ebbtide.integrations.lightning_hooks import (
    LightningHooks,
    complete_checkpoints,
    last_checkpoint,
)

REQUEUE_EXIT_CODE = 99


class FakeSIGTERMException(SystemExit):
    """Stands in for ``lightning.pytorch.utilities.exceptions.SIGTERMException``."""


class Hooks(LightningHooks):
    _sigterm_exception = FakeSIGTERMException


class FakeStrategy:
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision

    def barrier(self, name: str | None = None) -> None:
        pass


@dataclass
class FakeTrainer:
    global_step: int = 0
    max_steps: int = 100
    max_epochs: int | None = None
    current_epoch: int = 0
    is_last_batch: bool = False
    should_stop: bool = False
    is_global_zero: bool = True
    ckpt_path: str | None = None
    estimated_stepping_batches: float = 100.0
    strategy: FakeStrategy = field(default_factory=FakeStrategy)
    state: Any = field(default_factory=lambda: SimpleNamespace(fn="fit"))
    saved_to: list[Path] = field(default_factory=list)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.saved_to.append(Path(path))
        Path(path).write_text(f"step {self.global_step}")

    def step(self, hooks: LightningHooks, n: int = 1) -> None:
        """``n`` training batches, each ending an optimizer step."""
        for _ in range(n):
            self.global_step += 1
            hooks.on_train_batch_end(self, None, None, None, 0)


@pytest.fixture
def ckpt_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    monkeypatch.setenv("EBBTIDE_CHECKPOINT_DIR", str(directory))
    monkeypatch.setenv("EBBTIDE_STATUS_FILE", str(tmp_path / "status.jsonl"))
    monkeypatch.delenv("EBBTIDE_RESUME_FROM", raising=False)
    monkeypatch.setattr(job, "_warned", False)
    return directory


def warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job, "_warned", True)


def status(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    path = tmp_path / "status.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["type"] == kind]


def started(trainer: FakeTrainer, **kwargs: Any) -> Hooks:
    hooks = Hooks(progress_interval_s=0, **kwargs)
    hooks.setup(trainer, None, "fit")
    hooks.on_train_start(trainer, None)
    return hooks


def test_a_warning_saves_atomically_reports_and_requeues_after_the_step(
    ckpt_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks, 2)
    assert [p["done"] for p in status(tmp_path, "progress")] == [1.0, 2.0]
    assert not trainer.saved_to

    warn(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        trainer.step(hooks)
    assert ended.value.code == REQUEUE_EXIT_CODE
    final = ckpt_dir / "ebbtide-step3.ckpt"
    assert trainer.saved_to == [ckpt_dir / ".ebbtide-step3.ckpt.tmp"]  # then renamed
    assert final.read_text() == "step 3"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["ebbtide-step3.ckpt"]
    [line] = status(tmp_path, "checkpoint")
    assert line["path"] == str(final) and line["size_bytes"] == len("step 3")
    assert line["duration_s"] >= 0


def test_no_save_in_the_middle_of_gradient_accumulation(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks)
    warn(monkeypatch)
    hooks.on_train_batch_end(trainer, None, None, None, 1)  # global_step unchanged
    assert not trainer.saved_to
    with pytest.raises(SystemExit):
        trainer.step(hooks)
    assert trainer.saved_to == [ckpt_dir / ".ebbtide-step2.ckpt.tmp"]


def test_a_warning_before_any_step_requeues_and_keeps_the_previous_checkpoint(
    ckpt_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer(global_step=7, ckpt_path=str(ckpt_dir / "ebbtide-step7.ckpt"))
    hooks = started(trainer)
    warn(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        hooks.on_validation_batch_end(trainer, None, None, None, 0)
    assert ended.value.code == REQUEUE_EXIT_CODE
    assert not trainer.saved_to
    assert not status(tmp_path, "checkpoint")


@pytest.mark.parametrize(
    "done",
    [
        {"global_step": 99, "max_steps": 100},  # the next step is the last
        {"max_steps": -1, "max_epochs": 3, "current_epoch": 2, "is_last_batch": True},
        {"should_stop": True},  # early stopping
    ],
)
def test_no_requeue_once_training_is_done(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch, done: dict[str, Any]
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    for name, value in done.items():
        setattr(trainer, name, value)
    warn(monkeypatch)
    trainer.step(hooks)
    hooks.on_validation_batch_end(trainer, None, None, None, 0)
    assert not trainer.saved_to


def test_validation_outside_fit_is_left_alone(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks)
    trainer.state = SimpleNamespace(fn="validate")
    warn(monkeypatch)
    hooks.on_validation_batch_end(trainer, None, None, None, 0)
    assert not trainer.saved_to


def test_lightnings_own_sigterm_stop_becomes_a_requeue(
    ckpt_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks, 4)
    warn(monkeypatch)
    stop = FakeSIGTERMException()  # Lightning's: exit code None, i.e. 0
    hooks.on_exception(trainer, None, stop)
    assert stop.code == REQUEUE_EXIT_CODE
    assert (ckpt_dir / "ebbtide-step4.ckpt").is_file()
    assert [Path(c["path"]).name for c in status(tmp_path, "checkpoint")] == ["ebbtide-step4.ckpt"]


def test_other_exceptions_and_unwarned_sigterms_are_left_alone(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks, 2)
    unwarned = FakeSIGTERMException()
    hooks.on_exception(trainer, None, unwarned)  # SIGTERM, but USR1 is the warning
    assert unwarned.code is None
    warn(monkeypatch)
    hooks.on_exception(trainer, None, RuntimeError("boom"))
    hooks.on_exception(trainer, None, SystemExit(3))
    assert not trainer.saved_to


def test_our_own_requeue_is_not_saved_twice(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    hooks = started(trainer)
    trainer.step(hooks)
    warn(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        trainer.step(hooks)
    hooks.on_exception(trainer, None, ended.value)  # Lightning passes it to on_exception
    assert len(trainer.saved_to) == 1


def test_only_the_newest_checkpoints_are_kept(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = FakeTrainer()
    for steps in (3, 9, 12):  # three attempts, each warned
        monkeypatch.setattr(job, "_warned", False)
        hooks = started(trainer, keep=2)
        trainer.global_step = steps - 1
        hooks.on_train_start(trainer, None)
        warn(monkeypatch)
        with pytest.raises(SystemExit):
            trainer.step(hooks)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [
        "ebbtide-step12.ckpt",
        "ebbtide-step9.ckpt",
    ]


def test_setup_cleans_up_after_a_save_killed_before_its_rename(ckpt_dir: Path) -> None:
    (ckpt_dir / ".ebbtide-step5.ckpt.tmp").write_text("half")
    aside = ckpt_dir / ".ebbtide-step4.ckpt.old"  # a sharded checkpoint set aside
    aside.mkdir()
    (aside / "shard-0").write_text("whole")
    Hooks().setup(FakeTrainer(), None, "fit")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["ebbtide-step4.ckpt"]
    assert (ckpt_dir / "ebbtide-step4.ckpt" / "shard-0").read_text() == "whole"


def test_a_sharded_checkpoint_directory_replaces_one_of_the_same_step(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ShardedTrainer(FakeTrainer):
        def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
            self.saved_to.append(Path(path))
            Path(path).mkdir()
            (Path(path) / "shard-0").write_text(f"step {self.global_step}")

    old = ckpt_dir / "ebbtide-step2.ckpt"
    old.mkdir()
    (old / "stale").write_text("")
    trainer = ShardedTrainer(global_step=1)
    hooks = started(trainer)
    warn(monkeypatch)
    with pytest.raises(SystemExit):
        trainer.step(hooks)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["ebbtide-step2.ckpt"]
    assert sorted(p.name for p in old.iterdir()) == ["shard-0"]


def test_last_checkpoint_prefers_the_agents_then_the_newest_on_disk(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert last_checkpoint() is None
    for step in (9, 10, 2):
        (ckpt_dir / f"ebbtide-step{step}.ckpt").write_text("")
    (ckpt_dir / ".ebbtide-step11.ckpt.tmp").write_text("")  # never a candidate
    assert [p.name for p in complete_checkpoints(ckpt_dir)] == [
        "ebbtide-step2.ckpt",
        "ebbtide-step9.ckpt",
        "ebbtide-step10.ckpt",
    ]
    assert last_checkpoint() == str(ckpt_dir / "ebbtide-step10.ckpt")
    monkeypatch.setenv("EBBTIDE_RESUME_FROM", str(ckpt_dir / "ebbtide-step9.ckpt"))
    assert last_checkpoint() == str(ckpt_dir / "ebbtide-step9.ckpt")


def test_a_lost_resume_path_falls_back_to_the_newest_on_disk_or_fails(
    ckpt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EBBTIDE_RESUME_FROM", str(ckpt_dir / "ebbtide-step5.ckpt"))
    with pytest.raises(FileNotFoundError, match="storage every node sees"):
        last_checkpoint()
    (ckpt_dir / "ebbtide-step4.ckpt").write_text("")
    with pytest.warns(UserWarning, match="does not exist; resuming from the newest"):
        assert last_checkpoint() == str(ckpt_dir / "ebbtide-step4.ckpt")


def test_resume_path_without_the_agent_takes_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EBBTIDE_RESUME_FROM", raising=False)
    assert resume_path(lambda: [], "checkpoint") is None
    assert resume_path(lambda: [tmp_path / "a", tmp_path / "b"], "checkpoint") == tmp_path / "b"


def test_progress_is_throttled_but_the_last_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EBBTIDE_STATUS_FILE", str(tmp_path / "status.jsonl"))
    now = [0.0]
    throttle = ProgressThrottle(interval_s=1.0, clock=lambda: now[0])
    for step in range(1, 6):
        throttle.report(step, 5)
        now[0] += 0.4
    throttle.report(5, 5, force=True)  # the end of training
    throttle.report(5, 5, force=True)  # the same as the last report: not repeated
    assert [(p["done"], p["total"]) for p in status(tmp_path, "progress")] == [
        (1.0, 5.0),
        (4.0, 5.0),  # 1.2 s after the first
        (5.0, 5.0),
    ]
    with pytest.raises(ValueError, match="progress_interval_s"):
        ProgressThrottle(interval_s=-1)


def test_the_log_says_when_a_checkpoint_is_resumed_or_left_unused(
    ckpt_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ckpt_dir / "ebbtide-step6.ckpt").write_text("")
    started(FakeTrainer())  # fit() without ckpt_path
    assert "ebbtide-step6.ckpt is the checkpoint of an earlier attempt, but fit() starts" in (
        capsys.readouterr().err
    )
    started(FakeTrainer(global_step=6, ckpt_path=str(ckpt_dir / "ebbtide-step6.ckpt")))
    assert "resumed at step 6" in capsys.readouterr().err


def test_importing_the_shared_parts_imports_no_framework() -> None:
    code = (
        "import sys, ebbtide.integrations, ebbtide.integrations.lightning_hooks; "
        "heavy = {'torch', 'lightning', 'pytorch_lightning', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
