"""Helpers shared by the ``ebb`` commands: the API client, JSON output and logging."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click

log = logging.getLogger("ebbtide")


def _client(*, create: bool = False) -> Any:
    """The SDK client of a command; only commands that submit (``create``) may make a
    new store: the others say there is none where ``EBBTIDE_HOME`` points."""
    from ebbtide.client import Client

    return Client(create=create)


def _listing_client(as_json: bool, empty: Any) -> Any | None:
    """The client of a command that lists (``qstat``, ``nodes``), or None where there is
    no store yet, once an empty listing (``empty`` with ``--json``) and where it looked
    are printed: a new system lists nothing, and a mistyped ``EBBTIDE_HOME`` shows."""
    from ebbtide.errors import NoStore

    try:
        return _client()
    except NoStore as exc:  # nothing submitted there, and no empty store made
        click.echo(f"ebb: note: {exc}", err=True)
        if as_json:
            _echo_json(empty)
        return None


def _note_unknown_queue(client: Any, queue: str | None) -> None:
    """A note on stderr when ``queue`` (``-q``) names no queue of the policy: a report or
    a recommendation over it is empty, and a typo should not read as "nothing happened"."""
    from ebbtide.errors import ConfigError

    policy = getattr(client, "policy", None)  # (a remote client holds none: its server says)
    if queue is None or policy is None:
        return
    try:
        policy.queue_named(queue)
    except ConfigError as exc:
        click.echo(f"ebb: note: {exc} (so nothing is counted for it)", err=True)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def metrics_options(fn: Any) -> Any:
    """``--metrics-port`` and ``--metrics-address`` (for the processes that serve metrics)."""
    fn = click.option(
        "--metrics-address",
        metavar="ADDRESS",
        default="0.0.0.0",
        show_default=True,
        envvar="EBBTIDE_METRICS_ADDRESS",
        show_envvar=True,
        help="Where --metrics-port listens (127.0.0.1: this host only).",
    )(fn)
    fn = click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        metavar="PORT",
        default=None,
        envvar="EBBTIDE_METRICS_PORT",
        show_envvar=True,
        help="Serve Prometheus metrics on this port (/metrics; off by default). "
        "Queues, nodes, devices and reasons are the labels, never jobs or users.",
    )(fn)
    return fn


class _ClientWarnings(logging.Handler):
    """Where a warning goes in a client command that set no logging up (Python's
    ``logging.lastResort``): one line, worded as ours are (``ebb: warning: ...``), no
    URL password or token in it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"ebb: {record.levelname.lower()}: {record.getMessage()}"
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:  # (masked by the filter, as the message is)
                line += "\n" + record.exc_text
        except Exception:
            self.handleError(record)
            return
        sys.stderr.write(line + "\n")


def _client_warnings() -> None:
    """Word the warnings of commands that set no logging up as ours (see
    :class:`_ClientWarnings`); a command that calls :func:`_setup_logging` logs as set."""
    from ebbtide.redaction import SecretFilter

    handler = _ClientWarnings()
    handler.addFilter(SecretFilter(_our_secrets()))
    logging.lastResort = handler


def _our_secrets() -> list[str]:
    """The passwords and tokens of ours in the environment, kept out of every log line."""
    from ebbtide.redaction import passwords_of

    return passwords_of([os.environ.get("EBBTIDE_DB_URL"), os.environ.get("EBBTIDE_REDIS_URL")]) + [
        t for t in (os.environ.get("EBBTIDE_TOKEN"), os.environ.get("PGPASSWORD")) if t
    ]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("dramatiq", "pika", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # whatever library writes a line, no URL password, token or credential of ours in it
    from ebbtide.messaging import broker_logs
    from ebbtide.redaction import install

    install(_our_secrets())
    # a Redis that does not answer: one warning of ours, not a critical traceback a second
    broker_logs.install()
