"""Count to N, checkpointing on the way: the smallest checkpointable ebbtide job.

Submit it with::

    ebb qsub -N count -- python examples/count.py 1000 --step-s 0.1

What it shows:

* ``job.restore()`` gives the state of the last checkpoint (a fresh state on attempt 1);
* ``job.checkpoint()`` every ``--every`` steps bounds the work lost to a kill;
* on the eviction warning (``job.preempted()``) it checkpoints once more and calls
  ``job.requeue()``: the attempt ends as evicted, and the next one resumes the count;
* with ``--ignore-warning`` it ignores the warning signal entirely, so the agent kills it
  at the eviction deadline and the next attempt resumes from the last periodic checkpoint.

Either way it counts exactly to N: the count lives only in the checkpointed state, so a
resumed attempt neither skips nor repeats a step.  Locally (outside ebbtide) stop it with
``kill -TERM`` and run it again: it resumes from ``./.ebbtide-checkpoints``.

Flags: ``N`` (default 100), ``--step-s`` seconds per step (0.05), ``--every`` steps
between checkpoints (10), ``--out`` a JSON file for ``{"count", "attempts_seen"}``,
``--ignore-warning``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import ebbtide.job as job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Count to N, checkpointing on the way.")
    parser.add_argument("n", nargs="?", type=int, default=100, help="count to (default 100)")
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds per step")
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument(
        "--ignore-warning",
        action="store_true",
        help="ignore the eviction warning signal (the agent then kills at the deadline)",
    )
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error("--every must be at least 1")

    if args.ignore_warning:
        signal.signal(job.warning_signal(), signal.SIG_IGN)

    state = job.restore({"count": 0, "attempts_seen": []})
    state["attempts_seen"].append(job.attempt())
    print(f"attempt {job.attempt()}: starting at {state['count']} of {args.n}", flush=True)

    while state["count"] < args.n:
        time.sleep(args.step_s)
        state["count"] += 1
        saved = state["count"] % args.every == 0
        if saved:
            job.checkpoint(state)
            job.progress(state["count"], args.n)
        if state["count"] < args.n and job.preempted():
            if not saved:
                job.checkpoint(state)
            print(f"warned at {state['count']}: checkpointed, requeueing", flush=True)
            job.requeue()

    print(f"counted to {state['count']}", flush=True)
    job.result({"count": state["count"], "attempts": len(state["attempts_seen"])})
    if args.out is not None:
        result = {"count": state["count"], "attempts_seen": state["attempts_seen"]}
        args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
