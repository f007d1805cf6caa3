"""A job for ``benchmarks/chaos.py``: counts to N with checkpoints, and records when it is
alive, so the harness can tell whether two copies ever ran at once.

Usage: ``chaos_job.py N LIVE_DIR NAME [--step-s S] [--every K] [--stubborn] [--garbage]``

- counts to ``N`` one step every ``--step-s`` seconds; the count lives only in its
  checkpoint (``ebbtide.job``), so a resumed attempt neither skips nor repeats a step that
  was checkpointed, and the final count is N exactly when nothing ran twice at once;
- every step appends ``PID TIME`` to ``LIVE_DIR/NAME.live`` (``start PID ATTEMPT TIME``
  first): the harness turns these into live intervals per process;
- on the eviction warning it checkpoints and asks to be requeued, unless ``--stubborn``
  (then it ignores the warning and is killed at the deadline);
- ``--garbage`` also writes garbage to its status file all along (the agent must ignore
  it and carry on with everyone else's jobs);
- at the end it writes ``{"count": N, "attempts": [...]}`` to ``LIVE_DIR/NAME.result``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import ebbtide.job as job


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("live_dir", type=Path)
    p.add_argument("name")
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--stubborn", action="store_true")
    p.add_argument("--garbage", action="store_true")
    args = p.parse_args()
    if args.stubborn:
        signal.signal(job.warning_signal(), signal.SIG_IGN)
    live = open(args.live_dir / f"{args.name}.live", "a", buffering=1)  # noqa: SIM115
    pid = os.getpid()
    live.write(f"start {pid} {job.attempt()} {time.time():.6f}\n")
    status = os.environ.get("EBBTIDE_STATUS_FILE")
    garbage = open(status, "ab", buffering=0) if args.garbage and status else None  # noqa: SIM115
    state = job.restore({"count": 0, "attempts": []})
    state["attempts"].append(job.attempt())
    while state["count"] < args.n:
        live.write(f"{pid} {time.time():.6f}\n")
        time.sleep(args.step_s)
        state["count"] += 1
        if garbage is not None:
            garbage.write(os.urandom(64) + b"\n{not json\n" + b"\xff" * 300 + b"\n")
        if state["count"] % args.every == 0 or state["count"] == args.n:
            job.checkpoint(state)
        if job.preempted() and state["count"] < args.n:
            job.checkpoint(state)
            live.write(f"{pid} {time.time():.6f}\n")
            job.requeue()
    live.write(f"{pid} {time.time():.6f}\n")
    (args.live_dir / f"{args.name}.result").write_text(json.dumps(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
