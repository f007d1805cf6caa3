"""The example policy users copy must stay valid."""

from __future__ import annotations

from pathlib import Path

from ebbtide.config.policy import load_policy, parse_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "ebbtide.yaml"


def test_example_policy_loads_with_its_documented_values() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.defaults.margin_memory_mib == 2048
    assert policy.deadline_for("research") == 10.0
    assert policy.deadline_for("default") == 30.0
    assert policy.queues["training"].preemptible is False
    assert policy.queues["training"].users == ["alice", "bob"]
    assert policy.allow_root_jobs is False
    assert {w.kind for w in policy.windows} == {"cron", "lull", "blackout"}
    assert policy.devices.in_pool("spare-cards", "gpu-a-1", 7)


def test_example_policy_documents_suspend_to_host_off() -> None:
    d = load_policy(EXAMPLE).defaults
    assert d.suspend_to_host == "never" and d.pause_rules().suspend is False
    assert (d.max_suspend_s, d.suspend_restore_hysteresis_mib) == (1800.0, 4096)
    assert d.suspend_host_memory_pct == 50


def test_example_policy_documents_retention_off_and_how_to_turn_it_on() -> None:
    assert load_policy(EXAMPLE).retention.finished_jobs is None  # kept for ever
    text = EXAMPLE.read_text().replace("  #finished_jobs: 90d", "  finished_jobs: 90d")
    retention = parse_policy(text, str(EXAMPLE)).retention
    assert (retention.finished_jobs, retention.batch, retention.every) == (90 * 86400, 1000, 3600)
