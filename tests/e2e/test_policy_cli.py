"""``ebb policy check | explain | schema`` as admins use them, and the matrix of bad files."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.helpers import ebb, ebb_env

pytestmark = pytest.mark.e2e

GOOD = """\
apiVersion: ebbtide/v1
queues:
  research: {priority: -5}
windows:
  - name: nights
    kind: cron
    schedule: "0 22 * * mon-fri"
    duration: 9h
    timezone: Europe/Berlin
    max_offline_share: 0.5
  - name: release-day
    kind: blackout
    schedule: "0 3 * * 2"
    duration: 2h
    timezone: Europe/Berlin
"""

_WINDOW = """\
windows:
  - name: nights
    kind: cron
    schedule: "{schedule}"
    duration: 9h
    timezone: {tz}
    max_offline_share: {share}
"""

BAD = {
    "bad-cron": (_WINDOW.format(schedule="0 25 * * *", tz="UTC", share=0.5), 4, "schedule"),
    "bad-dow": (_WINDOW.format(schedule="0 22 * * 9", tz="UTC", share=0.5), 4, "day of week"),
    "unknown-key": ("defaults:\n  margin_compute: 5\n", 2, "unknown key"),
    "negative-share": (
        _WINDOW.format(schedule="0 22 * * *", tz="UTC", share=-0.5),
        7,
        "max_offline_share",
    ),
    "unknown-timezone": (
        _WINDOW.format(schedule="0 22 * * *", tz="Mars/Olympus", share=1),
        6,
        "unknown timezone",
    ),
    "overlapping-names": (
        _WINDOW.format(schedule="0 22 * * *", tz="UTC", share=1)
        + "  - {name: nights, kind: cron, schedule: '0 1 * * *', duration: 1h}\n",
        8,
        "already used",
    ),
    "yaml-syntax": ("windows: [\n  {name: a,\n", 3, "YAML syntax error"),
    "wrong-type": ("queues:\n  default:\n    priority: high\n", 3, "valid integer"),
}


def test_check_accepts_a_good_file_with_a_summary(tmp_path):  # type: ignore[no-untyped-def]
    f = tmp_path / "ebbtide.yaml"
    f.write_text(GOOD)
    out = ebb(ebb_env(tmp_path), "policy", "check", str(f))
    assert (
        out.stdout.strip() == f"{f}: ok: 2 queue(s), 1 cron window(s), 0 lull window(s), "
        "1 blackout(s), 0 device pool(s)"
    )


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_rejects_bad_files_naming_the_line(tmp_path, case):  # type: ignore[no-untyped-def]
    text, line, words = BAD[case]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    proc = ebb(ebb_env(tmp_path), "policy", "check", str(f), check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert re.search(rf"{re.escape(str(f))}:{line}:\d+: ", proc.stderr), proc.stderr
    assert words in proc.stderr


def test_check_json_says_ok_or_every_error(tmp_path):  # type: ignore[no-untyped-def]
    """A trial's trap: ``policy check --json`` was refused as an unknown option."""
    good, bad = tmp_path / "ebbtide.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text("defaults:\n  bogus: 1\nqueues:\n  default: {priority: x}\n")
    out = json.loads(ebb(ebb_env(tmp_path), "policy", "check", str(good), "--json").stdout)
    assert out["ok"] is True and out["file"] == str(good) and "default" in out["queues"]
    proc = ebb(ebb_env(tmp_path), "policy", "check", str(bad), "--json", check=False)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["ok"] is False and len(out["errors"]) == 2
    assert out["errors"][0].startswith(f"{bad}:2:")


def test_all_errors_are_reported_at_once(tmp_path):  # type: ignore[no-untyped-def]
    f = tmp_path / "bad.yaml"
    f.write_text("defaults:\n  bogus: 1\nqueues:\n  default: {priority: x}\nadmins: 3\n")
    proc = ebb(ebb_env(tmp_path), "policy", "check", str(f), check=False)
    assert proc.returncode == 1
    lines = re.findall(rf"{re.escape(str(f))}:(\d+):\d+: ", proc.stderr)
    assert lines == ["2", "4", "5"], proc.stderr


def test_explain_json_says_what_is_open_and_when_it_changes(tmp_path):  # type: ignore[no-untyped-def]
    f = tmp_path / "ebbtide.yaml"
    f.write_text(GOOD)
    env = ebb_env(tmp_path)
    night = json.loads(
        ebb(
            env,
            "policy",
            "explain",
            "--policy",
            str(f),
            "--json",
            "--at",
            "2026-12-01T23:00:00+01:00",
        ).stdout
    )
    assert night["allowed"] is True and night["offline_share"] == 0.5
    [nights, blackout] = night["windows"]
    assert nights == {
        "name": "nights",
        "kind": "cron",
        "pool": None,
        "open": True,
        "next_change": "2026-12-02T06:00:00+00:00",
        "timezone": "Europe/Berlin",
    }
    assert blackout["open"] is False
    noon = json.loads(
        ebb(
            env,
            "policy",
            "explain",
            "--policy",
            str(f),
            "--json",
            "--at",
            "2026-12-01T12:00:00+01:00",
        ).stdout
    )
    assert noon["allowed"] is False and noon["offline_share"] == 0.0
    assert noon["queues"]["research"]["reason"] == "window 'nights' opens 22:00 Europe/Berlin"
    text = ebb(env, "policy", "explain", "--policy", str(f), "--at", "2026-12-01T04:00:00+01:00")
    assert "blackout 'release-day' until 05:00" in text.stdout


def test_schema_is_json_schema_with_the_window_kinds(tmp_path):  # type: ignore[no-untyped-def]
    schema = json.loads(ebb(ebb_env(tmp_path), "policy", "schema").stdout)
    assert schema["additionalProperties"] is False
    assert {"CronWindow", "LullWindow", "BlackoutWindow"} <= set(schema["$defs"])


def test_a_running_scheduler_fed_a_broken_file_keeps_its_old_policy(tmp_path):  # type: ignore[no-untyped-def]
    import signal
    import sys
    import time

    from tests.e2e.helpers import ebb_json, start, stop, wait_for

    f = tmp_path / "ebbtide.yaml"
    f.write_text("apiVersion: ebbtide/v1\nqueues:\n  research: {priority: -5}\n")
    env = ebb_env(tmp_path / "home", EBBTIDE_POLICY=str(f))
    up = start(env, "up", "--devices", "1x80GiB", log=tmp_path / "up.log")
    log = tmp_path / "up.log"
    try:
        wait_for(lambda: "ready:" in log.read_text(), 15, "ebb up to be ready")
        f.write_text("apiVersion: ebbtide/v1\nqueues:\n  research: {priority: high}\n")
        up.send_signal(signal.SIGHUP)
        wait_for(lambda: "policy not reloaded" in log.read_text(), 15, "the reload error")
        assert re.search(rf"{re.escape(str(f))}:3:\d+: queues.research.priority", log.read_text())
        # the old policy still runs: a job of its queue is scheduled and finishes
        f.write_text("apiVersion: ebbtide/v1\nqueues:\n  research: {priority: -5}\n")
        time.sleep(0.1)
        job = ebb_json(env, "qsub", "-q", "research", "--", sys.executable, "-c", "pass")["id"]
        wait_for(
            lambda: ebb_json(env, "qstat", "-f", str(job))["state"] == "succeeded",
            20,
            "the job to succeed",
        )
        assert up.poll() is None
    finally:
        stop(up)
