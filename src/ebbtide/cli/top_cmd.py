"""``ebb top``: a live terminal view of the fleet (see :mod:`ebbtide.top`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from ebbtide.cli.common import _client, _echo_json, _listing_client
from ebbtide.errors import StoreUnavailable, UserError, first_line
from ebbtide.top.view import SORTS

if TYPE_CHECKING:
    from ebbtide.top.snapshot import FleetSnapshot
    from ebbtide.top.view import ViewState


@click.command("top", short_help="The fleet live: GPUs, attempts, queues, evictions.")
@click.option(
    "-d",
    "--interval",
    type=click.FloatRange(0.2, 3600),
    metavar="SECONDS",
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Print one frame and exit (no terminal needed; every GPU when not on one).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON and exit.")
@click.option(
    "--sort", type=click.Choice(SORTS), default="node", show_default=True, help="First sort."
)
@click.option("--node", default="", metavar="TEXT", help="Only nodes whose name contains TEXT.")
@click.option(
    "-u",
    "--user",
    default="",
    metavar="TEXT",
    help="Only attempts of users whose name contains TEXT.",
)
@click.option(
    "--queue", default="", metavar="TEXT", help="Only attempts in queues whose name contains TEXT."
)
def top(
    interval: float, once: bool, as_json: bool, sort: str, node: str, user: str, queue: str
) -> None:
    """Watch the fleet live: per GPU a bar of online load (red █), ebbtide's slices
    (green ▒) and headroom (·), its figures, state and the attempts on it; fleet totals
    and each queue's depth above; the latest evictions below, with their latency and
    whether they met their deadline.  FREE (and headroom) is capacity less online and
    offline use: the policy's margin and what the forecast keeps back for online growth
    (KEPT, and KEPT GiB on a wide terminal; "warming up (cold reserve)" while an agent
    still learns the online load) are not taken off it, so admission offers less.

    \b
    Keys:
      q            quit (Ctrl-C too)
      s            sort: node, online, offline, headroom (busiest first)
      n / u / Q    filter by node / user / queue: type, Enter (empty clears), Esc
      c            clear the filters
      ↑ ↓ j k      scroll a row; PgUp PgDn a page; Home End (g G) to either end
      Tab          panel: GPUs, evictions, queues
      r            refresh now (else every --interval seconds)

    It needs a terminal, as top and htop do: with stdin or stdout not one it refuses;
    --once prints a single frame and --json the snapshot, for scripts. Filters match
    any part of a name, in any case; the user and queue filters keep the GPUs that hold
    such an attempt. Through `ebb server` (EBBTIDE_URL) it shows what the server does.
    """
    from ebbtide.top.view import ViewState, visible_evictions, visible_gpus

    live = not (once or as_json)
    if live and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError(
            "ebb top needs a terminal (stdin and stdout); for scripts use "
            "`ebb top --once` (one frame) or `ebb top --json`"
        )
    state = ViewState(sort=sort, node=node, user=user, queue=queue)
    client = _client() if live else _listing_client(False, None)
    if client is None:
        # a new system (or a mistyped EBBTIDE_HOME, as the note says): nothing to show,
        # as qstat and nodes say it (a trial's trap: top --json failed where they did not)
        import time

        from ebbtide.top.snapshot import build_snapshot

        empty = build_snapshot([], [], {}, [], taken_at=time.time())
        if as_json:
            _echo_json(empty.to_dict())
        else:
            _once(empty, state)
        return
    try:
        if as_json:
            snapshot = _fetch(client)
            gpus, evictions = visible_gpus(snapshot, state), visible_evictions(snapshot, state)
            _echo_json(snapshot.to_dict(gpus, evictions))
        elif once:
            _once(_fetch(client), state)
        else:
            _live(client, state, interval)
    finally:
        client.close()


def _fetch(client: Any) -> FleetSnapshot:
    """A snapshot; a store that cannot be read as an error to print, not a traceback."""
    import sqlalchemy.exc

    from ebbtide.top.fetch import fetch_snapshot

    try:
        return fetch_snapshot(client)
    except sqlalchemy.exc.SQLAlchemyError as exc:
        first = first_line(exc)
        raise StoreUnavailable(f"cannot read the store: {first}") from None


#: How wide ``ebb top --once`` draws into a pipe or a file (rich's 80 columns cut lines).
PIPE_WIDTH = 200


def _once(snapshot: FleetSnapshot, state: ViewState) -> None:
    """One frame on stdout: the terminal's size on one, else every row, as wide as
    ``COLUMNS`` says or :data:`PIPE_WIDTH` (a pipe or a file has no width to fit)."""
    import os

    from rich.console import Console

    from ebbtide.top.render import render

    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(highlight=False, width=PIPE_WIDTH)
    height = console.size.height if console.is_terminal else None
    console.print(render(snapshot, state, console.size.width, height, keys=False))


def _live(client: Any, state: ViewState, interval: float) -> None:
    from rich.console import Console

    from ebbtide.top.live import run

    try:
        run(
            lambda: _fetch(client),
            state,
            interval_s=interval,
            console=Console(highlight=False),
            fd=sys.stdin.fileno(),
        )
    except KeyboardInterrupt:  # Ctrl-C quits, as q does; the terminal is restored
        pass
