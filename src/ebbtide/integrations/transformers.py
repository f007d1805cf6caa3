"""A Hugging Face ``Trainer`` callback: checkpoint on the eviction warning, exit 99, resume.

Needs ``transformers`` (``pip install 'ebbtide[transformers]'``)::

    from ebbtide.integrations.transformers import EbbtideCallback, last_checkpoint

    args = TrainingArguments(output_dir=str(ebbtide.job.checkpoint_dir()), ...)
    trainer = Trainer(model, args, ..., callbacks=[EbbtideCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

On the warning (seen on any process) the callback asks the Trainer, at the end of the
current optimizer step, for a checkpoint the documented way (``control.should_save``;
``should_evaluate`` off, so that an evaluation due at that step does not eat the
deadline; ``should_training_stop`` on): ``output_dir/checkpoint-{step}`` with the model,
optimizer, scheduler, scaler, RNG states and trainer state, everything
``train(resume_from_checkpoint=...)`` restores, including the position in the epoch's
data.  In ``on_save``, once the Trainer has written it, the callback reports it and
exits 99, before anything after ``train()`` in the script runs.  A periodic save that
completes after the warning arrived is used the same way.

A warning during an evaluation takes effect at the end of the next training step (the
Trainer has no point to save at inside an evaluation): keep evaluations shorter than
the eviction deadline.  Once training is done (``max_steps``), the attempt finishes
instead.

Atomicity: the Trainer writes ``checkpoint-{step}`` in place, not under a temporary
name.  A kill at the deadline in the middle of it leaves a folder the callback never
reported; :func:`last_checkpoint` takes only folders whose ``trainer_state.json``, the
last file the Trainer writes, is complete, so it resumes from the previous checkpoint.
(``transformers.trainer_utils.get_last_checkpoint`` would take the damaged folder.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

import ebbtide.job as job
from ebbtide.integrations.base import PROGRESS_INTERVAL_S, ProgressThrottle, resume_path, say

__all__ = ["EbbtideCallback", "complete_checkpoints", "last_checkpoint"]

#: The Trainer's checkpoint folders: ``checkpoint-{global_step}``
#: (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``).
CHECKPOINT_PREFIX = "checkpoint-"
#: The file the Trainer writes last into a checkpoint folder.
TRAINER_STATE_NAME = "trainer_state.json"


def last_checkpoint(output_dir: str | Path | None = None) -> str | None:
    """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)``, or
    ``None`` (start fresh).

    ``EBBTIDE_RESUME_FROM`` when the agent gives it; otherwise (a local run, or an
    attempt whose report was lost) the newest complete ``checkpoint-{N}`` folder in
    ``output_dir`` (default: ``ebbtide.job.checkpoint_dir()``).
    """
    directory = Path(output_dir) if output_dir is not None else job.checkpoint_dir()
    path = resume_path(
        lambda: complete_checkpoints(directory), f"complete {CHECKPOINT_PREFIX}N folder"
    )
    return None if path is None else str(path)


def complete_checkpoints(directory: Path) -> list[Path]:
    """The complete ``checkpoint-{N}`` folders in ``directory``, oldest (lowest N) first:
    those whose ``trainer_state.json`` parses and names step N."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.glob(f"{CHECKPOINT_PREFIX}*"):
        step = entry.name.removeprefix(CHECKPOINT_PREFIX)
        if step.isdigit() and _global_step(entry / TRAINER_STATE_NAME) == int(step):
            found.append((int(step), entry))
    return [entry for _, entry in sorted(found)]


class EbbtideCallback(TrainerCallback):
    """On ebbtide's eviction warning: save a full checkpoint at the end of the current
    optimizer step, report it, exit 99 (requeue).  Reports progress (``global_step`` of
    ``max_steps``).

    Args:
      progress_interval_s: least time between two progress reports, in seconds.
      clock: monotonic seconds, for the progress throttle and the save duration.
    """

    def __init__(
        self,
        *,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._progress = ProgressThrottle(progress_interval_s, clock)
        self._stopping = False
        self._asked_at: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stopping = False
        self._asked_at = None
        if not state.is_world_process_zero:
            return
        if args.save_only_model:
            say(
                "save_only_model=True: the warning-time checkpoint holds no optimizer or "
                "scheduler state, so a resumed attempt restarts them"
            )
        if state.global_step > 0:
            say(f"attempt {job.attempt()}: resumed at step {state.global_step}")
            return
        try:
            found = last_checkpoint(args.output_dir)
        except FileNotFoundError:
            found = None
        if found is not None:
            say(
                f"{found} is the checkpoint of an earlier attempt, but train() starts from "
                "scratch: pass resume_from_checkpoint=ebbtide.integrations.transformers."
                "last_checkpoint(args.output_dir) to resume from it"
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._progress.report(state.global_step, state.max_steps or None)
        if self._stopping or state.global_step >= state.max_steps:
            return
        if not _any_process(job.preempted(), args):
            return
        self._stopping = True
        self._asked_at = self._clock()
        control.should_save = True
        control.should_evaluate = False
        control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._stopping:
            if state.global_step >= state.max_steps:
                return
            if not _any_process(job.preempted(), args):
                return  # a periodic save, no warning: the framework's business
        path = Path(args.output_dir).absolute() / f"{CHECKPOINT_PREFIX}{state.global_step}"
        if state.is_world_process_zero:
            duration = None if self._asked_at is None else self._clock() - self._asked_at
            job.checkpointed(path, duration_s=duration)
            say(f"warned: saved {path} at step {state.global_step}, requeueing")
        job.requeue()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:
            # asked for a save that did not happen (another callback cancelled it)
            if state.is_world_process_zero:
                say("warned, but the Trainer saved no checkpoint: requeueing without one")
            job.requeue()
        if state.is_world_process_zero:
            self._progress.report(state.global_step, state.max_steps or None, force=True)


def _any_process(flag: bool, args: Any) -> bool:
    """``flag`` or'ed over all processes of a distributed run (they must agree to save)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    votes = torch.tensor([1 if flag else 0], device=args.device)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return bool(votes.item())


def _global_step(state_file: Path) -> int | None:
    try:
        step = json.loads(state_file.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None
