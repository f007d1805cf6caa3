"""The simulator's inputs: the GenAI and trace: online loads, the openb and synthetic job
streams, and the spellings ``ebb sim`` accepts."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ebbtide.errors import UserError
from ebbtide.scheduling.snapshot import Margins
from ebbtide.sim.cli import parse_clock, parse_jobs, parse_margins, parse_online, parse_quantiles
from ebbtide.sim.jobs import JOB_MEMORY_FLOOR_MIB, load_openb, synthetic
from ebbtide.sim.online import GENAI_DUTY_FILE, GENAI_MEMORY_FILE, load_genai, load_trace_csv
from ebbtide.sim.policies import NIGHT_CLOSES_S, NIGHT_OPENS_S, in_window

GIB_BYTES = 1024**3
#: 2022-09-11 01:12:00 UTC, the GenAI trace's first timestamp: 09:12 in UTC+8
T0 = 1662858720


def write(path: Path, text: str, gz: bool) -> None:
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.fixture(params=[False, True], ids=["plain", "gzip"])
def genai_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Pod a: samples at 0, 57, 114 (the 57 s sample repeats the first); pod b appears at
    57 and has a gap (no 114 sample) and its memory only from 114 on; pod c has no memory."""
    duty = ["value,timestamp_anon,container_ip"]
    for t, v, pod in [
        (0, 10.0, "a"),
        (57, 10.0, "a"),
        (114, 30.0, "a"),
        (57, 5.0, "b"),
        (171, 7.0, "b"),
        (0, 1.0, "c"),
    ]:
        duty.append(f"{v},{T0 + t}.0,{pod}")
    mem = ["timestamp_anon,value,container_ip"]
    for t, gib, pod in [(0, 20, "a"), (57, 20, "a"), (114, 21, "a"), (114, 8, "b")]:
        mem.append(f"{T0 + t}.0,{gib * GIB_BYTES}.0,{pod}")
    write(tmp_path / GENAI_DUTY_FILE, "\n".join(duty) + "\n", request.param)
    write(tmp_path / GENAI_MEMORY_FILE, "\n".join(mem) + "\n", request.param)
    return tmp_path


def test_genai_devices_steps_and_clock(genai_dir: Path) -> None:
    load = load_genai(genai_dir, device_memory_mib=81920.0)
    assert [d.name for d in load.devices] == ["a", "b"]  # c has no memory series
    a, b = load.devices
    assert a.times_s == (0.0, 114.0)  # the repeated sample at 57 changes nothing
    assert a.compute_pct == (10.0, 30.0)
    assert a.memory_mib == (20 * 1024.0, 21 * 1024.0)
    assert a.end_s == 114.0 + 57.0
    assert (b.start_s, b.end_s) == (57.0, 171.0 + 57.0)
    assert b.times_s == (57.0, 171.0)  # the step holds across the gap at 114 …
    assert b.memory_mib == (8 * 1024.0, 8 * 1024.0)  # … and memory before its first sample
    assert load.span_s == 171.0 + 57.0
    assert load.clock_origin_s == 9 * 3600 + 12 * 60


def test_genai_hours_and_devices_cut(genai_dir: Path) -> None:
    load = load_genai(genai_dir, device_memory_mib=81920.0, max_devices=1, hours=100 / 3600)
    assert len(load.devices) == 1
    assert load.span_s == pytest.approx(100.0)
    assert load.devices[0].times_s == (0.0,)
    assert load.devices[0].end_s == pytest.approx(100.0)


def test_genai_dir_without_the_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=GENAI_DUTY_FILE):
        load_genai(tmp_path, device_memory_mib=81920.0)


def test_trace_csv(tmp_path: Path) -> None:
    p = tmp_path / "online.csv"
    p.write_text(
        "t_s,device,online_compute_pct,online_memory_mib\n0,0,10,100\n60,0,10,100\n"
        "30,1,50,2000\n120,0,40,100\n"
    )
    load = load_trace_csv(p, device_memory_mib=40960.0, clock_origin_s=3600.0)
    d0, d1 = load.devices
    assert (d0.times_s, d0.compute_pct) == ((0.0, 120.0), (10.0, 40.0))
    assert (d1.times_s, d1.compute_pct, d1.memory_mib) == ((0.0, 30.0), (0.0, 50.0), (0.0, 2000.0))
    assert d0.end_s == d1.end_s == load.span_s
    assert load.clock_origin_s == 3600.0


OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
OPENB = (
    OPENB_HEADER
    + """p0,1000,1024,1,460,,BE,Running,100,400,100
p1,1000,1024,1,1000,,BE,Running,50,150,50
p2,1000,1024,1,500,,LS,Running,0,100,0
p3,1000,1024,0,0,,BE,Running,0,100,0
p4,1000,1024,1,50,,BE,Running,200,200,200
p5,1000,1024,1,50,,BE,Failed,300,310,300
"""
)


def test_openb_best_effort_gpu_pods_become_jobs(tmp_path: Path) -> None:
    p = tmp_path / "pods.csv"
    p.write_text(OPENB)
    jobs = load_openb(p)
    assert [(j.arrival_s, j.compute_pct, j.gpus, j.work_s) for j in jobs] == [
        (0.0, 100.0, 1, 100.0),  # whole GPU, first created
        (50.0, 46.0, 0, 300.0),
        (250.0, 5.0, 0, 10.0),  # LS, no GPU and no duration are left out
    ]
    assert [j.key for j in jobs] == [0, 1, 2]
    assert [j.memory_mib for j in jobs] == [16384, 7537, JOB_MEMORY_FLOOR_MIB]
    assert jobs[1].ckpt_cost_s == pytest.approx(0.05 + 7537 / 10240)
    assert all(j.cooperative and j.deadline_s == 30.0 for j in jobs)
    assert load_openb(p, job_gpu_memory_mib=81920)[0].memory_mib == 81920


def test_openb_stubborn_share_is_seeded(tmp_path: Path) -> None:
    p = tmp_path / "pods.csv"
    p.write_text(OPENB)
    a = [j.cooperative for j in load_openb(p, stubborn_frac=0.5, seed=1)]
    assert a == [j.cooperative for j in load_openb(p, stubborn_frac=0.5, seed=1)]
    assert not any(j.cooperative for j in load_openb(p, stubborn_frac=1.0))


def test_synthetic_is_seeded_and_mixed() -> None:
    a, b = synthetic(5, span_s=3600.0), synthetic(5, span_s=3600.0)
    assert a == b
    assert a != synthetic(6, span_s=3600.0)
    assert {j.kind for j in a} == {"training", "inference"}
    assert [j.key for j in a] == list(range(len(a)))
    assert all(0 <= j.arrival_s < 3600.0 for j in a)


def test_night_window_wraps_midnight() -> None:
    window = (NIGHT_OPENS_S, NIGHT_CLOSES_S)
    assert [in_window(window, h * 3600.0) for h in (21, 22, 23, 0, 6, 7, 12)] == [
        False,
        True,
        True,
        True,
        True,
        False,
        False,
    ]


def test_spellings() -> None:
    assert parse_margins("3%,1GiB") == Margins(3.0, 1024.0)
    assert parse_quantiles("0.8,1") == (0.8, 1.0)
    assert parse_clock("22:30") == 22 * 3600 + 30 * 60
    for bad in (lambda: parse_margins("x"), lambda: parse_quantiles("2,1")):
        with pytest.raises(UserError):
            bad()
    with pytest.raises(UserError, match="genai:DIR"):
        parse_online("nvml", device_memory_mib=1.0, devices=None, hours=None, clock_start=None)
    with pytest.raises(UserError, match="synthetic"):
        parse_jobs("openb", seed=0, span_s=1.0, job_gpu_memory_mib=1.0, stubborn_frac=0.0)
    with pytest.raises(UserError, match="seed"):
        parse_jobs("synthetic:x", seed=0, span_s=1.0, job_gpu_memory_mib=1.0, stubborn_frac=0.0)
