from __future__ import annotations

import gzip
import time
from importlib import resources
from pathlib import Path

import pytest

from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.factory import open_source
from ebbtide.workers.headroom.trace import TraceSource

HEADER = "t_s,device,online_compute_pct,online_memory_mib\n"
T0 = 1_700_000_000.0


def write(tmp_path: Path, body: str, name: str = "trace.csv", header: str = HEADER) -> Path:
    path = tmp_path / name
    path.write_text(header + body)
    return path


def usage(source: TraceSource, now: float) -> list[tuple[float, float]]:
    return [(s.online_compute_pct, s.online_memory_mib) for s in source.sample(now)]


@pytest.fixture
def two_devices(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        "".join(
            [
                "0,0,10,1000\n",
                "10,0,50,5000\n",
                "20,0,5,500\n",
                "5,1,70,7000\n",
                "15,1,0,100\n",
            ]
        ),
    )


def test_step_function_per_device(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), start_time=T0)
    assert usage(source, T0) == [(10, 1000), (0, 0)]  # device 1 has no row yet
    assert usage(source, T0 + 4.999) == [(10, 1000), (0, 0)]
    assert usage(source, T0 + 5) == [(10, 1000), (70, 7000)]
    assert usage(source, T0 + 10) == [(50, 5000), (70, 7000)]
    assert usage(source, T0 + 17) == [(50, 5000), (0, 100)]
    assert usage(source, T0 + 1000) == [(5, 500), (0, 100)]  # last values hold


def test_samples_carry_index_and_time(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), start_time=T0)
    samples = source.sample(T0 + 3)
    assert [(s.index, s.time) for s in samples] == [(0, T0 + 3), (1, T0 + 3)]
    assert [s.offline_jobs for s in samples] == [None, None]  # declared: nothing per job


def test_origin_is_the_first_sample_without_start_time(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"))
    assert usage(source, T0 + 500) == [(10, 1000), (0, 0)]
    assert usage(source, T0 + 510) == [(50, 5000), (70, 7000)]


def test_before_start_time_everything_is_zero(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), start_time=T0)
    assert usage(source, T0 - 100) == [(0, 0), (0, 0)]


def test_speedup_compresses_time(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), speedup=10, start_time=T0)
    assert usage(source, T0 + 0.9) == [(10, 1000), (70, 7000)]  # trace second 9
    assert usage(source, T0 + 1.0) == [(50, 5000), (70, 7000)]  # trace second 10
    assert source.trace_time_s(T0 + 2.0) == pytest.approx(20.0)


def test_loop_wraps_after_the_last_step(two_devices: Path) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), start_time=T0, loop=True)
    # row times 0, 5, 10, 15, 20: the median step is 5 s, so the trace lasts 25 s
    assert source.duration_s == pytest.approx(25.0)
    assert usage(source, T0 + 22) == [(5, 500), (0, 100)]
    assert usage(source, T0 + 25) == [(10, 1000), (0, 0)]
    assert usage(source, T0 + 25 + 11) == [(50, 5000), (70, 7000)]
    assert usage(source, T0 + 10 * 25 + 6) == usage(source, T0 + 6)


def test_rows_need_not_be_sorted_and_the_last_duplicate_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "10,0,30,300\n0,0,10,100\n10,0,40,400\n")
    source = TraceSource(path, parse_devices("1"), start_time=T0)
    assert usage(source, T0 + 1) == [(10, 100)]
    assert usage(source, T0 + 11) == [(40, 400)]


def test_columns_in_any_order_and_blank_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "2048,0,0,25\n\n4096,5,0,75\n",
        header="online_memory_mib,t_s,device,online_compute_pct\n",
    )
    source = TraceSource(path, parse_devices("1"), start_time=T0)
    assert usage(source, T0 + 6) == [(75, 4096)]


def test_gzip(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(HEADER + "0,0,12.5,2048\n")
    source = TraceSource(path, parse_devices("1"), start_time=T0)
    assert usage(source, T0) == [(12.5, 2048)]


def test_trace_names_the_devices_when_none_are_given(two_devices: Path) -> None:
    source = TraceSource(two_devices, None, start_time=T0)
    assert [(d.index, d.memory_mib) for d in source.devices()] == [(0, 81920), (1, 81920)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "0,0,10,1000\n5,0,10,x\n",
            "trace.csv line 3: online_memory_mib: expected a number, got 'x'",
        ),
        ("zero,0,10,1000\n", "trace.csv line 2: t_s: expected a number, got 'zero'"),
        ("0,0,ten,1000\n", "trace.csv line 2: online_compute_pct: expected a number, got 'ten'"),
        ("0,0,nan,1000\n", "trace.csv line 2: online_compute_pct: expected a finite number"),
        ("0,0,120,1000\n", "trace.csv line 2: online_compute_pct: expected a percentage"),
        ("0,0,10,-1\n", "trace.csv line 2: online_memory_mib: must not be negative"),
        ("-1,0,10,10\n", "trace.csv line 2: t_s: must not be negative"),
        ("0,a,10,10\n", "trace.csv line 2: device: expected a device index"),
        ("0,0,10,10\n\n0,2,10,10\n", "trace.csv line 4: device: index 2 is not one of the 2"),
        ("0,0,10\n", "trace.csv line 2: expected 4 fields, got 3"),
        ("", "trace.csv: the trace has a header but no rows"),
    ],
)
def test_parse_errors_name_file_line_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(ValueError) as info:
        TraceSource(path, parse_devices("2x80GiB"))
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_bad_header(tmp_path: Path) -> None:
    path = write(tmp_path, "0,0,1,1\n", header="time,device,compute,memory\n")
    with pytest.raises(ValueError, match=r"line 1: expected the header t_s,device,"):
        TraceSource(path, parse_devices("1"))


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the trace"):
        TraceSource(tmp_path / "nope.csv", parse_devices("1"))
    bad_gz = tmp_path / "bad.csv.gz"
    bad_gz.write_text("not gzip")
    with pytest.raises(ValueError, match=r"bad\.csv\.gz"):
        TraceSource(bad_gz, parse_devices("1"))


def test_bad_arguments(two_devices: Path) -> None:
    with pytest.raises(ValueError, match="speedup"):
        TraceSource(two_devices, parse_devices("2x80GiB"), speedup=0)
    with pytest.raises(ValueError, match="at least one device"):
        TraceSource(two_devices, [])


def test_100k_rows_sample_in_logarithmic_time(tmp_path: Path) -> None:
    rows = [f"{k},{k % 2},{k % 100},{k}\n" for k in range(100_000)]
    path = write(tmp_path, "".join(rows), name="big.csv")
    source = TraceSource(path, parse_devices("2x80GiB"), start_time=0.0)
    assert usage(source, 77_777.5) == [(76, 77_776), (77, 77_777)]
    started = time.perf_counter()
    for k in range(5_000):
        source.sample(k * 19.99)
    # a linear scan would take seconds; bisect takes milliseconds
    assert time.perf_counter() - started < 1.0


def test_shipped_demo_trace() -> None:
    path = Path(str(resources.files("ebbtide").joinpath("data", "genai_sample.csv")))
    source = TraceSource(path, parse_devices("2x80GiB"), start_time=0.0)
    assert 80 <= source.duration_s <= 100
    series = [[] for _ in range(2)]
    for k in range(0, int(source.duration_s * 10)):
        for device, (compute, memory) in enumerate(usage(source, k / 10)):
            series[device].append((compute, memory))
    for device_series in series:
        computes = [c for c, _ in device_series]
        memories = [m for _, m in device_series]
        assert max(computes) - min(computes) >= 50  # a clear compute spike
        assert max(memories) - min(memories) >= 10_000  # and a clear memory swing


def test_factory_opens_traces(two_devices: Path) -> None:
    source = open_source(f"trace:{two_devices}@10x", parse_devices("2x80GiB"))
    assert isinstance(source, TraceSource)
    assert source.speedup == 10
    assert open_source(f"trace:{two_devices}", None, speedup=3).speedup == 3  # type: ignore[attr-defined]
    assert len(open_source(f"trace:{two_devices}", None).devices()) == 2


def test_factory_finds_the_shipped_trace_by_name() -> None:
    source = open_source("trace:genai_sample.csv@30x", None, loop=True)
    assert isinstance(source, TraceSource)
    assert source.loop
    assert len(source.devices()) == 2


@pytest.mark.parametrize("spec", ["trace:", "trace", "trace:x.csv@0x"])
def test_factory_rejects_bad_trace_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="expected nvml, static"):
        open_source(spec, None)


def test_factory_reports_a_missing_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the trace"):
        open_source(f"trace:{tmp_path / 'missing.csv'}", None)


def test_the_live_replay_holds_its_last_row_and_says_so_once(
    two_devices: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--headroom trace:FILE@10x`` held the trace's last row for ever once it ended,
    silently: a flat line was taken for the trace.  It holds (a replayed spike stays, as
    the README says) and warns once."""
    source = open_source(f"trace:{two_devices}@10x", parse_devices("2x80GiB"))
    assert isinstance(source, TraceSource) and not source.loop
    source.sample(T0)  # the origin; the trace lasts 25 s, 2.5 s at 10x
    caplog.set_level("INFO", logger="ebbtide.headroom")
    assert usage(source, T0 + 2.4) == [(5, 500), (0, 100)]
    assert not caplog.records
    for k in range(1, 6):
        assert usage(source, T0 + 2.5 * k) == [(5, 500), (0, 100)]
    [said] = caplog.records
    assert said.levelname == "WARNING" and str(two_devices) in said.getMessage()
    assert "25 s of trace, 2.5 s at 10x" in said.getMessage()
    assert "holding its last values" in said.getMessage()


def test_a_looping_trace_says_once_that_it_starts_over(
    two_devices: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = TraceSource(two_devices, parse_devices("2x80GiB"), start_time=T0, loop=True)
    caplog.set_level("INFO", logger="ebbtide.headroom")
    usage(source, T0 + 24)
    assert not caplog.records
    for k in range(1, 4):
        assert usage(source, T0 + 25 * k + 6) == usage(source, T0 + 6)
    [said] = caplog.records
    assert said.levelname == "INFO" and "starting it over" in said.getMessage()
