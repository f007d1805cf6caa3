"""The policy file: defaults, strictness, and errors that say file, line and column."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ebbtide.config.policy import API_VERSION, Policy, load_policy, parse_policy
from ebbtide.errors import ConfigError, UserError


def _yaml(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def test_defaults_without_a_file() -> None:
    policy = load_policy(None)
    assert policy == Policy()
    assert policy.apiVersion == API_VERSION
    assert policy.defaults.margin_compute_pct == 5.0
    assert policy.defaults.margin_memory_mib == 2048
    assert policy.defaults.deadline_s == 30.0
    assert policy.defaults.heartbeat_timeout_s == 10.0
    assert policy.defaults.dispatch_timeout_s == 30.0
    assert list(policy.queues) == ["default"]
    assert policy.queues["default"].priority == 0
    assert policy.admins == []
    assert policy.deadline_for("default") == 30.0
    margins = policy.defaults.margins
    assert (margins.compute_pct, margins.memory_mib) == (5.0, 2048.0)


def test_a_file_with_only_its_version_means_defaults() -> None:
    assert parse_policy("apiVersion: ebbtide/v1\n", "p.yaml") == Policy()


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_file_is_an_error_not_the_defaults(text: str) -> None:
    with pytest.raises(ConfigError, match=r"p.yaml:1:1: the policy file is empty"):
        parse_policy(text, "p.yaml")


def test_full_file_with_units() -> None:
    policy = parse_policy(
        _yaml(
            """
            apiVersion: ebbtide/v1
            defaults:
              margin_compute_pct: 10
              margin_memory_mib: 4GiB
              deadline_s: 2m
              heartbeat_timeout_s: 15s
              dispatch_timeout_s: 45
            queues:
              default: {}
              fast:
                priority: 10
                deadline_s: 5s
            admins: [bob, carol]
            """
        ),
        "p.yaml",
    )
    d = policy.defaults
    assert (d.margin_compute_pct, d.margin_memory_mib, d.deadline_s) == (10, 4096, 120.0)
    assert (d.heartbeat_timeout_s, d.dispatch_timeout_s) == (15.0, 45.0)
    assert policy.queues["fast"].priority == 10
    assert policy.deadline_for("fast") == 5.0
    assert policy.deadline_for("default") == 120.0  # no queue deadline: the default's
    assert policy.admins == ["bob", "carol"]


def test_load_policy_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ebbtide.yaml"
    path.write_text("queues:\n  gpu:\n    priority: 3\n")
    assert load_policy(path).queues["gpu"].priority == 3


def test_load_policy_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_policy(path)


@pytest.mark.parametrize(
    ("text", "where", "path", "said"),
    [
        ("bogus: 1\n", "p.yaml:1:1", "bogus", "unknown key"),
        (
            "defaults:\n  margin_cpu_pct: 5\n",
            "p.yaml:2:3",
            "defaults.margin_cpu_pct",
            "unknown key; did you mean 'margin_compute_pct'?",
        ),
        (
            "queues:\n  gpu:\n    priorty: 3\n",
            "p.yaml:3:5",
            "queues.gpu.priorty",
            "unknown key; did you mean 'priority'?",  # (qsub -l gpumen said so; this not)
        ),
        # a trial's trap: "did you mean 'max_running'?" of max_running itself, a queue's
        (
            "defaults:\n  max_running: 3\n",
            "p.yaml:2:3",
            "defaults.max_running",
            "unknown key here; 'max_running' is a setting of queues.NAME",
        ),
        (
            "defaults:\n  max_runing: 3\n",
            "p.yaml:2:3",
            "defaults.max_runing",
            "unknown key; did you mean 'max_running' (a setting of queues.NAME)?",
        ),
        (
            "queues:\n  gpu:\n    pause_drain: 3\n",
            "p.yaml:3:5",
            "queues.gpu.pause_drain",
            "unknown key; did you mean 'pause_drain_s'?",
        ),
        (
            "max_pause_s: 60\n",
            "p.yaml:1:1",
            "max_pause_s",
            "unknown key here; 'max_pause_s' is a setting of defaults",
        ),
    ],
)
def test_unknown_keys_are_errors(text: str, where: str, path: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value) == f"{where}: {path}: {said}"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("queues:\n  b:\n    max_running: -4\n", "greater than or equal to 1, got -4"),
        (
            "queues:\n  b:\n    max_fleet_share: lots\n",
            "Input should be a valid number, unable to parse string as a number, got 'lots'",
        ),
    ],
)
def test_a_value_out_of_bounds_or_of_the_wrong_type_is_shown_beside_the_rule(
    text: str, said: str
) -> None:
    # (pydantic's "Input should be greater than or equal to 1" left out what was given)
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).endswith(said)


def test_all_errors_are_reported_at_once() -> None:
    text = _yaml(
        """
        apiVersion: ebbtide/v1
        defaults:
          margin_compute_pct: 150
          bogus: 1
        queues:
          gpu:
            priority: 5000
            deadline_s: 10s
        extra_top: true
        """
    )
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "ebbtide.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 4
    for line in lines:
        assert re.match(r"^ebbtide\.yaml:\d+:\d+: \S+: .+", line), line
    by_path = {line.split(": ")[1]: line.split(": ")[0] for line in lines}
    assert by_path == {
        "defaults.margin_compute_pct": "ebbtide.yaml:3:3",
        "defaults.bogus": "ebbtide.yaml:4:3",
        "queues.gpu.priority": "ebbtide.yaml:7:5",
        "extra_top": "ebbtide.yaml:9:1",
    }
    assert "100" in next(x for x in lines if "margin_compute_pct" in x)
    assert "1023" in next(x for x in lines if "priority" in x)


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("defaults:\n  deadline_s: 0\n", "p.yaml:2:3", ["defaults.deadline_s", "0"]),
        ("defaults:\n  margin_memory_mib: lots\n", "p.yaml:2:3", ["4GiB", "lots"]),
        ("defaults:\n  heartbeat_timeout_s: soon\n", "p.yaml:2:3", ["30s", "soon"]),
        ("apiVersion: ebbtide/v2\n", "p.yaml:1:1", ["apiVersion", "ebbtide/v1"]),
        ("admins: bob\n", "p.yaml:1:1", ["admins"]),
    ],
)
def test_bad_values_name_place_and_allowed_values(text: str, where: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    message = str(info.value)
    assert message.startswith(where + ": ")
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("defaults:\n  deadline_s: 30s\n  margin: a: b\n", 3),
        ("queues:\n  gpu: {priority: 1\nadmins: []\n", 3),
        ("admins:\n\t- bob\n", 2),
    ],
)
def test_yaml_syntax_error_has_the_line(text: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    message = str(info.value)
    assert re.match(rf"^p\.yaml:{line}:\d+: YAML syntax error: ", message), message


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^p\.yaml:1:1: .*mapping"):
        parse_policy("- 1\n- 2\n", "p.yaml")


def test_config_error_is_a_user_error() -> None:
    assert issubclass(ConfigError, UserError)


def test_policy_is_frozen() -> None:
    policy = Policy()
    with pytest.raises(ValueError):
        policy.admins = ["x"]  # type: ignore[misc]


def test_check_queue() -> None:
    policy = parse_policy("queues:\n  default: {}\n  gpu: {priority: 5}\n", "p.yaml")
    policy.check_queue("gpu")
    policy.check_queue("default")
    with pytest.raises(ConfigError) as info:
        policy.check_queue("nope")
    message = str(info.value)
    assert "'nope'" in message
    assert "default, gpu" in message  # the known queues, so the user can pick one


def test_suspend_to_host_is_off_by_default() -> None:
    """Not yet measured on a real GPU: memory shortage evicts unless a file says auto."""
    d = Policy().defaults
    assert d.suspend_to_host == "never"
    rules = d.pause_rules()
    assert rules.suspend is False
    assert (rules.max_suspend_s, rules.restore_hysteresis_mib) == (1800.0, 4096.0)
    assert rules.host_memory_pct == 50.0


def test_suspend_keys_become_the_pause_rules() -> None:
    policy = parse_policy(
        _yaml(
            """
            defaults:
              suspend_to_host: auto
              max_suspend_s: 20m
              suspend_restore_hysteresis_mib: 8GiB
              suspend_host_memory_pct: 25
            """
        ),
        "p.yaml",
    )
    rules = policy.defaults.pause_rules()
    assert rules.suspend is True and rules.enabled is True
    assert rules.max_suspend_s == 1200.0
    assert rules.restore_hysteresis_mib == 8192.0
    assert rules.host_memory_pct == 25.0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("defaults:\n  suspend_to_host: always\n", ["defaults.suspend_to_host", "'auto'"]),
        # YAML reads yes/on/true as booleans: not one of the two words
        ("defaults:\n  suspend_to_host: yes\n", ["defaults.suspend_to_host", "'never'"]),
        ("defaults:\n  max_suspend_s: 0\n", ["defaults.max_suspend_s", "1s to 1d"]),
        ("defaults:\n  max_suspend_s: 2d\n", ["defaults.max_suspend_s", "2d"]),
        ("defaults:\n  suspend_restore_hysteresis_mib: lots\n", ["4GiB", "lots"]),
        ("defaults:\n  suspend_restore_hysteresis_mib: -1\n", ["greater than or equal"]),
        ("defaults:\n  suspend_host_memory_pct: 150\n", ["suspend_host_memory_pct", "100"]),
        ("defaults:\n  suspend_host_memory_pct: on\n", ["suspend_host_memory_pct", "boolean"]),
    ],
)
def test_bad_suspend_values_name_place_and_allowed_values(text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:2:3: "), message
    for word in words:
        assert word in message, message
