"""``ebb policy check | explain | schema``: validate and explain policy files, and print
their JSON Schema."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import click

from ebbtide.cli.common import _echo_json
from ebbtide.errors import UserError, first_line

RULE = (
    "offline work may run on a device while any window admitting its queue is open there "
    "(union); an open blackout always wins; with no cron or lull windows, always"
)


def _load(path: str | None) -> tuple[Any, str]:
    """The policy ``explain`` explains, and where it came from: the file given; else the
    one in force, as clients check jobs against it (the scheduler's published policy,
    else ``$EBBTIDE_POLICY``'s file, else the built-in defaults)."""
    from ebbtide.config.policy import Policy, load_policy

    if path:
        return load_policy(Path(path)), path
    published = _published()
    if published is not None:
        return published
    chosen = os.environ.get("EBBTIDE_POLICY")
    return (load_policy(Path(chosen)), chosen) if chosen else (Policy(), "built-in defaults")


def _published() -> tuple[Any, str] | None:
    """The policy the scheduler of this store published, and its source; None when there
    is no store here, none was published, or the store is reached through a server."""
    from ebbtide.config.in_force import not_in_force
    from ebbtide.config.policy import parse_published
    from ebbtide.config.settings import Settings
    from ebbtide.errors import ConfigError, NoStore
    from ebbtide.queue.store import Store

    settings = Settings.from_env()
    if settings.url:  # through ebb server: its policy is its scheduler's business
        return None
    try:
        store = Store(settings.db_url, create=False)
    except NoStore:
        return None
    except Exception as exc:  # a store out of reach: the file still explains offline
        first = first_line(exc)
        click.echo(f"ebb: note: the store's policy cannot be read ({first})", err=True)
        return None
    try:
        record = store.published_policy()
    finally:
        store.close()
    if record is None:
        return None
    text, source, _ = record
    try:
        policy = parse_published(text, source)
    except ConfigError as exc:  # a newer scheduler's: the file still explains
        click.echo(f"ebb: note: the store's policy cannot be read here ({exc})", err=True)
        return None
    # a reload that failed keeps the policy it had, and only the scheduler's log says so;
    # EBBTIDE_POLICY's file is not read once a scheduler published its own
    why = not_in_force(source, text, settings.policy_path)
    if why is not None:
        click.echo(f"ebb: note: {why}", err=True)
    return policy, f"as the scheduler published it ({source or 'built-in defaults'})"


def _iso(t: float | None) -> str | None:
    if t is None or math.isinf(t):
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


#: The latest year ``--at`` takes: windows look ahead up to a year past it, inside the
#: calendar Python knows (to 9999).
MAX_AT_YEAR = 9000


def _parse_at(text: str | None) -> float:
    if text is None:
        return dt.datetime.now(dt.UTC).timestamp()
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"--at: expected an ISO time like 2026-12-01T22:30+01:00, got {text!r}"
        ) from None
    # a trial's trap: 9999-12-31 (the windows' next start past the calendar) and year 1
    # (no local time that early) ended in a traceback, or an error naming no flag
    if not 1970 <= when.year <= MAX_AT_YEAR:
        raise UserError(f"--at: expected a time from 1970 to {MAX_AT_YEAR}, got {text!r}")
    if when.tzinfo is None:
        when = when.astimezone()  # this machine's local time
        click.echo(
            f"ebb: note: --at {text} has no UTC offset: read as this machine's local time "
            f"(UTC{when.strftime('%z')[:3]}:{when.strftime('%z')[3:]})",
            err=True,
        )
    return when.timestamp()


def _parse_device(text: str | None) -> tuple[str, int] | None:
    if text is None:
        return None
    node, _, index = text.rpartition("/")
    if not node or not index.isdigit():
        raise UserError(f"--device: expected NODE/INDEX like gpu-a/0, got {text!r}")
    return node, int(index)


def explain_data(policy: Any, at: float, device: tuple[str, int] | None) -> dict[str, Any]:
    """What ``explain --json`` prints (lull windows count as closed: no live samples here).
    Without ``device``, a window limited to a pool is not open everywhere (``open``
    false) but says whether it is open on its pool's devices (``open_in_pool``)."""
    from ebbtide.scheduling.windows import Gatekeeper

    keeper = Gatekeeper(policy)
    where = device or ("", -1)
    gates = keeper.gates(at, [where])[where]
    windows = []
    for w in policy.windows:
        entry: dict[str, Any] = {"name": w.name, "kind": w.kind, "pool": w.pool}
        if w.kind == "lull":
            entry.update(
                open=False,
                next_change=None,
                note="opens on live load; not evaluated without samples",
            )
        else:
            sched = keeper.schedules[w.name]
            applies = (device is None and w.pool is None) or (
                device is not None and keeper.applies(w.pool, *device)
            )
            occ = sched.occurrence_at(at)
            entry.update(
                open=occ is not None and applies,
                next_change=_iso(occ.end if occ else sched.next_start(at)),
                timezone=w.timezone,
            )
            if w.pool is not None and device is None:  # open or not on its pool's devices
                entry.update(
                    open_in_pool=occ is not None,
                    note=f"pool {w.pool} only; --device NODE/INDEX for one device",
                )
        windows.append(entry)
    queues: dict[str, dict[str, Any]] = {}
    for q in policy.queues:
        if q in gates.open:
            g = gates.open[q]
            queues[q] = {"allowed": True, "open_until": _iso(g.open_until), "share": g.share}
            if _goes_on(keeper, q, g.open_until, g.window, where):
                # the gatekeeper follows a chain of openings only so far: no close found
                days = int((g.open_until - at) // 86400)
                queues[q].update(open_until=None, no_close_within_days=days)
        else:
            queues[q] = {"allowed": False, "reason": _zoned(policy, gates.closed.get(q, ""))}
    shares = [g.share for g in gates.open.values()]
    return {
        "at": _iso(at),
        "device": f"{device[0]}/{device[1]}" if device else None,
        "allowed": bool(gates.open),
        "offline_share": max(shares, default=0.0),
        "rule": RULE,
        "windows": windows,
        "queues": queues,
    }


def _goes_on(keeper: Any, queue: str, until: float, closing: str, where: tuple[str, int]) -> bool:
    """Whether a cron window admitting ``queue`` is still open at ``until``, the end
    the gatekeeper gave (it follows a chain of openings a bounded number of times), and
    no blackout is what closes it then: an always-open window has no close to show."""
    policy = keeper.policy
    if math.isinf(until) or closing in {b.name for b in policy.blackouts}:
        return False
    return any(
        (w.queues is None or queue in w.queues)
        and keeper.applies(w.pool, *where)
        and keeper.schedules[w.name].occurrence_at(until) is not None
        for w in policy.cron_windows
    )


def _zoned(policy: Any, reason: str) -> str:
    """``blackout 'x' until 18:00`` with the blackout's timezone, beside UTC times."""
    for b in policy.blackouts:
        prefix = f"blackout {b.name!r} until "
        if reason.startswith(prefix) and len(reason) == len(prefix) + 5:  # HH:MM
            return f"{reason} {b.timezone}"
    return reason


@click.group("policy")
def policy_group() -> None:
    """Check and explain policy files (ebbtide.yaml), and print their JSON Schema."""


@policy_group.command("check")
@click.argument("file", type=click.Path())  # a directory: a ConfigError, as any unreadable
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"file", "ok", "summary", "queues"} or {"file", "ok": false, "errors"}.',
)
def check(file: str, as_json: bool) -> None:
    """Validate FILE: exit 0 with a one-line summary (and a line per queue with aliases:
    the names jobs may give for it), or 1 with every error."""
    from ebbtide.config.policy import load_policy
    from ebbtide.errors import ConfigError

    if as_json:
        try:
            policy = load_policy(Path(file))
        except ConfigError as exc:
            _echo_json({"file": file, "ok": False, "errors": str(exc).splitlines()})
            sys.exit(1)
        queues = {name: {"aliases": list(q.aliases)} for name, q in sorted(policy.queues.items())}
        out = {"file": file, "ok": True, "summary": policy.summary(), "queues": queues}
        _echo_json({**out, "warnings": _warnings(policy)})
        return
    policy = load_policy(Path(file))
    click.echo(f"{file}: ok: {policy.summary()}")
    for name, q in sorted(policy.queues.items()):
        if q.aliases:
            click.echo(f"  queue {name}: also named {', '.join(q.aliases)}")
    for warning in _warnings(policy):
        click.echo(f"ebb policy check: warning: {warning}", err=True)


def _warnings(policy: Any) -> list[str]:
    """What is valid but surely not meant: queues whose jobs never run."""
    return [
        f"queue {name!r} is admitted by no cron or lull window: its jobs never run (name it "
        "in a window's queues:, or leave queues: out of one to admit every queue)"
        for name in policy.unwindowed_queues()
    ]


@policy_group.command("explain")
@click.option(
    "--policy",
    "path",
    type=click.Path(),
    help="Policy file (default: the one the scheduler published, else $EBBTIDE_POLICY, else "
    "built-in defaults).",
)
@click.option(
    "--at",
    "at_text",
    help="ISO time to explain (default: now), e.g. 2026-12-01T23:00+01:00; without an "
    "offset, this machine's local time.",
)
@click.option("--device", "device_text", help="NODE/INDEX, for pool and per-device windows.")
@click.option("--json", "as_json", is_flag=True)
def explain(path: str | None, at_text: str | None, device_text: str | None, as_json: bool) -> None:
    """Which windows are open and why, the next change, and the share allowed per queue.

    Without --policy it explains the policy in force: the one the scheduler published to
    the store (as ebb qsub checks jobs against it), else $EBBTIDE_POLICY's file, else the
    built-in defaults; --policy FILE explains that file (an edit, before it is loaded).
    Lull windows open on live load, which this command does not see."""
    policy, source = _load(path)
    device = _parse_device(device_text)
    if device is not None and (note := _device_note(policy, *device)):
        click.echo(f"ebb: note: --device {device_text}: {note}", err=True)
    data = explain_data(policy, _parse_at(at_text), device)
    data["policy"] = source
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"policy: {source}")
    click.echo(
        f"at {data['at']}{' on ' + data['device'] if data['device'] else ''}: "
        f"offline work {_verdict(data)} (share up to {data['offline_share']:g})"
    )
    click.echo(f"rule: {data['rule']}")
    for w in data["windows"]:
        state = "open" if w["open"] else "closed"
        if w.get("open_in_pool"):
            state = "open on its pool"
        nxt = f", next change {w['next_change']}" if w.get("next_change") else ""
        note = f" ({w['note']})" if w.get("note") else ""
        click.echo(f"  {w['kind']:<8} {w['name']:<20} {state}{nxt}{note}")
    for q, info in data["queues"].items():
        if info["allowed"] and "no_close_within_days" in info:
            days, share = info["no_close_within_days"], info["share"]
            click.echo(f"  queue {q}: allowed (no close within {days} days), share {share:g}")
        elif info["allowed"] and info["open_until"]:
            until = info["open_until"]
            click.echo(f"  queue {q}: allowed until {until}, share {info['share']:g}")
        elif info["allowed"]:  # no windows, or a lull's: open while the load stays low
            end = "no known end" if data["windows"] else "no windows: always"
            click.echo(f"  queue {q}: allowed ({end}), share {info['share']:g}")
        else:
            click.echo(f"  queue {q}: not allowed: {info['reason']}")


def _verdict(data: dict[str, Any]) -> str:
    """``allowed``, ``not allowed``, or for which queues where some are and some are not
    (a trial's trap: "allowed" at the top, every queue but one refused below)."""
    allowed = [q for q, info in data["queues"].items() if info["allowed"]]
    refused = [q for q, info in data["queues"].items() if not info["allowed"]]
    if not data["allowed"] or not allowed:
        return "not allowed"
    if not refused:
        return "allowed"

    def named(queues: list[str]) -> str:
        return f"queue{'s' if len(queues) > 1 else ''} {', '.join(queues)}"

    return f"allowed for {named(allowed)}, not for {named(refused)}"


def _device_note(policy: Any, node: str, index: int) -> str | None:
    """What to tell of a ``--device`` that the policy's pools do not name (a trial's trap:
    ``--device nosuch/9`` explained as if it meant something)."""
    pools = sorted(policy.devices.pools)
    if not pools:
        return "this policy has no device pools, so every device is explained alike"
    if not any(policy.devices.in_pool(p, node, index) for p in pools):
        return f"in none of this policy's device pools ({', '.join(pools)})"
    return None


@policy_group.command("schema")
def schema() -> None:
    """Print the policy file's JSON Schema (for editor completion)."""
    from ebbtide.config.policy import Policy

    json.dump(Policy.model_json_schema(by_alias=True), sys.stdout, indent=2)
    click.echo()
