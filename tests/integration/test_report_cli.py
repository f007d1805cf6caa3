"""``ebb report`` as a person runs it, on a store in a temporary ``EBBTIDE_HOME`` that holds
the history of :mod:`tests.report_fleet` (it ended an hour ago): the text, ``--json``,
``--plot`` and the refusals of what it cannot read."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ebbtide.cli.main import cli
from ebbtide.clock import FakeClock
from ebbtide.queue.store import Store
from tests.report_fleet import GPU_SECONDS, WINDOW, make_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture
def t0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """The history's start, two hours ago, to the second."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EBBTIDE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    clock = FakeClock(float(int(time.time()) - 7200))
    start = clock.time()
    store = Store(f"sqlite:///{home / 'ebbtide.db'}", clock=clock)
    try:
        make_history(store, clock)
    finally:
        store.close()
    return start


def ebb(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, ["report", *args])
    assert result.exit_code == code, result.output
    return result


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t).astimezone().isoformat()


def _window(t0: float) -> list[str]:
    return ["--since", _iso(t0 + WINDOW[0]), "--until", _iso(t0 + WINDOW[1])]


def test_the_text_has_a_summary_then_queues_and_users(t0: float) -> None:
    text = ebb(*_window(t0)).stdout
    lines = text.splitlines()
    assert lines[0].startswith("ebb report: ") and "(43m20s)" in lines[0]
    harvest = next(line for line in lines if "GPU-hours harvested" in line)
    assert harvest.split()[-1] == f"{GPU_SECONDS / 3600:.3f}"
    assert "5 submitted, 1 succeeded, 1 failed, 1 cancelled; 5 attempts" in text
    assert "2: 1 deadline miss, 1 killed at the deadline" in text
    assert "p50 2.00s, p99 31.50s, max 31.50s" in text
    assert "ebbtide_online_compute_ratio" in text  # online history: where it is
    lost = next(line for line in lines if "attempts lost" in line)
    assert lost.split()[-1] == "0"  # none here: test_report counts them by reason
    queues = lines[lines.index("by queue") + 1 : lines.index("by user") - 1]
    assert queues[0].split()[:3] == ["QUEUE", "GPU-H", "MEM"]
    assert [row.split()[0] for row in queues[1:]] == ["batch", "default"]
    users = lines[lines.index("by user") + 1 :]
    assert [row.split()[0] for row in users[1:3]] == ["alice", "bob"]
    reasons = [line.split()[0] for line in lines if line.startswith("  online_")]
    assert reasons == ["online_compute", "online_memory"]
    assert "compute_pct / 100 on each device" in text  # how it is counted


def test_the_default_window_is_the_last_day(t0: float) -> None:
    data = json.loads(ebb("--json").stdout)
    assert data["window"]["until"] - data["window"]["since"] == pytest.approx(86400, abs=5)
    # carol's job, before the hour the other tests look at, is in the day
    assert data["overall"]["jobs"]["submitted"] == 6 and "carol" in data["users"]


def test_json_and_filters(t0: float) -> None:
    data = json.loads(ebb(*_window(t0), "--json").stdout)
    assert data["overall"]["gpu_hours"] == pytest.approx(GPU_SECONDS / 3600, abs=1e-5)
    assert data["window"]["since"] == t0 + WINDOW[0]
    assert sorted(data["queues"]) == ["batch", "default"]
    assert set(data["counting"]) >= {"gpu_hours", "evictions", "queue_wait", "fleet"}
    bob = json.loads(ebb(*_window(t0), "--json", "--queue", "batch", "-u", "bob").stdout)
    assert bob["filters"] == {"queue": "batch", "user": "bob"}
    assert list(bob["users"]) == ["bob"] and bob["overall"]["evictions"]["count"] == 1
    assert "queue batch, user bob" in ebb(*_window(t0), "-q", "batch", "-u", "bob").stdout


def test_plot_writes_a_png(t0: float, tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("matplotlib is in the dev extra: CI=true must draw the plot")
        pytest.skip("matplotlib is not installed (pip install 'ebbtide[plot]')")
    out = tmp_path / "report.png"
    result = ebb(*_window(t0), "--plot", str(out))
    assert result.stdout.rstrip().endswith(f"plot: {out}")
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    # with --json, stdout stays JSON
    json_out = tmp_path / "json.png"
    result = ebb("--json", "--plot", str(json_out))
    assert json.loads(result.stdout)["overall"]["jobs"]["submitted"] == 6
    assert json_out.read_bytes().startswith(PNG_SIGNATURE)


def test_a_plot_file_name_that_cannot_be_drawn_is_named_before_anything_is_written(
    t0: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's traps: ``--plot ""`` wrote a hidden ``.png`` and exited 0, and
    ``--plot week.txt`` gave matplotlib's own words, not naming ``--plot``."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    for name in ("", ".png"):
        result = ebb("--plot", name, code=1)
        assert result.output.startswith(f"ebb: error: --plot {name!r}: give a file name")
    result = ebb("--plot", "week.txt", code=1)
    assert result.output.startswith("ebb: error: --plot week.txt: cannot draw a .txt file")
    assert ".png" in result.output and [p.name for p in tmp_path.iterdir()] == ["home"]


def test_plot_without_matplotlib_says_how_to_install_it(
    t0: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    result = ebb("--plot", str(tmp_path / "r.png"), code=1)
    assert "pip install 'ebbtide[plot]'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r.png").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "yesterday"], "--since: expected an ISO timestamp (2024-05-01T09:00"),
        (["--until", "10:00"], "--until: expected an ISO timestamp"),
        (["--since", "1h", "--until", "2h"], "must be before its end"),
        (["--since", "now"], "must be before its end"),
        (["--since", "400d"], "at most 366 days"),
        (["--since", "2020-01-01", "--until", "2022-01-01"], "at most 366 days"),
        (["--queue", ""], "queue"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(t0: float, args: list[str], says: str) -> None:
    result = ebb(*args, code=1)
    assert result.output.startswith("ebb: error: ") and says in result.output, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_no_store_is_an_error_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "nowhere"))
    result = ebb(code=1)
    assert "there is no ebbtide store" in result.output
    assert not (tmp_path / "nowhere").exists()
