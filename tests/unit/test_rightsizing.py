"""Right-sizing arithmetic: p95 compute and peak memory with headroom, rounded, capped;
jobs grouped by name; qstat -f's hint."""

from __future__ import annotations

from typing import Any

import pytest

from ebbtide.queue.rightsizing import (
    MeasuredAttempt,
    Used,
    combine,
    hint,
    recommend,
    recommend_slice,
)

GIB = 1024


def measured(
    job_id: int = 1,
    attempt: int = 1,
    *,
    name: str = "train",
    owner: str = "alice",
    asked: tuple[float, int, int] = (50.0, 0, 16 * GIB),
    samples: int = 100,
    compute: tuple[float | None, float | None] = (18.0, 31.0),
    memory: tuple[float | None, float | None] = (5 * GIB, 6 * GIB),
) -> MeasuredAttempt:
    return MeasuredAttempt(
        job_id=job_id,
        name=name,
        owner=owner,
        queue="default",
        attempt=attempt,
        compute_pct=asked[0],
        gpus=asked[1],
        memory_mib=asked[2],
        samples=samples,
        compute_p95_pct=compute[0],
        compute_peak_pct=compute[1],
        memory_p95_mib=memory[0],
        memory_peak_mib=memory[1],
    )


def used(
    compute_p95: float | None = 18.0, memory_peak: float | None = 6 * GIB, **more: Any
) -> Used:
    fields: dict[str, Any] = {
        "attempts": 1,
        "samples": 100,
        "compute_p95_pct": compute_p95,
        "compute_peak_pct": compute_p95,
        "memory_p95_mib": memory_peak,
        "memory_peak_mib": memory_peak,
    }
    return Used(**{**fields, **more})


@pytest.mark.parametrize(
    ("p95", "peak_mib", "asked", "device", "expected"),
    [
        # 18 × 1.2 = 21.6 → 25 %; 6 GiB × 1.1 + 1 GiB = 7.6 GiB → 8 GiB
        pytest.param(18.0, 6 * GIB, (50.0, 0, 16 * GIB), None, (25.0, 0, 8 * GIB), id="share"),
        # exactly on a step stays there: 25 × 1.2 = 30; 10 GiB × 1.1 + 1 = 12 GiB
        pytest.param(25.0, 10 * GIB, (50.0, 0, 16 * GIB), None, (30.0, 0, 12 * GIB), id="steps"),
        # nothing used: the smallest steps
        pytest.param(0.0, 0.0, (50.0, 0, 16 * GIB), None, (5.0, 0, GIB), id="idle"),
        # more than asked: 90 × 1.2 → 100 %; 20 GiB × 1.1 + 1 = 23 GiB
        pytest.param(90.0, 20 * GIB, (50.0, 0, 16 * GIB), None, (100.0, 0, 23 * GIB), id="more"),
        # a whole GPU used at 30 % becomes a 40 % share of one
        pytest.param(30.0, 4 * GIB, (100.0, 1, 80 * GIB), None, (40.0, 0, 6 * GIB), id="1 gpu"),
        # a whole GPU used fully stays whole
        pytest.param(95.0, 70 * GIB, (100.0, 1, 80 * GIB), None, (100.0, 1, 78 * GIB), id="full"),
        # several whole GPUs stay whole (a share is of one GPU)
        pytest.param(20.0, 4 * GIB, (100.0, 2, 40 * GIB), None, (100.0, 2, 6 * GIB), id="2 gpus"),
        # capped at the largest device, in its exact size
        pytest.param(50.0, 79 * GIB, (60.0, 0, 80 * GIB), 81559, (60.0, 0, 81559), id="capped"),
    ],
)
def test_recommended_slice(
    p95: float,
    peak_mib: float,
    asked: tuple[float, int, int],
    device: int | None,
    expected: tuple[float, int, int],
) -> None:
    r = recommend_slice("t", "alice", (1,), used(p95, peak_mib), *asked, device)
    assert (r.compute_pct, r.gpus, r.memory_mib) == expected


def test_memory_uses_the_peak_never_the_p95() -> None:
    spiky = used(18.0, 12 * GIB, memory_p95_mib=2 * GIB)
    r = recommend_slice("t", "alice", (1,), spiky, 50.0, 0, 16 * GIB)
    assert r.memory_mib == 15 * GIB  # 12 × 1.1 + 1 = 14.2 → 15, not from the 2 GiB p95


def test_what_is_freed_and_the_resources_as_l_takes_them() -> None:
    r = recommend_slice("t", "alice", (1,), used(), 50.0, 0, 16 * GIB)
    assert (r.asked, r.resources) == ("gpu=50%,gpumem=16GiB", "gpu=25%,gpumem=8GiB")
    assert (r.freed_compute_pct, r.freed_memory_mib, r.devices) == (25.0, 8 * GIB, 1)
    assert r.notes == ()
    whole = recommend_slice("t", "alice", (1,), used(30.0, 4 * GIB), 100.0, 1, 80 * GIB)
    assert (whole.asked, whole.resources) == ("gpu=1,gpumem=80GiB", "gpu=40%,gpumem=6GiB")
    assert (whole.freed_compute_pct, whole.freed_memory_mib) == (60.0, 74 * GIB)
    odd = recommend_slice("t", "alice", (1,), used(), 50.0, 0, 1536)
    assert odd.asked == "gpu=50%,gpumem=1536MiB"


def test_used_more_than_asked_says_so_and_frees_a_negative_amount() -> None:
    r = recommend_slice("t", "alice", (1,), used(90.0, 20 * GIB), 50.0, 0, 16 * GIB)
    assert r.freed_compute_pct == -50.0 and r.freed_memory_mib == -7 * GIB
    assert any("above its grant (16GiB)" in n for n in r.notes)


def test_what_was_not_measured_stays_as_asked() -> None:
    r = recommend_slice("t", "alice", (1,), used(None, 3 * GIB), 50.0, 0, 16 * GIB)
    assert (r.compute_pct, r.memory_mib) == (50.0, 5 * GIB)
    assert any("compute was not measured" in n for n in r.notes)
    r = recommend_slice("t", "alice", (1,), used(10.0, None), 50.0, 0, 16 * GIB)
    assert (r.compute_pct, r.memory_mib) == (15.0, 16 * GIB)
    assert any("memory was not measured" in n for n in r.notes)


def test_attempts_combine_to_the_largest_p95_and_peak() -> None:
    both = combine(
        [
            measured(attempt=1, compute=(10.0, 50.0), memory=(GIB, 2 * GIB), samples=30),
            measured(attempt=2, compute=(20.0, 25.0), memory=(None, None), samples=70),
            measured(attempt=3, samples=0),  # measured nothing: left out
        ]
    )
    assert both == Used(2, 100, 20.0, 50.0, GIB, 2 * GIB)
    assert combine([measured(samples=0)]) is None
    assert both.words() == "compute p95 20%, peak 50%; memory p95 1GiB, peak 2GiB"


def test_jobs_are_grouped_by_owner_and_name_and_compared_with_the_latest_ask() -> None:
    rows = [
        measured(3, name="train", asked=(60.0, 0, 20 * GIB), compute=(30.0, 40.0)),
        measured(1, name="train", asked=(50.0, 0, 16 * GIB)),
        measured(2, name="eval[1]", compute=(5.0, 8.0), memory=(GIB, GIB)),
        measured(4, name="eval[2]", compute=(6.0, 9.0), memory=(GIB, GIB)),
        measured(5, name="train", owner="bob"),
        measured(6, name="never", samples=0),
    ]
    found = recommend(rows)
    assert [(r.name, r.owner, r.jobs) for r in found] == [
        ("eval", "alice", (2, 4)),
        ("train", "alice", (1, 3)),
        ("train", "bob", (5,)),
    ]
    train = found[1]
    assert (train.asked_compute_pct, train.asked_memory_mib) == (60.0, 20 * GIB)  # job 3's
    assert train.compute_pct == 40.0  # 30 × 1.2 = 36 → 40
    assert recommend([]) == []


def test_to_dict_is_what_json_prints() -> None:
    [r] = recommend([measured()])
    data = r.to_dict()
    assert data["recommended"] == {
        "compute_pct": 25.0,
        "gpus": 0,
        "memory_mib": 8 * GIB,
        "resources": "gpu=25%,gpumem=8GiB",
    }
    assert data["freed_per_device"] == {"compute_pct": 25.0, "memory_mib": 8 * GIB}
    assert data["used"]["samples"] == 100 and data["jobs"] == [1]


@pytest.mark.parametrize(
    ("usage", "grant", "says"),
    [
        pytest.param(used(18.0, 6 * GIB), (50.0, 0, 16 * GIB), ["6GiB of its 16GiB", "18%"]),
        pytest.param(used(40.0, 6 * GIB), (50.0, 0, 16 * GIB), ["6GiB of its 16GiB"]),
        pytest.param(used(18.0, 10 * GIB), (50.0, 0, 16 * GIB), ["18% compute (p95) of its 50%"]),
        pytest.param(used(30.0, 8 * GIB), (50.0, 0, 16 * GIB), None, id="half is not far"),
        pytest.param(used(30.0, 30 * GIB), (100.0, 1, 80 * GIB), ["of its 80GiB", "of its 100%"]),
        pytest.param(used(None, None), (50.0, 0, 16 * GIB), None, id="not measured"),
        pytest.param(None, (50.0, 0, 16 * GIB), None, id="nothing"),
    ],
)
def test_hint(usage: Used | None, grant: tuple[float, int, int], says: list[str] | None) -> None:
    text = hint(12, usage, *grant)
    if says is None:
        assert text is None
        return
    assert text is not None and "`ebb recommend 12`" in text
    for words in says:
        assert words in text
