"""``ebb policy explain`` without ``--device``: a window limited to a pool and a lull
window, which only a device can answer for (a trial's traps)."""

from __future__ import annotations

from datetime import datetime

from ebbtide.cli.policy_cmd import explain_data
from ebbtide.config.policy import parse_policy

POLICY = """
devices:
  pools:
    spare-cards: ["gpu-a/6", "gpu-a/7"]
windows:
  - {name: spare-always, kind: cron, schedule: "0 0 * * *", duration: 24h, pool: spare-cards}
  - name: quiet
    kind: lull
    below: {compute_pct: 20, memory: 40GiB}
    for: 10m
    close_above: {compute_pct: 35, memory: 50GiB}
"""
NOON = datetime.fromisoformat("2026-12-02T12:00:00+00:00").timestamp()


def test_a_pool_window_says_it_is_open_on_its_pool_and_a_lull_names_no_fake_device() -> None:
    policy = parse_policy(POLICY, "ebbtide.yaml")
    anywhere = explain_data(policy, NOON, None)
    pool = anywhere["windows"][0]
    # not open everywhere, but open on its pool's devices: it said "closed" before
    assert pool["open"] is False and pool["open_in_pool"] is True
    assert "pool spare-cards only; --device NODE/INDEX" in pool["note"]
    reason = anywhere["queues"]["default"]["reason"]
    assert "opens on a device after online below 20%" in reason and "/-1" not in reason
    on_card = explain_data(policy, NOON, ("gpu-a", 6))
    assert on_card["windows"][0]["open"] is True and "open_in_pool" not in on_card["windows"][0]
    assert on_card["allowed"] is True
    elsewhere = explain_data(policy, NOON, ("gpu-b", 0))
    assert elsewhere["windows"][0]["open"] is False and elsewhere["allowed"] is False
