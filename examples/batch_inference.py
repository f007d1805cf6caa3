"""Batch inference over shards, as an array job that survives evictions.

Submit one task per shard with::

    ebb qsub -N embed -J 0-3 -- python examples/batch_inference.py --shards 4

Each array task takes its shard from ``EBBTIDE_ARRAY_INDEX`` (via ``job.array_index()``;
the index is taken modulo ``--shards``, so ``-J 1-4`` works as well as ``-J 0-3``).
Outside an array, ``--shard`` picks it.

The shard's items are processed in fixed batches.  Each batch's results go to their own
file ``{out-dir}/shard-{k}/batch-{first item:06d}.jsonl`` (written to a temporary name
and renamed), and only then is the batch recorded as done in the checkpointed state.  A
resumed attempt skips the batches recorded as done; a batch finished but not yet
recorded when the job was killed is simply redone and its file overwritten, so the
output never holds an item twice.

The "model" is a stand-in: a tiny deterministic embedding of each item's text.

Flags: ``--items`` in all shards (default 1000), ``--shards`` (4), ``--shard`` (the
array index, else 0), ``--batch-size`` (50), ``--item-s`` seconds per item (0.001),
``--out-dir`` (``batch-out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import ebbtide.job as job


def embed(text: str, dims: int = 4) -> list[float]:
    """A stand-in model: a deterministic vector in [-1, 1] per text."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 127.5 - 1.0, 4) for b in digest[:dims]]


def write_batch(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Embed a shard of items, resumably.")
    parser.add_argument("--items", type=int, default=1000, help="items in all shards")
    parser.add_argument("--shards", type=int, default=4, help="number of shards")
    parser.add_argument("--shard", type=int, help="shard to process (default: array index)")
    parser.add_argument("--batch-size", type=int, default=50, help="items per batch")
    parser.add_argument("--item-s", type=float, default=0.001, help="seconds per item")
    parser.add_argument("--out-dir", type=Path, default=Path("batch-out"), help="results")
    args = parser.parse_args(argv)

    index = args.shard if args.shard is not None else job.array_index()
    shard = (index or 0) % args.shards
    items = list(range(shard, args.items, args.shards))
    batches = [items[i : i + args.batch_size] for i in range(0, len(items), args.batch_size)]

    state = job.restore({"shard": shard, "done_batches": set()})
    if not isinstance(state, dict) or state.get("shard") != shard:
        raise SystemExit(f"the checkpoint in {job.checkpoint_dir()} is not this shard's")
    done: set[int] = state["done_batches"]
    print(
        f"attempt {job.attempt()}: shard {shard}, {len(items)} items, "
        f"{len(done)} of {len(batches)} batches already done",
        flush=True,
    )

    for number, batch in enumerate(batches):
        if number in done:
            continue
        rows: list[dict[str, object]] = []
        for item in batch:
            time.sleep(args.item_s)
            rows.append({"item": item, "embedding": embed(f"item {item}")})
        write_batch(args.out_dir / f"shard-{shard}" / f"batch-{batch[0]:06d}.jsonl", rows)
        done.add(number)
        job.checkpoint(state)
        job.progress(sum(len(batches[n]) for n in done), len(items))
        if len(done) < len(batches) and job.preempted():
            print(f"warned after {len(done)} batches: requeueing", flush=True)
            job.requeue()

    print(f"shard {shard}: {len(items)} items in {len(batches)} batches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
