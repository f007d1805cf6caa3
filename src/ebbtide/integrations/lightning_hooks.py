"""The Lightning callback's behaviour, shared by ``lightning`` and ``pytorch_lightning``.

It touches the trainer only through its public API (duck-typed), so it imports neither
package; :mod:`ebbtide.integrations.lightning` and
:mod:`ebbtide.integrations.pytorch_lightning` give it the right base class.

When it acts, in a ``trainer.fit``:

* at the end of a training batch that completed an optimizer step (never in the middle
  of gradient accumulation), and at the end of each validation batch while fitting: if
  the warning arrived (on any process), save, report, exit 99;
* in ``on_exception``, when Lightning itself stopped on ``SIGTERM`` (it installs its own
  handler, which chains to ebbtide's, and raises ``SIGTERMException`` at its next check):
  save, report, and turn that exception's exit code (0) into 99;
* not once training is done (``max_steps``, the last batch of ``max_epochs``, early
  stopping): the attempt finishes instead;
* not when no optimizer step was taken since the start (a warning during the sanity
  check): it exits 99 at once and the previous checkpoint stays the latest.

The checkpoint is ``trainer.save_checkpoint`` (model, optimizer, LR schedulers, loops,
callbacks, precision state: what Lightning's own resume restores; Lightning's checkpoints
hold no RNG state) to ``.ebbtide-step{N}.ckpt.tmp`` in the job's checkpoint directory,
then renamed to ``ebbtide-step{N}.ckpt``: Lightning writes through a temporary file of
fsspec's, which may be on another filesystem and is then copied, not renamed, so its own
save is not atomic against a kill at the deadline.  A kill before the rename leaves a
temporary name that nothing resumes from (and the next fit removes), and the previous
checkpoint stays the latest.  Nothing is fsynced (it would eat into the deadline): the
checkpoint survives a kill, not a power loss before the kernel writes it out.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ebbtide.job as job
from ebbtide.integrations.base import PROGRESS_INTERVAL_S, ProgressThrottle, resume_path, say
from ebbtide.queue.spec import REQUEUE_EXIT_CODE

#: The warning-time checkpoints' names: ``ebbtide-step{global_step}.ckpt``.
CHECKPOINT_PREFIX = "ebbtide-step"
CHECKPOINT_SUFFIX = ".ckpt"
#: Warning-time checkpoints kept in the checkpoint directory by default (the newest ones).
DEFAULT_KEEP = 2

_NAME_RE = re.compile(rf"{re.escape(CHECKPOINT_PREFIX)}(\d+){re.escape(CHECKPOINT_SUFFIX)}")
_TMP_GLOB = f".{CHECKPOINT_PREFIX}*{CHECKPOINT_SUFFIX}.tmp"


def last_checkpoint() -> str | None:
    """The checkpoint to pass to ``trainer.fit(ckpt_path=...)``, or ``None`` (start fresh).

    ``EBBTIDE_RESUME_FROM`` when the agent gives it; otherwise (a local run, or an
    attempt whose report was lost) the newest ``ebbtide-step{N}.ckpt`` in
    ``ebbtide.job.checkpoint_dir()``.
    """
    path = resume_path(
        lambda: complete_checkpoints(job.checkpoint_dir()),
        f"{CHECKPOINT_PREFIX}N{CHECKPOINT_SUFFIX} checkpoint",
    )
    return None if path is None else str(path)


def complete_checkpoints(directory: Path) -> list[Path]:
    """The warning-time checkpoints in ``directory``, oldest (lowest step) first."""
    found = []
    for entry in directory.iterdir():
        match = _NAME_RE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry.stat().st_mtime_ns, entry))
    return [entry for *_, entry in sorted(found)]


class LightningHooks:
    """Checkpoint on the eviction warning, requeue (exit 99), report progress.

    Args:
      keep: how many warning-time checkpoints to keep (the newest); older ones are
        deleted once a new one is saved and reported.
      progress_interval_s: least time between two progress reports, in seconds.
      clock: monotonic seconds, for the progress throttle and the save duration.
    """

    #: The exception Lightning raises on ``SIGTERM`` (set by the framework's module).
    _sigterm_exception: type[SystemExit]

    def __init__(
        self,
        *,
        keep: int = DEFAULT_KEEP,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.keep = keep
        self._clock = clock
        self._progress = ProgressThrottle(progress_interval_s, clock)
        self._start_step: int | None = None
        self._last_step: int | None = None
        self._total: float | None = None
        self._requeueing = False

    # ------------------------------------------------------------------------- hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            _remove_temporaries(job.checkpoint_dir())

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start_step = self._last_step = trainer.global_step
        self._total = _total_steps(trainer)
        self._requeueing = False
        if not trainer.is_global_zero:
            return
        if trainer.ckpt_path is not None:
            say(f"attempt {job.attempt()}: resumed at step {trainer.global_step}")
            return
        try:
            found = last_checkpoint()
        except FileNotFoundError:
            found = None
        if found is not None:
            say(
                f"{found} is the checkpoint of an earlier attempt, but fit() starts from "
                "scratch: pass ckpt_path=last_checkpoint() (from "
                "ebbtide.integrations.lightning) to resume from it"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return  # gradients are still accumulating: not a point to save at
        self._last_step = step
        if trainer.is_global_zero:
            self._progress.report(step, self._total)
        if not _training_done(trainer):
            self._requeue_if_warned(trainer, "after a training step")

    def on_validation_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.state.fn == "fit" and not _training_done(trainer):
            self._requeue_if_warned(trainer, "during validation")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._progress.report(trainer.global_step, self._total, force=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._requeueing or not isinstance(exception, self._sigterm_exception):
            return
        if not job.preempted():
            return  # a SIGTERM that is not ebbtide's warning (another warning signal is set)
        self._requeueing = True
        saved = self._save(trainer) if self._trained(trainer) else None
        self._announce(trainer, saved, "when Lightning stopped on SIGTERM")
        exception.code = REQUEUE_EXIT_CODE

    # ---------------------------------------------------------------------- actions

    def _requeue_if_warned(self, trainer: Any, where: str) -> None:
        if not trainer.strategy.reduce_boolean_decision(job.preempted(), all=False):
            return
        self._requeueing = True
        saved = self._save(trainer) if self._trained(trainer) else None
        self._announce(trainer, saved, where)
        job.requeue()

    def _trained(self, trainer: Any) -> bool:
        """Whether an optimizer step was taken since this fit started or resumed."""
        return self._start_step is not None and trainer.global_step > self._start_step

    def _save(self, trainer: Any) -> Path:
        """Save a full checkpoint atomically (temporary name, then a rename), report it."""
        started = self._clock()
        directory = job.checkpoint_dir()
        final = directory / f"{CHECKPOINT_PREFIX}{trainer.global_step}{CHECKPOINT_SUFFIX}"
        tmp = directory / f".{final.name}.tmp"
        if trainer.is_global_zero:
            _remove(tmp)
        trainer.strategy.barrier("ebbtide-save-start")
        trainer.save_checkpoint(tmp)  # every process: a sharded strategy saves collectively
        if trainer.is_global_zero:
            _replace(tmp, final)
            job.checkpointed(final, duration_s=self._clock() - started)
            for old in complete_checkpoints(directory)[: -self.keep]:
                if old != final:
                    _remove(old)
        trainer.strategy.barrier("ebbtide-save-end")
        return final

    def _announce(self, trainer: Any, saved: Path | None, where: str) -> None:
        if not trainer.is_global_zero:
            return
        if saved is None:
            say(
                f"warned {where}, before any step of this attempt: requeueing; "
                "the previous checkpoint stays the latest"
            )
        else:
            say(f"warned {where}: saved {saved} at step {trainer.global_step}, requeueing")


# -------------------------------------------------------------------------- helpers


def _total_steps(trainer: Any) -> float | None:
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        return float(trainer.max_steps)
    try:
        total = float(trainer.estimated_stepping_batches)
    except Exception:  # an estimate only: progress is reported without a total then
        return None
    return total if math.isfinite(total) else None


def _training_done(trainer: Any) -> bool:
    """Whether this fit stops after the current step anyway."""
    if trainer.should_stop:
        return True
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return True
    max_epochs = trainer.max_epochs
    return (
        bool(trainer.is_last_batch)
        and max_epochs is not None
        and max_epochs >= 0
        and trainer.current_epoch + 1 >= max_epochs
    )


def _replace(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; a directory (a sharded checkpoint) replaces one too."""
    if final.is_dir() and not final.is_symlink():
        aside = final.with_name(f".{final.name}.old")
        _remove(aside)
        os.replace(final, aside)
        os.replace(tmp, final)
        _remove(aside)
    else:
        os.replace(tmp, final)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_temporaries(directory: Path) -> None:
    """Clean up after saves killed before their rename: remove the temporary names, and
    put back a checkpoint directory that was set aside to be replaced."""
    for leftover in directory.glob(_TMP_GLOB):
        _remove(leftover)
    for aside in directory.glob(f".{CHECKPOINT_PREFIX}*{CHECKPOINT_SUFFIX}.old"):
        original = aside.with_name(aside.name[1 : -len(".old")])
        if original.exists():
            _remove(aside)
        else:
            os.replace(aside, original)
