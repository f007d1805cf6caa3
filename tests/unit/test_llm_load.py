"""The LLM-serving load model (:mod:`ebbtide.sim.llm_load`) on hand-made requests, and the
shipped ``azure_code_llm_load.csv`` against what ``benchmarks/build_llm_trace.py`` makes."""

from __future__ import annotations

import importlib.util
import os
import random
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest

from ebbtide.sim.llm_load import (
    CARD_MEMORY_MIB,
    KV_MIB_PER_TOKEN,
    LlmFleet,
    Request,
    Row,
    compute_steps,
    format_rows,
    load_rows,
    parse_requests,
    place,
)
from ebbtide.sim.online import load_trace_csv

REPO = Path(__file__).resolve().parents[2]
LOG_NAME = "azure_llm_inference_2023_code.csv"
ONE_GPU = LlmFleet(gpus=1)
IDLE_MIB = ONE_GPU.idle_memory_mib


def compute_of(rows: list[Row], device: int = 0) -> list[float]:
    return [r[2] for r in rows if r[1] == device]


def memory_of(rows: list[Row], device: int = 0) -> list[int]:
    return [r[3] for r in rows if r[1] == device]


def mib(tokens: float) -> int:
    return round(IDLE_MIB + tokens * KV_MIB_PER_TOKEN)


def test_single_request_prefill_spike_then_decode_plateau() -> None:
    # 12,000 prompt tokens at 6,000/s: 2 s of prefill; 120 tokens at 40/s: 3 s of decode
    rows = load_rows([Request(0.0, 12_000, 120)], ONE_GPU, duration_s=7.0)
    assert [r[0] for r in rows] == list(range(7))
    assert compute_of(rows) == [100.0, 100.0, 32.0, 32.0, 32.0, 0.0, 0.0]
    # the prompt's cache from arrival, then one more token per generated token, then freed
    assert memory_of(rows) == [
        mib(12_000),
        mib(12_000),
        mib(12_040),
        mib(12_080),
        mib(12_120),
        mib(0),
        mib(0),
    ]


def test_rows_run_until_the_last_request_ends() -> None:
    rows = load_rows([Request(0.0, 12_000, 120)], ONE_GPU)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]


def test_a_window_holds_the_mean_compute_and_the_peak_memory() -> None:
    # 3,000 tokens: 0.5 s of prefill, then 20 tokens: 0.5 s of decode, inside one second
    rows = load_rows([Request(0.0, 3_000, 20)], ONE_GPU, duration_s=2.0)
    assert compute_of(rows) == [66.0, 0.0]  # (100 + 32) / 2
    assert memory_of(rows) == [mib(3_020), mib(0)]


def test_overlapping_requests_add_up_and_cap_at_100() -> None:
    # A: prefill [0, 1), decode [1, 11); B: prefill [0.5, 1.5), decode [1.5, 11.5)
    fleet = LlmFleet(gpus=1, prefill_compute_pct=60.0)
    requests = [Request(0.0, 6_000, 400), Request(0.5, 6_000, 400)]
    [phases] = place(requests, fleet)
    assert compute_steps(phases, fleet) == [
        (0.0, 60.0),  # A's prefill
        (0.5, 100.0),  # two prefills: 120, capped
        (1.0, 92.0),  # B's prefill and A's decode: 60 + 30 + 2
        (1.5, 34.0),  # two decoding sequences: 30 + 2 × 2
        (11.0, 32.0),
        (11.5, 0.0),
    ]
    rows = load_rows(requests, fleet)
    assert compute_of(rows) == [80.0, 63.0, *[34.0] * 9, 16.0]
    # both caches are held at once: at the end of second 5, A has decoded for 5 s, B for 4.5 s
    assert memory_of(rows)[5] == mib(6_000 + 6_000 + 200 + 180)


def test_many_decoding_sequences_cap_at_100() -> None:
    fleet = LlmFleet(gpus=1, decode_per_sequence_pct=40.0)
    requests = [Request(0.0, 0, 400), Request(0.0, 0, 400)]
    assert compute_of(load_rows(requests, fleet)) == [100.0] * 10


def test_least_loaded_takes_the_freest_gpu_and_breaks_ties_in_turn() -> None:
    fleet = LlmFleet(gpus=2)
    long, short = Request(0.0, 600, 400), Request(0.1, 600, 4)
    # the short one ends at 0.3 s: at 1 s GPU 1 is free again while GPU 0 still decodes
    requests = [long, short, Request(1.0, 600, 4), Request(1.05, 600, 4)]
    per_gpu = place(requests, fleet)
    assert [p.start_s for p in per_gpu[0]] == [0.0, 1.05]
    assert [p.start_s for p in per_gpu[1]] == [0.1, 1.0]
    idle = [Request(t, 6, 1) for t in (0.0, 10.0, 20.0, 30.0)]  # each ends before the next
    assert [len(ps) for ps in place(idle, fleet)] == [2, 2]  # not all on GPU 0


def test_round_robin_ignores_load() -> None:
    fleet = LlmFleet(gpus=3, assignment="round-robin")
    requests = [Request(float(t), 6, 1) for t in range(7)]
    assert [len(ps) for ps in place(requests, fleet)] == [3, 2, 2]


def test_time_compression_averages_longer_windows() -> None:
    fleet = LlmFleet(gpus=1, time_compression=2.0)
    rows = load_rows([Request(0.0, 12_000, 120)], fleet)
    assert compute_of(rows) == [100.0, 32.0, 16.0]
    assert [r[0] for r in rows] == [0, 1, 2]


def test_preallocated_memory_is_flat() -> None:
    fleet = LlmFleet(gpus=1, preallocated_memory_frac=0.9)
    rows = load_rows([Request(0.0, 12_000, 120)], fleet, duration_s=8.0)
    assert set(memory_of(rows)) == {round(0.9 * CARD_MEMORY_MIB)}


def test_memory_never_exceeds_the_card() -> None:
    requests = [Request(0.0, 7_000, 10) for _ in range(30)]  # 164 GiB of prompt cache
    assert max(memory_of(load_rows(requests, ONE_GPU))) == CARD_MEMORY_MIB


def test_bad_fleet_is_refused() -> None:
    with pytest.raises(ValueError, match="gpus"):
        LlmFleet(gpus=0)
    with pytest.raises(ValueError, match="decode_tokens_per_s"):
        LlmFleet(decode_tokens_per_s=0.0)
    with pytest.raises(ValueError, match="assignment"):
        LlmFleet(assignment="random")  # type: ignore[arg-type]


def test_parse_requests_sorts_and_keeps_100ns() -> None:
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:17:04.0319600,3180,8",
        "2023-11-16 18:17:03.9799600,4808,10",
        "2023-11-16 18:18:03.9799601,5,6",
    ]
    requests = parse_requests(lines, "log.csv")
    assert requests == [
        Request(0.0, 4808, 10),
        Request(0.052, 3180, 8),
        Request(60.0000001, 5, 6),
    ]


@pytest.mark.parametrize(
    "line",
    ["2023-11-16 18:17:04.03,x,8", "yesterday,1,2", "2023-11-16 18:17:04,-1,2"],
)
def test_parse_requests_names_the_bad_line(line: str) -> None:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,1,1", line]
    with pytest.raises(ValueError, match=r"log\.csv line 3"):
        parse_requests(lines, "log.csv")


def test_same_requests_same_rows() -> None:
    rng = random.Random(7)
    requests = [
        Request(rng.uniform(0, 120), rng.randint(3, 7_500), rng.randint(6, 400)) for _ in range(300)
    ]
    fleet = LlmFleet(gpus=4)
    first = format_rows(load_rows(requests, fleet))
    assert first == format_rows(load_rows(list(reversed(requests)), fleet))
    assert first == format_rows(load_rows(requests, LlmFleet(gpus=4)))
    assert first.startswith("t_s,device,online_compute_pct,online_memory_mib\n")


def shipped_trace() -> Path:
    return Path(str(resources.files("ebbtide").joinpath("data", "azure_code_llm_load.csv")))


def test_shipped_trace_replays() -> None:
    path = shipped_trace()
    assert path.stat().st_size < 5_000_000
    load = load_trace_csv(path, device_memory_mib=CARD_MEMORY_MIB)
    assert len(load.devices) == 8
    assert load.step_s == 1.0
    assert 3400 <= load.span_s <= 3600  # the whole hour
    for device in load.devices:
        assert max(device.compute_pct) - min(device.compute_pct) >= 90  # bursts
        assert min(device.memory_mib) == IDLE_MIB  # weights and runtime when idle


def request_log() -> Path | None:
    """The shared request log: under ``$EBBTIDE_TRACES``, else ``shared/traces`` beside the
    repository."""
    for folder in (os.environ.get("EBBTIDE_TRACES"), REPO.parent / "shared" / "traces"):
        if folder and (Path(folder) / LOG_NAME).is_file():
            return Path(folder) / LOG_NAME
    return None


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_llm_trace", REPO / "benchmarks" / "build_llm_trace.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_trace_is_what_the_builder_makes() -> None:
    log = request_log()
    if log is None:
        pytest.skip(f"{LOG_NAME} is not beside the repository (set EBBTIDE_TRACES)")
    text = format_rows(builder().build(log))
    assert text.encode() == shipped_trace().read_bytes()


def test_builder_figures_count_bursts() -> None:
    module = builder()
    assert module.bursts([0, 85, 90, 60, 85, 40, 81, 10, 79]) == 2
    rows: list[Row] = [(t, 0, c, 1000) for t, c in enumerate([0.0, 90.0] * 30)]
    [gpu, fleet] = module.figures(rows)
    assert "bursts 30.00/min" in gpu
    assert "30.00 per GPU-minute" in fleet
