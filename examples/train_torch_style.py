"""A PyTorch-style training loop whose "framework" writes its own checkpoint files.

Submit it with::

    ebb qsub -N fit-line -- python examples/train_torch_style.py --steps 2000

It does not import torch: the model is a line ``y = w·x + b`` fitted by SGD with
momentum in pure Python, so the example runs anywhere.  What it shows is the file-based
half of ``ebbtide.job``, the one to use with ``torch.save``, Lightning, DeepSpeed or
Hugging Face checkpoints:

* checkpoints are ``ckpt-{step}.json`` files in ``job.checkpoint_dir()``, written to a
  temporary name and renamed (as ``torch.save(..., tmp); os.replace(tmp, path)`` would),
  and reported with ``job.checkpointed(path)``; only the newest ``--keep`` are kept;
* a resumed attempt loads ``job.resume_from()`` (locally: the newest ``ckpt-*.json``);
* on the eviction warning it saves once more and calls ``job.requeue()``.

Each batch is drawn from a generator seeded by the step number, so a resumed run
produces exactly the parameters an uninterrupted one would.

Flags: ``--steps`` (default 500), ``--save-every`` steps (100), ``--step-s`` seconds
per step (0.01), ``--lr`` (0.05), ``--batch-size`` (32), ``--keep`` (2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import ebbtide.job as job

TRUE_W, TRUE_B = 3.0, -2.0


def batch(step: int, size: int) -> list[tuple[float, float]]:
    """The training batch of one step: the same on every attempt."""
    rng = random.Random(step)
    xs = [rng.uniform(-1, 1) for _ in range(size)]
    return [(x, TRUE_W * x + TRUE_B + rng.gauss(0, 0.1)) for x in xs]


def train_step(model: dict[str, Any], data: list[tuple[float, float]], lr: float) -> float:
    """One SGD-with-momentum step on mean squared error; returns the loss."""
    w, b = model["w"], model["b"]
    errors = [(w * x + b - y, x) for x, y in data]
    loss = sum(e * e for e, _ in errors) / len(errors)
    grad_w = sum(2 * e * x for e, x in errors) / len(errors)
    grad_b = sum(2 * e for e, _ in errors) / len(errors)
    model["mw"] = 0.9 * model["mw"] + grad_w
    model["mb"] = 0.9 * model["mb"] + grad_b
    model["w"] -= lr * model["mw"]
    model["b"] -= lr * model["mb"]
    return loss


def save(model: dict[str, Any], step: int, keep: int) -> Path:
    """Write ``ckpt-{step}.json`` atomically, report it, and prune older checkpoints."""
    started = time.monotonic()
    directory = job.checkpoint_dir()
    path = directory / f"ckpt-{step}.json"
    tmp = directory / f".{path.name}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "model": model}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    job.checkpointed(path, duration_s=time.monotonic() - started)
    for old in sorted(directory.glob("ckpt-*.json"), key=_step_of)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load() -> tuple[dict[str, Any], int]:
    """The model and step to start from: the given checkpoint, the newest, or fresh."""
    path = job.resume_from()
    if path is None:
        found = sorted(job.checkpoint_dir().glob("ckpt-*.json"), key=_step_of)
        path = found[-1] if found else None
    if path is None:
        return {"w": 0.0, "b": 0.0, "mw": 0.0, "mb": 0.0}, 0
    saved = json.loads(path.read_text())
    return saved["model"], saved["step"]


def _step_of(path: Path) -> int:
    return int(path.stem.removeprefix("ckpt-"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fit a line, PyTorch-style, resumably.")
    parser.add_argument("--steps", type=int, default=500, help="training steps in all")
    parser.add_argument("--save-every", type=int, default=100, help="steps between saves")
    parser.add_argument("--step-s", type=float, default=0.01, help="seconds per step")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--batch-size", type=int, default=32, help="examples per step")
    parser.add_argument("--keep", type=int, default=2, help="checkpoints to keep")
    args = parser.parse_args(argv)

    model, step = load()
    print(f"attempt {job.attempt()}: starting at step {step} of {args.steps}", flush=True)
    loss = float("nan")
    while step < args.steps:
        loss = train_step(model, batch(step, args.batch_size), args.lr)
        time.sleep(args.step_s)
        step += 1
        saved = step % args.save_every == 0
        if saved:
            save(model, step, args.keep)
            job.progress(step, args.steps)
        if step < args.steps and job.preempted():
            if not saved:
                save(model, step, args.keep)
            print(f"warned at step {step}: saved, requeueing", flush=True)
            job.requeue()

    print(f"done: step {step}, w={model['w']:.3f} b={model['b']:.3f} loss={loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
