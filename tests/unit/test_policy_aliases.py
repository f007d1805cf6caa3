"""Queue aliases: a Slurm ``--partition`` or a PBS ``-q`` written for another site names
a queue by another name; the policy lists the names each queue also goes by, and every
name must name one queue."""

from __future__ import annotations

import textwrap

import pytest

from ebbtide.client import queue_notes, submit_notes
from ebbtide.config.policy import parse_policy
from ebbtide.errors import ConfigError
from ebbtide.queue.spec import JobSpec

POLICY = textwrap.dedent(
    """\
    queues:
      default: {}
      batch:
        priority: 5
        aliases: [gpu, workq]
      short:
        aliases: [debug]
    windows:
      - {name: nights, kind: cron, schedule: "0 22 * * *", duration: 8h, queues: [batch]}
    """
)


def test_an_alias_names_its_queue() -> None:
    policy = parse_policy(POLICY, "p.yaml")
    assert policy.queues["batch"].aliases == ["gpu", "workq"]
    assert policy.queues["default"].aliases == []
    assert [policy.queue_named(n) for n in ("gpu", "workq", "batch", "debug", "default")] == [
        "batch",
        "batch",
        "batch",
        "short",
        "default",
    ]
    policy.check_queue("workq")  # no error
    assert policy.summary().startswith("3 queue(s) (3 alias(es)), 1 cron window(s)")


def test_an_unknown_queue_lists_the_queues_and_their_aliases() -> None:
    policy = parse_policy(POLICY, "p.yaml")
    with pytest.raises(ConfigError) as err:
        policy.queue_named("long")
    assert str(err.value) == (
        "queue: unknown queue 'long'; known queues: batch (aliases: gpu, workq), default, "
        "short (aliases: debug)"
    )


@pytest.mark.parametrize(
    ("queues", "where", "message"),
    [
        (
            "  batch: {aliases: [default]}\n",
            "p.yaml:2:21: queues.batch.aliases.0",
            "alias 'default' is the name of queue 'default'; a name names one queue",
        ),
        (
            "  batch: {aliases: [batch]}\n",
            "p.yaml:2:21: queues.batch.aliases.0",
            "alias 'batch' is the queue's own name; a name names one queue",
        ),
        (
            "  batch: {aliases: [gpu]}\n  long: {aliases: [gpu]}\n",
            "p.yaml:3:20: queues.long.aliases.0",
            "alias 'gpu' is already an alias of queue 'batch'",
        ),
        (
            "  batch: {aliases: [gpu, gpu]}\n",
            "p.yaml:2:26: queues.batch.aliases.1",
            "alias 'gpu' is already an alias of this queue",
        ),
    ],
)
def test_every_name_names_one_queue(queues: str, where: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy("queues:\n" + queues, "p.yaml")
    assert f"{where}: {message}" in str(err.value)


def test_all_alias_errors_are_reported_at_once_with_the_others() -> None:
    text = "queues:\n  a: {aliases: [b, 'no spaces']}\n  b: {aliases: [a]}\n"
    with pytest.raises(ConfigError) as err:
        parse_policy(text, "p.yaml")
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and "queues.a.aliases.1" in lines[0]  # the name's pattern first
    with pytest.raises(ConfigError) as err:
        parse_policy("queues:\n  a: {aliases: [b]}\n  b: {aliases: [a]}\n", "p.yaml")
    assert len(str(err.value).splitlines()) == 2


def test_a_window_names_the_queue_not_an_alias() -> None:
    text = POLICY.replace("queues: [batch]", "queues: [gpu]")
    with pytest.raises(ConfigError, match="'gpu' is an alias of queue 'batch'; name the queue"):
        parse_policy(text, "p.yaml")


def test_the_submit_note_says_which_queue_an_alias_is() -> None:
    policy = parse_policy(POLICY, "p.yaml")
    slurm = JobSpec(command=["true"], queue="gpu", compat="slurm")
    pbs = JobSpec(command=["true"], queue="workq")
    assert submit_notes(slurm, policy) == ["partition 'gpu' is queue 'batch' here"]
    assert queue_notes(pbs, policy) == ["queue 'workq' is queue 'batch' here"]
    assert queue_notes(JobSpec(command=["true"], queue="batch"), policy) == []
    assert queue_notes(JobSpec(command=["true"], queue="nope"), policy) == []


def test_the_example_policy_shows_aliases_and_the_loss_limits() -> None:
    from pathlib import Path

    from ebbtide.config.policy import load_policy

    example = load_policy(Path(__file__).resolve().parents[2] / "config" / "ebbtide.yaml")
    assert example.queue_named("gpu") == example.queue_named("workq") == "research"
    assert (example.defaults.max_losses, example.defaults.loss_window_s) == (10, 60.0)
