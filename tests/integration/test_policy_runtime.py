"""PolicyRuntime against a real policy file: reloads on change or on request, and an
invalid new file keeps the old policy running and logs every error."""

from __future__ import annotations

import datetime as dt
import logging
import os
import textwrap
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ebbtide.config.policy import Policy, load_policy
from ebbtide.scheduling.policy_runtime import PolicyRuntime

DEV = ("n1", 0)
#: Tuesday 2026-11-10, 23:00 in Berlin
NIGHT = dt.datetime(2026, 11, 10, 23, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()

V1 = """\
apiVersion: ebbtide/v1
queues:
  default: {}
windows:
  - name: nights
    kind: cron
    schedule: "0 22 * * *"
    duration: 9h
    timezone: Europe/Berlin
"""

V2 = """\
apiVersion: ebbtide/v1
queues:
  default: {}
  research: {priority: -10}
windows:
  - name: days
    kind: cron
    schedule: "0 8 * * mon-fri"
    until: "18:00"
    timezone: Europe/Berlin
"""

V3 = """\
apiVersion: ebbtide/v1
windows:
  - name: quiet
    kind: lull
    below: {compute_pct: 20, memory: 8GiB}
    for: 5s
    close_above: {compute_pct: 50, memory: 16GiB}
"""

INVALID = [
    pytest.param(
        """\
        windows:
          - name: nights
            kind: cron
            schedule: "0 22 * * funday"
            duration: 9h
          - name: weekends
            kind: cron
            schedule: "0 0 * *"
            duration: 48h
        """,
        [
            ":4:5: windows.0.schedule: '0 22 * * funday': unknown day of week 'funday'",
            ":8:5: windows.1.schedule: '0 0 * *': expected 5 fields",
        ],
        id="bad-cron",
    ),
    pytest.param(
        """\
        defaults:
          deadline: 30s
        windows:
          - name: nights
            kind: cron
            schedule: "0 22 * * *"
            duration: 9h
            timezon: Europe/Berlin
        """,
        [
            ":2:3: defaults.deadline: unknown key",
            ":8:5: windows.0.timezon: unknown key",
        ],
        id="unknown-key",
    ),
    pytest.param(
        """\
        windows:
          - name: nights
            kind: cron
            schedule: "0 22 * * *
            duration: 9h
        """,
        [":6:1: YAML syntax error"],
        id="yaml-syntax",
    ),
]


def write(path: Path, text: str, bump: float) -> None:
    """Write ``text`` and set the modification time ``bump`` seconds after the old one."""
    old = path.stat().st_mtime if path.exists() else 1_700_000_000.0
    path.write_text(textwrap.dedent(text))
    os.utime(path, (old + bump, old + bump))


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "ebbtide.yaml"
    write(path, V1, 0)
    return path


@pytest.fixture
def changes() -> list[Policy]:
    return []


@pytest.fixture
def runtime(policy_file: Path, changes: list[Policy]) -> PolicyRuntime:
    return PolicyRuntime(load_policy(policy_file), policy_file, on_change=changes.append)


def window_names(rt: PolicyRuntime) -> list[str]:
    return [w.name for w in rt.policy.windows]


def test_nothing_to_reload_until_the_file_changes(
    runtime: PolicyRuntime, changes: list[Policy]
) -> None:
    assert runtime.maybe_reload() is False
    assert runtime.maybe_reload() is False
    assert changes == []
    assert window_names(runtime) == ["nights"]


def test_a_changed_file_is_picked_up(
    runtime: PolicyRuntime, policy_file: Path, changes: list[Policy]
) -> None:
    gates = runtime.gates(NIGHT, [DEV])
    assert gates is not None and "default" in gates[DEV].open
    write(policy_file, V2, 10)
    assert runtime.maybe_reload() is True
    assert changes == [runtime.policy]
    assert window_names(runtime) == ["days"]
    assert set(runtime.policy.queues) == {"default", "research"}
    # the new windows are the ones obeyed
    gates = runtime.gates(NIGHT, [DEV])
    assert gates is not None
    assert gates[DEV].closed["default"] == "window 'days' opens Wed 08:00 Europe/Berlin"
    # once only
    assert runtime.maybe_reload() is False
    assert len(changes) == 1


def test_request_reload_forces_it(
    runtime: PolicyRuntime, policy_file: Path, changes: list[Policy]
) -> None:
    # same file: a requested reload still happens (SIGHUP)
    runtime.request_reload()
    assert runtime.maybe_reload() is True
    assert len(changes) == 1 and window_names(runtime) == ["nights"]
    assert runtime.maybe_reload() is False
    # a change hidden behind an unchanged modification time is found on request
    mtime = policy_file.stat().st_mtime
    write(policy_file, V2, 0)
    os.utime(policy_file, (mtime, mtime))
    assert runtime.maybe_reload() is False
    assert window_names(runtime) == ["nights"]
    runtime.request_reload()
    assert runtime.maybe_reload() is True
    assert window_names(runtime) == ["days"]
    assert changes[-1] is runtime.policy and len(changes) == 2


def test_no_file_no_reload(changes: list[Policy]) -> None:
    rt = PolicyRuntime(Policy(), None, on_change=changes.append)
    rt.request_reload()
    assert rt.maybe_reload() is False
    assert changes == []


@pytest.mark.parametrize(("text", "errors"), INVALID)
def test_an_invalid_file_keeps_the_old_policy_and_logs_every_error(
    runtime: PolicyRuntime,
    policy_file: Path,
    changes: list[Policy],
    caplog: pytest.LogCaptureFixture,
    text: str,
    errors: list[str],
) -> None:
    old = runtime.policy
    caplog.set_level(logging.INFO, logger="ebbtide.policy")
    write(policy_file, text, 10)
    assert runtime.maybe_reload() is False
    assert runtime.policy is old
    assert changes == []
    gates = runtime.gates(NIGHT, [DEV])
    assert gates is not None and "default" in gates[DEV].open
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "ebbtide.policy" and r.levelno == logging.ERROR
    ]
    assert len(logged) == len(errors), logged
    for message, error in zip(logged, errors, strict=True):
        assert "keeping the old one" in message
        assert f"{policy_file}{error}" in message, (error, message)

    # the broken file is not re-read (nor re-logged) on every pass
    caplog.clear()
    assert runtime.maybe_reload() is False
    assert caplog.records == []

    # a later valid file is picked up again
    write(policy_file, V2, 10)
    assert runtime.maybe_reload() is True
    assert window_names(runtime) == ["days"]
    assert changes == [runtime.policy]
    assert any(
        r.levelno == logging.INFO and "policy reloaded" in r.getMessage() for r in caplog.records
    )


def test_a_vanished_file_keeps_the_old_policy(
    runtime: PolicyRuntime,
    policy_file: Path,
    changes: list[Policy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = runtime.policy
    policy_file.unlink()
    with caplog.at_level(logging.ERROR, logger="ebbtide.policy"):
        assert runtime.maybe_reload() is False
    assert runtime.policy is old and changes == []
    assert [r.getMessage() for r in caplog.records] == [
        f"policy not reloaded, keeping the old one: {policy_file}: "
        "cannot read the policy file: No such file or directory"
    ]
    write(policy_file, V2, 0)
    assert runtime.maybe_reload() is True
    assert window_names(runtime) == ["days"]


def test_an_invalid_file_keeps_the_lull_state(
    policy_file: Path, changes: list[Policy], caplog: pytest.LogCaptureFixture
) -> None:
    write(policy_file, V3, 10)
    rt = PolicyRuntime(load_policy(policy_file), policy_file, on_change=changes.append)
    for t in range(10):
        rt.observe(*DEV, 1000.0 + t, 0, 0)
    assert rt.lull_open("quiet", *DEV)
    write(policy_file, "windows: [", 10)
    with caplog.at_level(logging.ERROR, logger="ebbtide.policy"):
        assert rt.maybe_reload() is False
    assert rt.lull_open("quiet", *DEV)
    gates = rt.gates(1010.0, [DEV])
    assert gates is not None and "default" in gates[DEV].open


def test_a_reload_keeps_the_state_of_unchanged_lull_windows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ebbtide.config.policy import load_policy
    from ebbtide.scheduling.policy_runtime import PolicyRuntime

    lull = (
        "windows:\n  - {name: quiet, kind: lull, below: {compute_pct: 20, memory: 1GiB},"
        " for: 10s, close_above: {compute_pct: 50, memory: 2GiB}}\n"
    )
    path = tmp_path / "ebbtide.yaml"
    path.write_text(lull)
    rt = PolicyRuntime(load_policy(path), path)
    for t in range(0, 12):
        rt.observe("n", 0, float(t), 5.0, 100.0)
    assert rt.lull_open("quiet", "n", 0)
    path.write_text(lull + "queues:\n  research: {priority: -5}\n")
    rt.request_reload()
    assert rt.maybe_reload()
    assert rt.lull_open("quiet", "n", 0), "an unrelated edit must not close an open lull"
