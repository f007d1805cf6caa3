"""``ebb nodes`` and ``ebb node drain | undrain``: the node agents and their devices."""

from __future__ import annotations

import time
from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json
from ebbtide.errors import UserError


@click.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nodes(as_json: bool) -> None:
    """Show node agents and their devices: heartbeat age, the latest online load, health
    (a device out of service names its fault: the XID and what it means), the last fault
    seen, drains and eviction cooldowns."""
    client = _client()
    rows = client.nodes()
    if as_json:
        _echo_json(rows)
        return
    now = time.time()
    click.echo(f"{'NODE':<16} {'AGE':>6}  {'DEV':>3}  {'ONLINE (compute / memory)':<28}  STATE")
    for n in rows:
        age = f"{n['heartbeat_age_s']:.1f}s"
        node_state = " (stopping)" if n["stopping"] else ""
        if n["drained"]:
            node_state += f" ({n['drained']})"
        if not n["devices"]:
            click.echo(f"{n['name'][:16]:<16} {age:>6}  no devices{node_state}")
        for pos, d in enumerate(n["devices"]):
            name, shown_age = (n["name"][:16], age) if pos == 0 else ("", "")
            click.echo(
                f"{name:<16} {shown_age:>6}  {d['index']:>3}  {_load(d):<28}  "
                f"{_state(d, now)}{node_state if pos == 0 else ''}"
            )


def _load(d: dict[str, Any]) -> str:
    from ebbtide.units import format_mib

    return (
        f"{d['online_compute_pct']:.0f}% / {format_mib(d['online_memory_mib'])} "
        f"of {format_mib(d['memory_mib'])}"
    )


def _state(d: dict[str, Any], now: float) -> str:
    parts = []
    if d.get("health") == "unhealthy":
        fault = d.get("fault") or {}
        text = f"unhealthy: {fault.get('meaning') or 'a fault'}"
        if d.get("healthy_in_s") is not None:
            text += f" (checks pass; back in {d['healthy_in_s']:.0f}s)"
        elif d.get("failing"):
            text += f" (check: {d['failing']})"
        parts.append(text)
    else:
        parts.append("ok")
        last = d.get("last_fault")
        if last:
            parts.append(f"last fault: {last.get('meaning')}")
    if d.get("drained"):
        parts.append(d["drained"])
    if d.get("cooldown_until") and d["cooldown_until"] > now:
        parts.append(f"cooling down {d['cooldown_until'] - now:.0f}s")
    if d.get("eviction_trigger") is False:
        parts.append("planning only (device-level figures)")
    return "; ".join(parts)


def _target(text: str) -> tuple[str, int | None]:
    """``NODE`` or ``NODE/INDEX``."""
    node, sep, index = text.partition("/")
    if not node:
        raise UserError(f"{text!r}: expected NODE or NODE/DEVICE (e.g. gpu-a or gpu-a/3)")
    if not sep:
        return node, None
    if not index.isdigit() or len(index) > 6:
        raise UserError(f"{text!r}: the device must be a number (e.g. {node}/0)")
    return node, int(index)


@click.group("node")
def node_group() -> None:
    """Take nodes or devices out of service and back (admins only).

    \b
      ebb node drain gpu-a --reason "driver upgrade"   nothing new on any device of gpu-a
      ebb node drain gpu-a/3                           nothing new on device 3
      ebb node undrain gpu-a/3                         back in service, fault cleared
    """


@node_group.command("drain")
@click.argument("target", metavar="NODE[/DEVICE]")
@click.option("--reason", default="", help="Why, for `ebb nodes` and `qstat`.")
def drain(target: str, reason: str) -> None:
    """Keep new work off a node or one of its devices; what runs there goes on."""
    node, device = _target(target)
    _client().drain(node, device, reason=reason)
    click.echo(f"{target} drained")


@node_group.command("undrain")
@click.argument("target", metavar="NODE[/DEVICE]")
def undrain(target: str) -> None:
    """Return a node or device to service at once: lifts drains, and clears a fault its
    agent holds against it (an XID, a device that stopped answering) without waiting for
    the health checks."""
    node, device = _target(target)
    _client().undrain(node, device)
    click.echo(f"{target} back in service")
