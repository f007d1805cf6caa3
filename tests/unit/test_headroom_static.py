from __future__ import annotations

import threading

import pytest

from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.base import HeadroomSource, KnownPids
from ebbtide.workers.headroom.factory import open_source
from ebbtide.workers.headroom.static import StaticSource


def usage(source: StaticSource, now: float = 0.0) -> list[tuple[float, float]]:
    return [(s.online_compute_pct, s.online_memory_mib) for s in source.sample(now)]


def test_fixed_usage_on_every_device() -> None:
    source = StaticSource(parse_devices("2x80GiB"), online_compute_pct=20, online_memory_mib=8192)
    samples = source.sample(123.5)
    assert [s.index for s in samples] == [0, 1]
    assert {s.time for s in samples} == {123.5}
    assert usage(source) == [(20.0, 8192.0), (20.0, 8192.0)]


def test_defaults_to_no_online_usage() -> None:
    assert usage(StaticSource(parse_devices("1"))) == [(0.0, 0.0)]


def test_set_changes_one_device_only() -> None:
    source = StaticSource(parse_devices("2x80GiB"), 10, 1024)
    source.set(1, 90, 70_000)
    assert usage(source) == [(10.0, 1024.0), (90.0, 70_000.0)]


def test_offline_pids_do_not_matter() -> None:
    source = StaticSource(parse_devices("1"), 30, 100)
    assert source.sample(0.0, KnownPids.of({1, 2})) == source.sample(0.0)
    # nor does it attribute GPU use to jobs: right-sizing records nothing from it
    assert source.sample(0.0, KnownPids.of({1, 2}))[0].offline_jobs is None


@pytest.mark.parametrize(
    ("index", "compute", "memory", "match"),
    [
        (5, 10, 10, "no device with index 5"),
        (0, 101, 10, "percentage"),
        (0, -1, 10, "percentage"),
        (0, 10, -5, "non-negative"),
        (0, float("nan"), 10, "percentage"),
    ],
)
def test_set_rejects_bad_values(index: int, compute: float, memory: float, match: str) -> None:
    source = StaticSource(parse_devices("1"))
    with pytest.raises(ValueError, match=match):
        source.set(index, compute, memory)
    assert usage(source) == [(0.0, 0.0)]


def test_needs_devices_and_valid_usage() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        StaticSource([])
    with pytest.raises(ValueError, match="percentage"):
        StaticSource(parse_devices("1"), online_compute_pct=150)


def test_set_from_another_thread_is_seen_whole() -> None:
    source = StaticSource(parse_devices("1"))
    stop = threading.Event()

    def flip() -> None:
        k = 0
        while not stop.is_set():
            source.set(0, k % 2 * 50, k % 2 * 5000)
            k += 1

    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(2000):
            [(compute, memory)] = usage(source)
            assert (compute, memory) in {(0.0, 0.0), (50.0, 5000.0)}
    finally:
        stop.set()
        thread.join()


def test_is_a_headroom_source() -> None:
    source: HeadroomSource = StaticSource(parse_devices("1"))
    assert source.devices()[0].memory_mib == 81920
    source.close()


def test_factory_static_forms() -> None:
    source = open_source("static:20%,8GiB", parse_devices("2x40GiB"))
    assert isinstance(source, StaticSource)
    assert usage(source) == [(20.0, 8192.0), (20.0, 8192.0)]
    assert [d.memory_mib for d in source.devices()] == [40960, 40960]
    plain = open_source("static", None)
    assert usage(plain) == [(0.0, 0.0)]  # type: ignore[arg-type]
    assert [d.memory_mib for d in plain.devices()] == [81920]
    assert usage(open_source("STATIC: 35 , 512MiB", None)) == [(35.0, 512.0)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gpu",
        "static:",
        "static:20%",
        "static:120%,1GiB",
        "static:x,1GiB",
        "static:20%,8192",
        "static:20%,lots",
        "nvml:0",
    ],
)
def test_factory_rejects_bad_specs_with_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        open_source(spec, None)
    assert "static:COMPUTE%,MEM" in str(info.value)
    assert "trace:PATH@10x" in str(info.value)
