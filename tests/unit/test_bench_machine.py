"""``benchmarks/bench_machine.py``: the machine a benchmark's figures were taken on."""

from __future__ import annotations

import platform
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: its globals: the benchmarks are scripts, not a package (their scripts import it beside them)
bench = runpy.run_path(str(REPO / "benchmarks" / "bench_machine.py"))
cpu_model, machine = bench["cpu_model"], bench["machine"]


def test_cpu_model_is_the_first_model_name(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "\nprocessor\t: 1\nmodel name\t: Other\n"
    )
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"


def test_cpu_model_without_a_model_name_asks_platform(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t:\nhart\t: 0\n")  # empty, as on some arm64
    expected = platform.processor() or platform.machine() or "unknown"
    assert cpu_model(cpuinfo) == expected
    assert cpu_model(tmp_path / "missing") == expected


def test_machine_names_what_the_figures_depend_on() -> None:
    m = machine()
    assert set(m) == {"cpu_model", "cpus", "memory_gib", "system", "python"}
    assert m["cpus"] >= 1 and m["memory_gib"] > 0 and m["cpu_model"]
    assert m["python"].split()[-1].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
