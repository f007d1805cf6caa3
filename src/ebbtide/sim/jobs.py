"""The offline side of a simulation: a stream of checkpointable jobs (``--jobs``).

``openb:CSV``: the best-effort (``qos=BE``) pods of the openb GPU-sharing trace
(``openb_pod_list_default.csv``) that request a GPU, in order of creation:

- slice: ``gpu_milli / 10`` percent of one device's compute; ``gpu_milli = 1000`` is a
  whole-GPU job (``gpus=1``), which yields compute to online work and holds only memory;
- work: ``deletion_time − creation_time`` seconds of running at that full slice (pods with
  no duration are skipped);
- arrival: ``creation_time`` relative to the first such pod (``--load trace`` replays it,
  divided by ``arrival_scale``);
- GPU memory (the trace has none): **the same share of a 16 GiB device**, at least 1 GiB.
  The openb cluster's GPUs are mostly 16 GiB cards (T4, P100, V100-16GB; the largest
  model named is a 32 GiB V100) and its pods' shares were sized for those, so a job's
  footprint does not grow when it lands on an 80 GiB device (``job_gpu_memory_mib``
  changes the 16 GiB);
- checkpoints: every ``ckpt_interval_s`` (10 min) of running; each costs the time to copy
  the job's GPU memory to the host at 10 GiB/s plus 50 ms (about 1.3 s for 13 GiB);
- eviction deadline 30 s (the product default); every job cooperates (checkpoints on the
  warning when that fits its deadline) unless ``stubborn_frac`` says otherwise.

``synthetic[:SEED]``: a seeded mix of training jobs (hours long, a quarter, half or whole
GPU, checkpointing every 5-20 min at a cost of 2-20 s) and batch-inference shards (1-6
minutes each, 10-30 % of a GPU, checkpointing every minute at 0.1 s), 10 % of them
stubborn, arriving over a day.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, replace

#: GPU memory of the device an openb pod's ``gpu_milli`` is a share of, in MiB (16 GiB).
OPENB_GPU_MEMORY_MIB = 16 * 1024
#: Least GPU memory of an openb job, in MiB.
JOB_MEMORY_FLOOR_MIB = 1024
#: Periodic checkpoint interval of an openb job, in seconds of running.
OPENB_CKPT_INTERVAL_S = 600.0
#: Fixed part of a checkpoint's cost, in seconds.
CKPT_BASE_S = 0.05
#: Speed of a checkpoint (GPU memory copied to host), in MiB per second (10 GiB/s).
CKPT_MIB_PER_S = 10 * 1024.0
#: Eviction deadline of every openb job, in seconds (the product's default).
DEFAULT_DEADLINE_S = 30.0


@dataclass(frozen=True)
class SimJob:
    """One offline job of the stream."""

    key: int
    kind: str
    #: when it is submitted, in seconds from the start of the stream
    arrival_s: float
    #: compute of its slice, in percent (100 for a whole GPU)
    compute_pct: float
    #: 0 for a fractional slice, else whole GPUs
    gpus: int
    memory_mib: int
    #: seconds of running at the full slice it needs to finish
    work_s: float
    ckpt_interval_s: float
    ckpt_cost_s: float
    deadline_s: float
    #: checkpoints on the eviction warning (else it is killed at the deadline)
    cooperative: bool = True

    @property
    def shape(self) -> tuple[float, int, int]:
        return (self.compute_pct, self.memory_mib, self.gpus)


def checkpoint_cost_s(memory_mib: float) -> float:
    """Time to checkpoint a job holding ``memory_mib`` of GPU memory, in seconds."""
    return CKPT_BASE_S + memory_mib / CKPT_MIB_PER_S


def _stubborn(rng: random.Random, frac: float) -> bool:
    return frac > 0 and rng.random() < frac


def load_openb(
    path: str | os.PathLike[str],
    *,
    job_gpu_memory_mib: float = OPENB_GPU_MEMORY_MIB,
    ckpt_interval_s: float = OPENB_CKPT_INTERVAL_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
    stubborn_frac: float = 0.0,
    seed: int = 0,
) -> list[SimJob]:
    """The BE pods with a GPU of an openb pod list, as jobs (see the module docstring)."""
    name = os.fspath(path)
    rows = []
    try:
        with open(name, encoding="utf-8-sig", newline="") as f:
            for n, row in enumerate(csv.DictReader(f), start=2):
                try:
                    if row["qos"] != "BE" or int(row["num_gpu"]) < 1:
                        continue
                    milli = int(row["gpu_milli"])
                    created = float(row["creation_time"])
                    duration = float(row["deletion_time"]) - created
                    gpus = int(row["num_gpu"])
                except (KeyError, TypeError, ValueError):
                    raise ValueError(
                        f"{name} line {n}: expected qos, num_gpu, gpu_milli, creation_time "
                        "and deletion_time (an openb pod list)"
                    ) from None
                if duration > 0 and milli > 0:
                    rows.append((created, n, milli, gpus, duration))
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if not rows:
        raise ValueError(f"{name}: no best-effort pods with a GPU")
    rows.sort()
    t0 = rows[0][0]
    rng = random.Random(f"{seed}:openb-stubborn")
    jobs = []
    for key, (created, _, milli, gpus, duration) in enumerate(rows):
        whole = milli >= 1000
        share = min(milli, 1000) / 1000.0
        memory = max(JOB_MEMORY_FLOOR_MIB, math.ceil(share * job_gpu_memory_mib))
        jobs.append(
            SimJob(
                key=key,
                kind="openb",
                arrival_s=created - t0,
                compute_pct=100.0 if whole else milli / 10.0,
                gpus=gpus if whole else 0,
                memory_mib=memory,
                work_s=duration,
                ckpt_interval_s=ckpt_interval_s,
                ckpt_cost_s=checkpoint_cost_s(memory),
                deadline_s=deadline_s,
                cooperative=not _stubborn(rng, stubborn_frac),
            )
        )
    return jobs


#: Synthetic mix: share of training jobs among the stream's entries (the rest are arrays).
SYNTH_TRAINING_FRAC = 0.4
#: Synthetic stream: entries (a training job or an array of shards) per day.
SYNTH_ENTRIES_PER_DAY = 400
#: Synthetic stream: share of stubborn jobs (ignore the warning, killed at the deadline).
SYNTH_STUBBORN_FRAC = 0.1


def synthetic(seed: int = 0, *, span_s: float = 86400.0) -> list[SimJob]:
    """A seeded mix of training jobs and batch-inference shards arriving over ``span_s``."""
    rng = random.Random(f"{seed}:synthetic")
    jobs: list[SimJob] = []
    entries = max(1, round(SYNTH_ENTRIES_PER_DAY * span_s / 86400.0))
    for _ in range(entries):
        arrival = rng.uniform(0.0, span_s)
        if rng.random() < SYNTH_TRAINING_FRAC:
            compute, gpus = rng.choice([(25.0, 0), (50.0, 0), (100.0, 1)])
            memory = rng.choice([8, 16, 24]) * 1024
            interval = rng.choice([300.0, 600.0, 1200.0])
            jobs.append(
                SimJob(
                    key=0,
                    kind="training",
                    arrival_s=arrival,
                    compute_pct=compute,
                    gpus=gpus,
                    memory_mib=memory,
                    work_s=3600.0 * math.exp(rng.uniform(0.0, math.log(8.0))),
                    ckpt_interval_s=interval,
                    ckpt_cost_s=rng.choice([2.0, 5.0, 10.0, 20.0]),
                    deadline_s=rng.choice([10.0, 30.0]),
                    cooperative=not _stubborn(rng, SYNTH_STUBBORN_FRAC),
                )
            )
        else:
            compute = rng.choice([10.0, 20.0, 30.0])
            memory = rng.choice([2, 4, 8]) * 1024
            for _ in range(rng.randint(10, 60)):
                jobs.append(
                    SimJob(
                        key=0,
                        kind="inference",
                        arrival_s=arrival,
                        compute_pct=compute,
                        gpus=0,
                        memory_mib=memory,
                        work_s=rng.uniform(60.0, 360.0),
                        ckpt_interval_s=60.0,
                        ckpt_cost_s=0.1,
                        deadline_s=10.0,
                        cooperative=not _stubborn(rng, SYNTH_STUBBORN_FRAC),
                    )
                )
    jobs.sort(key=lambda j: j.arrival_s)
    return [replace(j, key=k) for k, j in enumerate(jobs)]
