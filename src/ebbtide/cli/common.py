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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("dramatiq", "pika", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # whatever library writes a line, no URL password, token or credential of ours in it
    from ebbtide.redaction import install, passwords_of

    install(
        passwords_of([os.environ.get("EBBTIDE_DB_URL"), os.environ.get("EBBTIDE_REDIS_URL")])
        + [t for t in (os.environ.get("EBBTIDE_TOKEN"), os.environ.get("PGPASSWORD")) if t]
    )
