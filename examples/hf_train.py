"""Train a tiny model with the Hugging Face ``Trainer``, resumably, under ebbtide.

Needs ``pip install 'ebbtide[transformers]'`` (the CPU is enough).  Submit it with::

    ebb qsub -N tiny-hf -- python examples/hf_train.py --max-steps 2000

The lines that make a ``Trainer`` script evictable and resumable::

    from ebbtide.integrations.transformers import EbbtideCallback, last_checkpoint

    args = TrainingArguments(output_dir=str(job.checkpoint_dir()), ...)
    trainer = Trainer(model, args, ..., callbacks=[EbbtideCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

On the eviction warning the callback has the Trainer save ``checkpoint-{N}`` in the job's
checkpoint directory at the end of the current step and exits 99; the next attempt's
``last_checkpoint()`` is that folder, and ``train`` goes on from step N with the model,
optimizer, scheduler, RNG states and the position in the epoch's data as they were, so
it ends with the weights an uninterrupted run would have.  Locally, stop it with
``kill -TERM`` and run it again: it resumes from ``./.ebbtide-checkpoints``.

The model is a plain ``torch.nn.Module`` (two linear layers) whose ``forward`` returns
``{"loss", "logits"}``, as a ``transformers`` model does; nothing is downloaded.

Flags: ``--max-steps`` (40), ``--samples`` (64), ``--batch-size`` (16), ``--lr`` (0.01),
``--seed`` (0), ``--step-s`` seconds to sleep in each step, to watch a warning land (0),
``--cpu`` (train on the CPU even with a GPU), ``--out`` a JSON file for the steps run,
their losses and the final weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

import ebbtide.job as job
from ebbtide.integrations.transformers import EbbtideCallback, last_checkpoint

FEATURES = 8


class TinyRegressor(nn.Module):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.step_s = step_s

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.net(x)
        out: dict[str, Any] = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.mse_loss(logits, labels)
            if self.step_s and self.training:
                time.sleep(self.step_s)
        return out


class Regression(Dataset[dict[str, torch.Tensor]]):
    """``y = x·w + noise`` for a fixed ``w``: the same data on every attempt."""

    def __init__(self, samples: int, seed: int) -> None:
        rng = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, FEATURES, generator=rng)
        w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
        self.y = self.x @ w + 0.1 * torch.randn(samples, 1, generator=rng)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def main(argv: Sequence[str] | None = None, extra_callbacks: Sequence[Any] = ()) -> int:
    parser = argparse.ArgumentParser(description="Train a tiny model with the HF Trainer.")
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps in all")
    parser.add_argument("--samples", type=int, default=64, help="training examples")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per step")
    parser.add_argument("--lr", type=float, default=0.01, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--out", type=Path, help="write steps, losses and weights here")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)  # the initial weights; a resumed run loads them instead
    model = TinyRegressor(args.step_s)
    training_args = TrainingArguments(
        output_dir=str(job.checkpoint_dir()),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        seed=args.seed,
        use_cpu=args.cpu,
        save_strategy="no",  # periodic checkpoints: "steps" and save_steps if wanted
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Regression(args.samples, args.seed),
        callbacks=[EbbtideCallback(), *extra_callbacks],
    )
    resume = last_checkpoint(training_args.output_dir)
    trainer.train(resume_from_checkpoint=resume)

    start = int(Path(resume).name.removeprefix("checkpoint-")) if resume else 0
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    losses = {step: loss for step, loss in losses.items() if step > start}
    step = trainer.state.global_step
    print(f"attempt {job.attempt()}: steps {start + 1}..{step} done", flush=True)
    job.result({"step": step, "loss": losses.get(step)})
    if args.out is not None:
        out = {
            "first_step": start + 1,
            "global_step": step,
            "losses": {str(k): v for k, v in sorted(losses.items())},
            "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        }
        args.out.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
