"""Train a tiny regression model with PyTorch Lightning, resumably, under ebbtide.

Needs ``pip install 'ebbtide[lightning]'`` (the CPU is enough).  Submit it with::

    ebb qsub -N tiny-lightning -- python examples/lightning_train.py --max-steps 2000

The three lines that make a Lightning script evictable and resumable::

    from ebbtide.integrations.lightning import EbbtideCallback, last_checkpoint

    trainer = L.Trainer(..., callbacks=[EbbtideCallback()])
    trainer.fit(model, data, ckpt_path=last_checkpoint())

On the eviction warning the callback saves ``ebbtide-step{N}.ckpt`` in the job's
checkpoint directory at the end of the current step (or validation batch) and exits 99;
the next attempt's ``last_checkpoint()`` is that file, and ``fit`` goes on from step N
with the model, optimizer and LR scheduler as they were.  Locally, stop it with
``kill -TERM`` and run it again: it resumes from ``./.ebbtide-checkpoints``.

Lightning resumes the position in an epoch's data only for a dataloader with
``state_dict``/``load_state_dict`` (e.g. ``torchdata``'s ``StatefulDataLoader``); with a
plain ``DataLoader`` a checkpoint from the middle of an epoch replays that epoch from its
first batch (Lightning warns).  With ``--batch-size`` equal to ``--samples`` (the default)
every step is a whole epoch, so a resumed run ends with exactly the weights of an
uninterrupted one.

Flags: ``--max-steps`` (40), ``--samples`` (64), ``--batch-size`` (64), ``--lr`` (0.05),
``--seed`` (0), ``--val-every`` steps between validations (10), ``--step-s`` seconds to
sleep in each step, to watch a warning land (0), ``--accelerator`` (auto), ``--out`` a
JSON file for the steps run, their losses and the final weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ebbtide.job as job
from ebbtide.integrations.lightning import EbbtideCallback, last_checkpoint

FEATURES = 8


class TinyRegressor(L.LightningModule):
    """Two linear layers, SGD with momentum, a step LR schedule: state worth resuming."""

    def __init__(self, lr: float, step_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.lr = lr
        self.step_s = step_s
        self.losses: dict[int, float] = {}  # global step (1-based) -> training loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step + 1] = loss.item()
        if self.step_s:
            time.sleep(self.step_s)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def dataset(samples: int, seed: int) -> TensorDataset:
    """``y = x·w + noise`` for a fixed ``w``: the same data on every attempt."""
    rng = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=rng)
    w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(samples, 1, generator=rng))


def main(argv: Sequence[str] | None = None, extra_callbacks: Sequence[Any] = ()) -> int:
    parser = argparse.ArgumentParser(description="Train a tiny model with Lightning.")
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps in all")
    parser.add_argument("--samples", type=int, default=64, help="training examples")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parser.add_argument("--val-every", type=int, default=10, help="steps between validations")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--accelerator", default="auto", help="cpu, gpu, auto")
    parser.add_argument("--out", type=Path, help="write steps, losses and weights here")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)  # the initial weights; a resumed run loads them instead
    model = TinyRegressor(args.lr, args.step_s)
    train = DataLoader(dataset(args.samples, args.seed), batch_size=args.batch_size)
    val = DataLoader(dataset(24, args.seed + 1), batch_size=8)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        max_epochs=-1,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,  # validate every --val-every steps, across epochs
        accelerator=args.accelerator,
        devices=1,
        callbacks=[EbbtideCallback(), *extra_callbacks],
        enable_checkpointing=False,  # periodic checkpoints: add a ModelCheckpoint if wanted
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, train, val, ckpt_path=last_checkpoint())

    first = min(model.losses, default=None)
    print(f"attempt {job.attempt()}: steps {first}..{trainer.global_step} done", flush=True)
    final_loss = model.losses.get(trainer.global_step)
    job.result({"step": trainer.global_step, "loss": final_loss})
    if args.out is not None:
        out = {
            "first_step": first,
            "global_step": trainer.global_step,
            "losses": {str(k): v for k, v in sorted(model.losses.items())},
            "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        }
        args.out.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
