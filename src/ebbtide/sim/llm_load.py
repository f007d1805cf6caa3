"""Online GPU load of an LLM-serving fleet, modelled from a request log.

The Azure LLM inference trace 2023 (Patel et al., "Splitwise: Efficient generative LLM
inference using phase splitting", ISCA 2024; CC BY 4.0) lists requests, not GPU telemetry:
``TIMESTAMP,ContextTokens,GeneratedTokens``.  This module turns such a log into the
``t_s,device,online_compute_pct,online_memory_mib`` rows of a ``trace:`` CSV with a simple,
stated model.  Everything here is pure except :func:`read_requests`.

The fleet
    ``gpus`` (default 8) identical inference GPUs of 80 GiB (A100-80GB class), each
    serving its own replica of a 13B-parameter model in fp16 (CodeLlama-13B / Llama-2-13B
    shape: 40 layers, hidden size 5120, no grouped-query attention).  A 13B model fits one
    card with room for a large KV cache, so every GPU is an independent replica and the
    requests of a code-completion service (prompts of up to about 7,400 tokens in this
    trace) need no tensor parallelism.

Assignment
    ``least-loaded`` (default): a request goes to the GPU with the fewest requests still in
    flight at its arrival; ties go round-robin (the first tied GPU after the one chosen
    last), so an idle fleet is not all piled onto GPU 0.  ``round-robin``: in turn.

A request's life on its GPU (no queueing: every request starts when it arrives)
    - *prefill*: ``ContextTokens / prefill_tokens_per_s`` seconds (default 6,000 tokens/s:
      26 GFLOP per token for 13B parameters at about half of an A100's 312 TFLOP/s fp16,
      rounded down for attention over long prompts) at
      ``prefill_compute_pct`` (100 %: prefill is large matrix-matrix work);
    - *decode*: ``GeneratedTokens / decode_tokens_per_s`` seconds (default 40 tokens/s per
      sequence: a decode step reads the 26 GB of weights, 13 ms at 2 TB/s, and takes about
      25 ms with attention and batching overheads).  Decode is bandwidth-bound: the GPU's
      compute while ``n`` sequences decode is ``decode_base_compute_pct`` (30 %) plus
      ``decode_per_sequence_pct`` (2 %) per sequence.
    - compute on a GPU at an instant is the sum over its requests (a prefill plus the decode
      batch), capped at 100 %.  The cap does not stretch time: a simplification that
      under-states contention when prefills overlap, rare at this trace's load.

Memory
    ``weights_mib`` (24,826 MiB: 13,016,028,160 parameters × 2 bytes) plus
    ``runtime_overhead_mib`` (3,072 MiB: CUDA context, cuBLAS workspace and the activations
    of a prefill) plus the KV cache: ``kv_mib_per_token`` (0.78125 MiB = 2 (K and V) × 40
    layers × 5120 × 2 bytes = 819,200 bytes) per live token.  A request holds its
    ``ContextTokens`` from arrival (the prompt's cache blocks are allocated when it is
    admitted) and one more token per generated token during decode, all released when it
    ends.  So memory sits at 27,898 MiB and rises by a few GiB with the requests in flight:
    mostly steady while compute changes every second.  Memory never exceeds the card
    (``card_memory_mib``); a real server would queue the excess, this model clamps it.

    vLLM instead pre-allocates ``gpu_memory_utilization`` (0.9 by default) of the card for
    weights and KV cache at start-up, so NVML shows a flat line; set
    ``preallocated_memory_frac`` to model that (memory is then that share of the card at
    every step, whatever the requests).

Sampling
    Row ``t_s = k`` (k = 0, 1, …) covers trace seconds ``[k·c, (k+1)·c)`` where ``c`` is
    ``time_compression`` (1 by default: no compression).  Compute is the *mean* over that
    window (as NVML's utilization is the share of the sample period a kernel ran); memory
    is the *peak* in the window (what an offline job beside it must leave free throughout).
    Compute is rounded to 0.01 %, memory to whole MiB.  Time 0 is the first request's
    arrival; rows run until the last request has ended (or ``duration_s`` trace seconds).

No randomness: the same requests and parameters give the same rows.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

#: Inference GPUs in the fleet.
DEFAULT_GPUS = 8
#: Memory of one GPU, in MiB (80 GiB: A100-80GB / H100-80GB).
CARD_MEMORY_MIB = 80 * 1024
#: Weights of a 13B model in fp16, in MiB (13,016,028,160 parameters × 2 bytes).
WEIGHTS_MIB = 24_826
#: CUDA context, library workspaces and prefill activations, in MiB.
RUNTIME_OVERHEAD_MIB = 3 * 1024
#: KV cache per token of a 13B model in fp16, in MiB (2 × 40 layers × 5120 × 2 bytes).
KV_MIB_PER_TOKEN = 2 * 40 * 5120 * 2 / (1024 * 1024)
#: Prompt tokens processed per second by one GPU during prefill.
PREFILL_TOKENS_PER_S = 6000.0
#: Tokens generated per second per sequence during decode.
DECODE_TOKENS_PER_S = 40.0
#: Compute of a GPU while it runs a prefill, in percent.
PREFILL_COMPUTE_PCT = 100.0
#: Compute of a GPU while at least one sequence decodes, in percent.
DECODE_BASE_COMPUTE_PCT = 30.0
#: Extra compute per sequence in the decode batch, in percent.
DECODE_PER_SEQUENCE_PCT = 2.0
#: Trace seconds per output row (1: no time compression).
TIME_COMPRESSION = 1.0

Assignment = Literal["least-loaded", "round-robin"]
ASSIGNMENTS: tuple[Assignment, ...] = ("least-loaded", "round-robin")

#: A trace row: ``(t_s, device, online_compute_pct, online_memory_mib)``.
Row = tuple[int, int, float, int]

_TRACE_HEADER = "t_s,device,online_compute_pct,online_memory_mib"
_TICKS_PER_S = 10_000_000  # the log's timestamps have seven decimals (100 ns)


@dataclass(frozen=True)
class Request:
    """One request of the log: arrival in seconds after the first request, token counts."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class LlmFleet:
    """The model's constants (see the module docstring for why these defaults)."""

    gpus: int = DEFAULT_GPUS
    assignment: Assignment = "least-loaded"
    card_memory_mib: float = CARD_MEMORY_MIB
    weights_mib: float = WEIGHTS_MIB
    runtime_overhead_mib: float = RUNTIME_OVERHEAD_MIB
    kv_mib_per_token: float = KV_MIB_PER_TOKEN
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    decode_tokens_per_s: float = DECODE_TOKENS_PER_S
    prefill_compute_pct: float = PREFILL_COMPUTE_PCT
    decode_base_compute_pct: float = DECODE_BASE_COMPUTE_PCT
    decode_per_sequence_pct: float = DECODE_PER_SEQUENCE_PCT
    #: None: memory follows the KV cache; a share of the card (vLLM's
    #: ``gpu_memory_utilization``, e.g. 0.9): memory is that share at every step
    preallocated_memory_frac: float | None = None
    time_compression: float = TIME_COMPRESSION

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {self.gpus}")
        if self.assignment not in ASSIGNMENTS:
            raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {self.assignment!r}")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "time_compression"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.preallocated_memory_frac is not None and not 0 < self.preallocated_memory_frac <= 1:
            raise ValueError(
                f"preallocated_memory_frac must be in (0, 1], got {self.preallocated_memory_frac}"
            )

    @property
    def idle_memory_mib(self) -> float:
        """Memory of a GPU with no request in flight."""
        return self.weights_mib + self.runtime_overhead_mib


@dataclass(frozen=True)
class Phase:
    """A request placed on a GPU: prefill over ``[start_s, decode_s)``, decode until ``end_s``."""

    start_s: float
    decode_s: float
    end_s: float
    context_tokens: int
    generated_tokens: int

    def tokens_before(self, t_s: float, decode_tokens_per_s: float) -> float:
        """Tokens in its KV cache just before ``t_s`` (the left limit); 0 outside its life."""
        if not self.start_s < t_s <= self.end_s:
            return 0.0
        if t_s <= self.decode_s:
            return float(self.context_tokens)
        generated = min(float(self.generated_tokens), (t_s - self.decode_s) * decode_tokens_per_s)
        return self.context_tokens + generated


def _parse_timestamp_ticks(text: str) -> int:
    """``2023-11-16 18:17:03.9799600`` → 100-ns ticks since 0001-01-01 (exact, no floats)."""
    whole, _, fraction = text.strip().partition(".")
    moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    digits = (fraction + "0000000")[:7]
    if not digits.isdigit():
        raise ValueError(f"bad fraction of a second in {text!r}")
    days = moment.toordinal()
    seconds = moment.hour * 3600 + moment.minute * 60 + moment.second
    return (days * 86400 + seconds) * _TICKS_PER_S + int(digits)


def parse_requests(lines: Iterable[str], name: str) -> list[Request]:
    """Parse the log's CSV text (``TIMESTAMP,ContextTokens,GeneratedTokens``), in time order.

    Arrivals are seconds after the earliest request.  Raises ``ValueError`` naming the line.
    """
    reader = csv.DictReader(lines)
    raw: list[tuple[int, int, int]] = []
    for row in reader:
        where = f"{name} line {reader.line_num}"
        try:
            ticks = _parse_timestamp_ticks(row["TIMESTAMP"])
            context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{where}: expected TIMESTAMP,ContextTokens,GeneratedTokens "
                "(a timestamp and two whole numbers)"
            ) from None
        if context < 0 or generated < 0:
            raise ValueError(f"{where}: token counts must not be negative")
        raw.append((ticks, context, generated))
    if not raw:
        raise ValueError(f"{name}: no requests")
    raw.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    origin = raw[0][0]
    return [Request((t - origin) / _TICKS_PER_S, c, g) for t, c, g in raw]


def read_requests(path: str | os.PathLike[str]) -> list[Request]:
    """Read a request log from ``path`` (the only I/O of this module)."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8-sig", newline="") as f:
            return parse_requests(f, name)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None


def place(requests: Sequence[Request], fleet: LlmFleet) -> list[list[Phase]]:
    """Assign each request to a GPU and time its phases; one list per GPU, in arrival order."""
    per_gpu: list[list[Phase]] = [[] for _ in range(fleet.gpus)]
    ends: list[list[float]] = [[] for _ in range(fleet.gpus)]  # end times in flight, sorted
    last = fleet.gpus - 1
    for k, req in enumerate(sorted(requests, key=lambda r: r.arrival_s)):
        if fleet.assignment == "round-robin":
            gpu = k % fleet.gpus
        else:
            for pending in ends:
                del pending[: bisect.bisect_right(pending, req.arrival_s)]
            order = [(last + 1 + i) % fleet.gpus for i in range(fleet.gpus)]
            gpu = min(order, key=lambda g: len(ends[g]))  # min keeps the first tied: round-robin
            last = gpu
        decode_s = req.arrival_s + req.context_tokens / fleet.prefill_tokens_per_s
        end_s = decode_s + req.generated_tokens / fleet.decode_tokens_per_s
        per_gpu[gpu].append(
            Phase(req.arrival_s, decode_s, end_s, req.context_tokens, req.generated_tokens)
        )
        bisect.insort(ends[gpu], end_s)
    return per_gpu


def _compute_pct(prefills: int, decodes: int, fleet: LlmFleet) -> float:
    pct = prefills * fleet.prefill_compute_pct
    if decodes:
        pct += fleet.decode_base_compute_pct + decodes * fleet.decode_per_sequence_pct
    return min(100.0, pct)


def compute_steps(phases: Sequence[Phase], fleet: LlmFleet) -> list[tuple[float, float]]:
    """One GPU's compute as a step function: ``(from_s, pct)`` pairs in time order."""
    events: list[tuple[float, int, int]] = []  # (time, Δprefills, Δdecodes)
    for p in phases:
        events += [(p.start_s, 1, 0), (p.decode_s, -1, 1), (p.end_s, 0, -1)]
    events.sort()
    steps: list[tuple[float, float]] = [(0.0, 0.0)]
    prefills = decodes = 0
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            prefills += events[i][1]
            decodes += events[i][2]
            i += 1
        pct = _compute_pct(prefills, decodes, fleet)
        if t == steps[-1][0]:
            steps[-1] = (t, pct)
        elif pct != steps[-1][1]:
            steps.append((t, pct))
    return steps


def mean_compute(
    steps: Sequence[tuple[float, float]], a_s: float, b_s: float, first: int = 0
) -> float:
    """Mean of a compute step function over ``[a_s, b_s)``; ``first``: an index of ``steps``
    at or before the one that holds at ``a_s`` (to resume a scan)."""
    i = first
    while i + 1 < len(steps) and steps[i + 1][0] <= a_s:
        i += 1
    total = 0.0
    while i < len(steps) and steps[i][0] < b_s:
        lo = max(a_s, steps[i][0])
        hi = min(b_s, steps[i + 1][0]) if i + 1 < len(steps) else b_s
        total += steps[i][1] * (hi - lo)
        i += 1
    return total / (b_s - a_s)


def peak_memory_mib(phases: Sequence[Phase], a_s: float, b_s: float, fleet: LlmFleet) -> float:
    """Peak memory over ``[a_s, b_s)`` of a GPU running ``phases`` (all overlapping it)."""
    if fleet.preallocated_memory_frac is not None:
        return fleet.preallocated_memory_frac * fleet.card_memory_mib
    # Between two request ends the KV cache only grows (admissions, generated tokens), so
    # its peak is the left limit just before an end inside the window or before b_s.
    candidates = [b_s] + [p.end_s for p in phases if a_s < p.end_s < b_s]
    rate = fleet.decode_tokens_per_s
    tokens = max(sum(p.tokens_before(t, rate) for p in phases) for t in candidates)
    return min(fleet.card_memory_mib, fleet.idle_memory_mib + tokens * fleet.kv_mib_per_token)


def device_rows(
    device: int, phases: Sequence[Phase], steps_count: int, fleet: LlmFleet
) -> list[Row]:
    """The rows of one GPU for output seconds ``0 .. steps_count - 1``."""
    compute = compute_steps(phases, fleet)
    by_start = sorted(phases, key=lambda p: p.start_s)
    starts = [p.start_s for p in by_start]
    window = fleet.time_compression
    live: list[Phase] = []
    nxt = first = 0
    rows: list[Row] = []
    for k in range(steps_count):
        a_s, b_s = k * window, (k + 1) * window
        while first + 1 < len(compute) and compute[first + 1][0] <= a_s:
            first += 1
        hi = bisect.bisect_left(starts, b_s)
        live = [p for p in live if p.end_s > a_s] + [p for p in by_start[nxt:hi] if p.end_s > a_s]
        nxt = hi
        pct = round(mean_compute(compute, a_s, b_s, first), 2)
        mib = round(peak_memory_mib(live, a_s, b_s, fleet))
        rows.append((k, device, pct, int(mib)))
    return rows


def load_rows(
    requests: Sequence[Request], fleet: LlmFleet | None = None, duration_s: float | None = None
) -> list[Row]:
    """The trace rows of the fleet, ordered by time, then device.

    ``duration_s`` keeps the first that many trace seconds (requests arriving later are
    dropped, those in flight at the end are cut); by default rows run until the last
    request ends.
    """
    fleet = fleet or LlmFleet()
    if duration_s is not None:
        requests = [r for r in requests if r.arrival_s < duration_s]
    per_gpu = place(requests, fleet)
    last_end_s = max((p.end_s for ps in per_gpu for p in ps), default=0.0)
    span_s = last_end_s if duration_s is None else duration_s
    steps_count = max(1, math.ceil(span_s / fleet.time_compression))
    columns = [device_rows(d, ps, steps_count, fleet) for d, ps in enumerate(per_gpu)]
    return [columns[d][k] for k in range(steps_count) for d in range(fleet.gpus)]


def format_rows(rows: Iterable[Row]) -> str:
    """The rows as ``trace:`` CSV text (header included, ``\\n`` line ends)."""
    lines = [_TRACE_HEADER]
    lines += [f"{t},{d},{c:g},{m}" for t, d, c, m in rows]
    return "\n".join(lines) + "\n"
