"""The policy's ``retention:`` section: off by default, strict, and errors that say file,
line and column."""

from __future__ import annotations

import textwrap

import pytest

from ebbtide.config.policy import Policy, parse_policy
from ebbtide.errors import ConfigError


def test_finished_jobs_are_kept_for_ever_by_default() -> None:
    retention = Policy().retention
    assert retention.finished_jobs is None
    assert (retention.batch, retention.every) == (1000, 3600.0)


def test_the_keys_take_durations_and_a_count() -> None:
    text = textwrap.dedent(
        """
        retention:
          finished_jobs: 90d
          batch: 500
          every: 30m
        """
    )
    retention = parse_policy(text, "p.yaml").retention
    assert (retention.finished_jobs, retention.batch, retention.every) == (90 * 86400, 500, 1800)
    assert parse_policy("retention: {finished_jobs: 3600}\n").retention.finished_jobs == 3600


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("retention:\n  finished_jobs: 10m\n", "p.yaml:2:3", ["retention.finished_jobs", "1h"]),
        ("retention:\n  finished_jobs: 400d\n", "p.yaml:2:3", ["finished_jobs", "366 days"]),
        ("retention:\n  finished_jobs: forever\n", "p.yaml:2:3", ["30s", "'forever'"]),
        ("retention:\n  finished_jobs: on\n", "p.yaml:2:3", ["finished_jobs", "boolean"]),
        ("retention:\n  batch: 0\n", "p.yaml:2:3", ["retention.batch", "greater than"]),
        ("retention:\n  batch: 20000\n", "p.yaml:2:3", ["retention.batch", "10000"]),
        ("retention:\n  batch: yes\n", "p.yaml:2:3", ["retention.batch", "boolean"]),
        ("retention:\n  every: 10s\n", "p.yaml:2:3", ["retention.every", "1m to 1d"]),
        ("retention:\n  every: soon\n", "p.yaml:2:3", ["retention.every", "'soon'"]),
        ("retention:\n  keep: 3d\n", "p.yaml:2:3", ["retention.keep", "unknown key"]),
        ("retention: 30d\n", "p.yaml:1:1", ["retention", "dictionary"]),
    ],
)
def test_bad_values_name_place_and_allowed_values(text: str, where: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    message = str(info.value)
    assert message.startswith(where + ": "), message
    for word in words:
        assert word in message, message


def test_every_bad_key_of_the_section_is_reported_at_once() -> None:
    text = "retention:\n  finished_jobs: 1m\n  batch: -1\n  every: 0\n"
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    lines = str(info.value).splitlines()
    assert [line.split(": ")[0] for line in lines] == ["p.yaml:2:3", "p.yaml:3:3", "p.yaml:4:3"]
