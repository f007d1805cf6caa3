"""``ebb policy check`` and ``explain`` as a new user met them (a trial's traps): every
error of a file in one run, the help naming the real subcommands, a directory given as
the file, an unquoted ``7:30``, and explain's horizon and zones."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.cli.policy_cmd import explain_data
from ebbtide.config.policy import parse_policy
from tests.unit.test_policy_traps import _problems as every_problem

#: Six problems of three kinds: values YAML cannot build, values validation refuses, and
#: references across sections; each used to show only after the ones before were fixed.
SIX = """\
devices:
  pools:
    big: ["gpu-a/*"]
queues:
  batch:
    priority: high
    aliases: [gpu]
windows:
  - {name: n, kind: cron, schedule: "0 22 * * *", until: 7:30}
  - {name: m, kind: cron, schedule: "0 1 * * *", duration: 1h, queues: [nope], pool: small}
  - {name: x, kind: cron, schedule: "0 1 * * *", duration: 1h, except: [2026-02-30]}
  - {name: n, kind: cron, schedule: "0 1 * * *", duration: 1h, queues: [gpu]}
"""


def _problems(text: str) -> list[tuple[int, str, str]]:
    """Every problem of a policy text as (line, field path, message)."""
    return [(line, path, message) for line, _, path, message in every_problem(text)]


def _env(tmp_path: Path) -> dict[str, str]:
    return {"EBBTIDE_HOME": str(tmp_path / "home"), "EBBTIDE_POLICY": ""}


def test_check_reports_every_problem_of_the_file_at_once() -> None:
    problems = _problems(SIX)
    assert [(line, path) for line, path, _ in problems] == [
        (6, "queues.batch.priority"),
        (9, "windows.0.until"),
        (10, "windows.1.queues.0"),
        (10, "windows.1.pool"),
        (11, "windows.2.except.0"),
        (12, "windows.3.name"),
        (12, "windows.3.queues.0"),
    ]
    messages = dict((path, msg) for _, path, msg in problems)
    assert messages["windows.2.except.0"].startswith("cannot read '2026-02-30'")
    assert "unknown queue 'nope'" in messages["windows.1.queues.0"]
    assert "unknown device pool 'small'" in messages["windows.1.pool"]
    assert "already used by window 0" in messages["windows.3.name"]  # window 0 is invalid
    assert "'gpu' is an alias of queue 'batch'" in messages["windows.3.queues.0"]


def test_a_value_yaml_cannot_build_is_reported_once_beside_the_others() -> None:
    problems = _problems(
        "defaults: {deadline_s: 2026-02-30, margin_compute_pct: -1}\n"
        "windows:\n  - {name: a, kind: cron, schedule: '0 1 * * *', duration: 1h,"
        " except: [2026-02-30, 2026-13-01]}\n"
    )
    assert [path for _, path, _ in problems] == [
        "defaults.deadline_s",
        "defaults.margin_compute_pct",
        "windows.0.except.0",
        "windows.0.except.1",
    ]
    assert all("cannot read" in m for _, p, m in problems if p != "defaults.margin_compute_pct")


def test_checks_that_need_an_invalid_section_are_skipped_not_guessed() -> None:
    # devices is invalid: the pool a window names may be one of its pools
    problems = _problems(
        "devices: {pools: 3}\nwindows:\n"
        "  - {name: a, kind: cron, schedule: '0 1 * * *', duration: 1h, pool: big}\n"
    )
    assert [path for _, path, _ in problems] == ["devices.pools"]
    # a queue whose aliases cannot be read: the name a window gives may be one of them
    problems = _problems(
        "queues:\n  a: {aliases: ['no spaces', gpu]}\nwindows:\n"
        "  - {name: w, kind: cron, schedule: '0 1 * * *', duration: 1h, queues: [gpu]}\n"
    )
    assert [path for _, path, _ in problems] == ["queues.a.aliases.0"]
    # but a queue invalid otherwise still has its aliases, and deadlines of the valid ones
    problems = _problems(
        "queues:\n  a: {priority: x, aliases: [gpu]}\n"
        "  b: {deadline_s: 1m, max_deadline_s: 10s}\nwindows:\n"
        "  - {name: w, kind: cron, schedule: '0 1 * * *', duration: 1h, queues: [gpu, c]}\n"
    )
    assert [path for _, path, _ in problems] == [
        "queues.a.priority",
        "queues.b.deadline_s",
        "windows.0.queues.0",
        "windows.0.queues.1",
    ]


@pytest.mark.parametrize(
    ("until", "hint"),
    [
        ("7:30", 'YAML reads an unquoted 7:30 as a number; write it quoted: "7:30"'),
        ("23:05", 'write it quoted: "23:05"'),
        ("7.30", 'write it quoted, like "07:30"'),
    ],
)
def test_an_unquoted_time_of_day_says_to_quote_it(until: str, hint: str) -> None:
    [(line, path, message)] = _problems(
        f"windows:\n  - {{name: n, kind: cron, schedule: '0 22 * * *', until: {until}}}\n"
    )
    assert (line, path) == (2, "windows.0.until")
    assert hint in message and "valid string" not in message
    parse_policy("windows:\n  - {name: n, kind: cron, schedule: '0 22 * * *', until: '7:30'}\n")


def test_policy_help_names_only_the_real_subcommands() -> None:
    result = CliRunner().invoke(cli, ["policy", "--help"])
    assert result.exit_code == 0
    assert "describe" not in result.output
    for name in ("check", "explain", "schema"):
        assert name in result.output
    assert CliRunner().invoke(cli, ["policy", "describe"]).exit_code != 0


@pytest.mark.parametrize("as_json", [True, False])
def test_check_of_a_directory_is_an_error_with_exit_1(tmp_path: Path, as_json: bool) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    args = ["policy", "check", *(["--json"] if as_json else []), str(folder)]
    result = CliRunner().invoke(cli, args, env=_env(tmp_path))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    if as_json:
        data = json.loads(result.stdout)
        assert data["ok"] is False and data["file"] == str(folder)
        assert "is a directory" in data["errors"][0]
    else:
        assert f"{folder}: the policy file is a directory" in result.output


def test_check_as_json_lists_every_error(tmp_path: Path) -> None:
    path = tmp_path / "ebbtide.yaml"
    path.write_text(SIX)
    result = CliRunner().invoke(cli, ["policy", "check", "--json", str(path)], env=_env(tmp_path))
    assert result.exit_code == 1
    assert len(json.loads(result.stdout)["errors"]) == 7


ALWAYS = """
windows:
  - {name: always, kind: cron, schedule: "0 0 * * *", duration: 24h}
  - {name: release-day, kind: blackout, schedule: "0 9 * * 2", until: "18:00",
     timezone: Europe/Berlin}
"""


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_explain_an_always_open_window_shows_no_fake_close() -> None:
    policy = parse_policy(ALWAYS.split("  - {name: release-day")[0], "p.yaml")
    info = explain_data(policy, _at("2026-12-01T12:00+00:00"), None)["queues"]["default"]
    assert info["allowed"] is True and info["open_until"] is None
    assert info["no_close_within_days"] >= 30
    # a close that is real (here a blackout's start) is still shown
    policy = parse_policy(ALWAYS, "p.yaml")
    info = explain_data(policy, _at("2026-12-02T12:00+00:00"), None)["queues"]["default"]
    assert info["open_until"] == "2026-12-08T08:00:00+00:00"
    assert "no_close_within_days" not in info


def test_explain_says_the_zone_of_a_blackouts_local_close(tmp_path: Path) -> None:
    policy = parse_policy(ALWAYS, "p.yaml")
    info = explain_data(policy, _at("2026-12-01T12:00+00:00"), None)["queues"]["default"]
    assert info["reason"] == "blackout 'release-day' until 18:00 Europe/Berlin"


def test_explain_text_says_no_close_and_how_an_offsetless_at_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ebbtide.yaml"
    path.write_text(ALWAYS.split("  - {name: release-day")[0])
    args = ["policy", "explain", "--policy", str(path), "--at", "2026-12-01T12:00"]
    result = CliRunner().invoke(cli, args, env=_env(tmp_path))
    assert result.exit_code == 0, result.output
    assert re.search(r"queue default: allowed \(no close within \d+ days\)", result.stdout)
    assert "2027-" not in result.stdout
    assert "has no UTC offset: read as this machine's local time" in result.stderr
    helped = CliRunner().invoke(cli, ["policy", "explain", "--help"])
    assert "without an offset, this machine's local time" in " ".join(helped.output.split())


def test_explain_with_no_windows_says_always_not_until_no_known_end(tmp_path: Path) -> None:
    # (it said "allowed until no known end")
    path = tmp_path / "ebbtide.yaml"
    path.write_text("queues:\n  default: {}\n")
    result = CliRunner().invoke(
        cli, ["policy", "explain", "--policy", str(path)], env=_env(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert "queue default: allowed (no windows: always), share 1" in result.stdout
    assert "until no known end" not in result.stdout


ONE_QUEUE_WINDOW = """\
windows:
  - {name: nights, kind: cron, schedule: "0 22 * * *", duration: 8h, queues: [research]}
queues:
  research: {}
  training: {}
"""


def test_check_and_qsub_warn_of_a_queue_no_window_admits(tmp_path: Path) -> None:
    # (a window limited to one queue closed every other one for good, and check said "ok")
    path = tmp_path / "ebbtide.yaml"
    path.write_text(ONE_QUEUE_WINDOW)
    assert parse_policy(ONE_QUEUE_WINDOW, "p.yaml").unwindowed_queues() == ["default", "training"]
    env = _env(tmp_path)
    checked = CliRunner().invoke(cli, ["policy", "check", str(path)], env=env)
    assert checked.exit_code == 0, checked.output  # valid: a warning, not an error
    assert "warning: queue 'training' is admitted by no cron or lull window" in checked.stderr
    assert "queue 'research'" not in checked.stderr
    as_json = json.loads(CliRunner().invoke(cli, ["policy", "check", "--json", str(path)]).stdout)
    assert [w.split(" is ")[0] for w in as_json["warnings"]] == [
        "queue 'default'",
        "queue 'training'",
    ]
    env["EBBTIDE_POLICY"] = str(path)
    waits = CliRunner().invoke(cli, ["qsub", "-q", "training", "--", "true"], env=env)
    assert waits.exit_code == 0, waits.output
    said = "queue 'training' is admitted by no window of the policy: its jobs never run until"
    assert said in waits.stderr  # ("the job waits" read as if it would run one day)
    runs = CliRunner().invoke(cli, ["qsub", "-q", "research", "--", "true"], env=env)
    assert "admitted by no window" not in runs.stderr
    # no windows, or one that names no queues: every queue is admitted
    assert parse_policy("queues:\n  a: {}\n", "p.yaml").unwindowed_queues() == []
    every = ONE_QUEUE_WINDOW.replace(", queues: [research]", "")
    assert parse_policy(every, "p.yaml").unwindowed_queues() == []


SPLIT = """\
apiVersion: ebbtide/v1
queues:
  default: {}
  night: {}
devices:
  pools:
    spare: ["gpu-a/*"]
windows:
  - {name: nightly, kind: cron, schedule: "0 22 * * *", duration: 8h, queues: [night]}
  - {name: always, kind: cron, schedule: "0 0 * * *", duration: 24h, queues: [default]}
"""


def test_explain_says_for_which_queues_and_of_a_device_no_pool_names(tmp_path: Path) -> None:
    # (the headline said "allowed" while a queue was refused below it, and --device
    # nosuch/9 was explained as if it named a device of a pool)
    path = tmp_path / "ebbtide.yaml"
    path.write_text(SPLIT)
    args = ["policy", "explain", "--policy", str(path), "--at", "2026-12-01T12:00+00:00"]
    day = CliRunner().invoke(cli, [*args, "--device", "nosuch/9"], env=_env(tmp_path))
    assert day.exit_code == 0, day.output
    assert day.stdout.splitlines()[1] == (
        "at 2026-12-01T12:00:00+00:00 on nosuch/9: offline work allowed for queue default, "
        "not for queue night (share up to 1)"
    )
    assert day.stderr == (
        "ebb: note: --device nosuch/9: in none of this policy's device pools (spare)\n"
    )
    night = CliRunner().invoke(
        cli, [*args[:-1], "2026-12-01T23:00+00:00", "--device", "gpu-a/1"], env=_env(tmp_path)
    )
    assert "offline work allowed (share up to 1)" in night.stdout and not night.stderr
    path.write_text(SPLIT.split("devices:")[0])  # no pools: every device alike
    alike = CliRunner().invoke(cli, [*args, "--device", "x/1"], env=_env(tmp_path))
    assert "no device pools, so every device is explained alike" in alike.stderr
