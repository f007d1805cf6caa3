"""The checkpointing job ``ebb demo`` runs: ``python -m ebbtide.demo_job STEPS``.

It stands in for a training or batch-inference run: ``STEPS`` steps of ``--step-s``
seconds each, with its state (the step count) checkpointed every ``--every`` steps and
reported as progress.  On the eviction warning it checkpoints once more and asks to be
requeued; the next attempt resumes from that checkpoint, so it neither skips nor repeats
a step.  With ``--ignore-warning`` it ignores the warning signal, so the node agent kills
it at the eviction deadline and the next attempt resumes from the last periodic
checkpoint.

It imports only :mod:`ebbtide.job` and uses no GPU: the demo's devices are simulated.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import ebbtide.job as job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ebbtide.demo_job", description="Count steps, checkpointing on the way."
    )
    parser.add_argument("steps", type=int, help="steps of work in all")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per step")
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument(
        "--ignore-warning",
        action="store_true",
        help="ignore the eviction warning (the agent then kills it at the deadline)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.every < 1 or args.step_s < 0:
        parser.error("steps and --every must be at least 1, --step-s not negative")
    if args.ignore_warning:
        signal.signal(job.warning_signal(), signal.SIG_IGN)

    state = job.restore({"step": 0})
    print(f"attempt {job.attempt()}: starting at step {state['step']} of {args.steps}", flush=True)
    while state["step"] < args.steps:
        time.sleep(args.step_s)
        state["step"] += 1
        saved = state["step"] % args.every == 0
        if saved:
            job.checkpoint(state)
            job.progress(state["step"], args.steps)
        if state["step"] < args.steps and job.preempted():
            if not saved:
                job.checkpoint(state)
                job.progress(state["step"], args.steps)
            print(f"warned at step {state['step']}: checkpointed, requeueing", flush=True)
            job.requeue()
    print(f"done: {state['step']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
