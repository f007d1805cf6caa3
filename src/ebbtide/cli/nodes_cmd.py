"""``ebb nodes`` and ``ebb node drain | undrain``: the node agents and their devices."""

from __future__ import annotations

import time
from typing import Any

import click

from ebbtide.cli.common import _client, _echo_json
from ebbtide.errors import UserError


@click.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "-f",
    "--full",
    is_flag=True,
    help=(
        "Also show, per device, who the online load is (its pods and other processes), "
        "which GPU a MIG instance is carved from, and what is kept back there and why; per "
        "node, whose jobs it runs."
    ),
)
def nodes(as_json: bool, full: bool) -> None:
    """Show node agents and their devices: heartbeat age (and "agent silent" past the
    policy's heartbeat timeout, "agent stopped" once it said it stops and holds
    nothing); per device the latest online load, the slices ebbtide
    holds there, what admission keeps back there for the online side's growth (KEPT
    BACK: compute / memory, the forecast's reserve; the policy's margin comes on top),
    and its state: ok, out of service (the fault: the XID and what it means, and when),
    drained (by whom, why), cooling down after an eviction, showing stale figures, or
    warming up (its agent is still learning the online load and keeps the cold reserve,
    ``defaults.forecast_warmup_s``); and the last fault seen.  With ``-f``, a line per
    device names the online pods using it (``namespace/name`` or
    ``pod:<uid>/<container>``) and online processes in no pod (``pid:<n> (<name>)``), as
    its agent last saw them, and says what is kept back there and why; a line per node
    says whose jobs its agent runs (anyone's; every user's but root's; one user's
    only)."""
    from ebbtide.errors import NoStore

    try:
        client = _client()
    except NoStore as exc:  # no agent has reported here yet: none to show
        click.echo(f"ebb: note: {exc}", err=True)
        if as_json:
            _echo_json([])
        return
    rows = client.nodes()
    for n in rows:
        for d in n["devices"]:
            d.setdefault("online_pods", [])  # from agents that do not report them
    if as_json:
        _echo_json(rows)
        return
    lag_s = max((n.get("heartbeat_may_lag_s") or 0.0 for n in rows), default=0.0)
    if lag_s:  # a trial's trap: every live node "silent" to a client without the Redis URL
        from ebbtide.messaging.liveness import lag_in_words

        why = next((n.get("heartbeat_lag_why") for n in rows if n.get("heartbeat_lag_why")), None)
        click.echo(
            f"ebb: note: {lag_in_words(why)}: AGE may be up to {lag_s:g}s older than the last "
            "heartbeat, and a node is called silent only past the timeout plus that",
            err=True,
        )
    now = time.time()
    click.echo(
        f"{'NODE':<16} {'AGE':>6}  {'DEV':>3}  {'ONLINE (compute / memory)':<27}  "
        f"{'EBBTIDE SLICES':<18}  {'KEPT BACK':<14}  STATE"
    )
    for n in rows:
        # never "-0.0s": a heartbeat stamped by a clock a little ahead of this one
        age = f"{max(0.0, n['heartbeat_age_s']):.1f}s"
        if not n["devices"]:
            silent = " (agent silent)" if n.get("silent") else ""
            click.echo(f"{n['name'][:16]:<16} {age:>6}  no devices{silent}")
        for pos, d in enumerate(n["devices"]):
            name, shown_age = (n["name"][:16], age) if pos == 0 else ("", "")
            stopping = ""
            held = any((dev.get("slices") or {}).get("jobs") for dev in n["devices"])
            # it said it stops, and left nothing behind: stopped (a trial's trap: "ok
            # (agent stopping)" for 40 s after a clean stop, on a client without Redis)
            stopped = n["stopping"] and not held
            if pos == 0 and stopped:
                stopping = " (agent stopped)"
            elif pos == 0 and n["stopping"] and not n.get("silent"):
                stopping = " (agent stopping)"
            elif pos == 0 and n.get("silent"):
                stopping = " (agent silent: its jobs are lost and requeued)"
            elif pos == 0 and n.get("quiet"):  # not silent yet: say it before it is
                stopping = f" (no heartbeat for {n['heartbeat_age_s']:.0f}s)"
            # a silent agent's last figures say nothing of now (a trial's trap: "ok"); an
            # admin's drain is the store's, and still holds
            state = _state(d, now)
            if n.get("silent") or stopped:
                state = ", ".join(["unknown", *([str(d["drained"])] if d.get("drained") else [])])
            click.echo(
                f"{name:<16} {shown_age:>6}  {d['index']:>3}  {_load(d):<27}  "
                f"{_slices(d):<18}  {_kept_back(d):<14}  {state}{stopping}"
            )
            if full:
                if d.get("mig_parent") is not None:
                    click.echo(f"{'':<30}a MIG instance of the GPU NVML numbers {d['mig_parent']}")
                click.echo(f"{'':<30}online: {_online_pods(d)}")
                click.echo(f"{'':<30}kept back: {_kept_back_why(d)}")
        if full:
            click.echo(f"{'':<30}runs: {_runs(n.get('runs_jobs_of'))}")


def _runs(runs_jobs_of: str | None) -> str:
    """Whose jobs a node's agent runs, in words (``ebb nodes -f``)."""
    from ebbtide.queue.whose_jobs import RUNS_ANYONES, RUNS_ONE_PREFIX, RUNS_USERS

    if not runs_jobs_of:
        return "not said (an older agent)"
    if runs_jobs_of == RUNS_ANYONES:
        return "anyone's jobs"
    if runs_jobs_of == RUNS_USERS:
        return "every user's jobs but root's"
    return f"only {runs_jobs_of.removeprefix(RUNS_ONE_PREFIX)}'s jobs"


def _load(d: dict[str, Any]) -> str:
    from ebbtide.units import format_mib

    return (
        f"{d['online_compute_pct']:.0f}% / {format_mib(round(d['online_memory_mib']))} "
        f"of {format_mib(d['memory_mib'])}"
    )


def _reserve(d: dict[str, Any]) -> tuple[float, float]:
    """The reserve a device's agent keeps back: compute in percent, memory in MiB."""
    return float(d.get("reserve_compute_pct") or 0.0), float(d.get("reserve_memory_mib") or 0.0)


def _kept_back(d: dict[str, Any]) -> str:
    """The KEPT BACK column: ``30% / 8GiB``, ``-`` for none."""
    from ebbtide.top.snapshot import keeps_back
    from ebbtide.units import format_mib

    compute, memory = _reserve(d)
    if not keeps_back(compute, memory):
        return "-"
    return f"{compute:.0f}% / {format_mib(round(memory))}"  # (whole MiB: the column's width)


def _cold_s(d: dict[str, Any]) -> float:
    """For how many more seconds the reserve is the cold one (0: the forecast)."""
    return float(d.get("reserve_cold_for_s") or 0.0)


def _kept_back_why(d: dict[str, Any]) -> str:
    """What ``-f`` says of the reserve: how much, and why."""
    shown = _kept_back(d)
    if shown == "-":
        return "nothing for the online side's growth (the policy's margin aside)"
    if _cold_s(d) > 0:
        why = (
            f"{shown}, the cold reserve while its agent learns the online load "
            f"(defaults.forecast_warmup_s, {_ago(_cold_s(d))} left)"
        )
    else:
        why = f"{shown} for the online side's growth within the eviction deadline (forecast)"
    if d.get("eviction_trigger") is False:
        why += ", with the planning margin for device-level figures"
    return f"{why}; the policy's margin comes on top"


def _online_pods(d: dict[str, Any]) -> str:
    """Who the online load on a device is: ``-`` when nobody is seen (or the source
    cannot tell: only NVML lists processes)."""
    return ", ".join(str(p) for p in d.get("online_pods") or []) or "-"


def _slices(d: dict[str, Any]) -> str:
    from ebbtide.units import format_mib

    held = d.get("slices") or {}
    jobs = held.get("jobs") or []
    if not jobs:
        return "-"
    return f"{len(jobs)}: {held['compute_pct']:.0f}% / {format_mib(round(held['memory_mib']))}"


def _state(d: dict[str, Any], now: float) -> str:
    parts = []
    if d.get("health") == "unhealthy":
        fault = d.get("fault") or {}
        text = f"OUT OF SERVICE: {fault.get('meaning') or 'a fault'}{_since(fault, now)}"
        if d.get("healthy_in_s") is not None:
            text += f" (checks pass; back in {d['healthy_in_s']:.0f}s)"
        elif d.get("failing"):
            text += f" (check: {d['failing']})"
        parts.append(text)
    if d.get("drained"):
        parts.append(str(d["drained"]))
    if d.get("sample_ok") is False:
        parts.append("STALE: no fresh figures from the device; the worst case is assumed")
    if d.get("cooldown_until") and d["cooldown_until"] > now:
        parts.append(f"cooling down {d['cooldown_until'] - now:.0f}s")
    if d.get("eviction_trigger") is False:
        parts.append("planning only (device-level figures)")
    if _cold_s(d) > 0 and _kept_back(d) != "-":
        parts.append(f"warming up (the cold reserve, {_ago(_cold_s(d))} left)")
    last = d.get("last_fault")
    if last and d.get("health") != "unhealthy":
        parts.append(f"last fault: {last.get('meaning')}{_since(last, now)}")
    return "; ".join(parts) or "ok"


def _since(fault: dict[str, Any], now: float) -> str:
    at = fault.get("at")
    if not at:
        return ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f" at {stamp} ({_ago(now - at)} ago)"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


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
    """Take nodes or devices out of service and back, or forget a retired one (admins
    only).

    \b
      ebb node drain gpu-a --reason "driver upgrade"   nothing new on any device of gpu-a
      ebb node drain gpu-a/3                           nothing new on device 3
      ebb node undrain gpu-a/3                         back in service, fault cleared
      ebb node undrain gpu-a                           the node's drain lifted (not gpu-a/3's)
      ebb node forget gpu-z                            a retired node leaves `ebb nodes`
    """


@node_group.command("drain")
@click.argument("target", metavar="NODE[/DEVICE]")
@click.option(
    "--reason", default="", help="Why, for `ebb nodes` and `qstat` (drained again: kept)."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def drain(target: str, reason: str, as_json: bool) -> None:
    """Keep new work off a node or one of its devices; what runs there goes on."""
    node, device = _target(target)
    _client().drain(node, device, reason=reason)
    _done(as_json, f"{target} drained", node=node, device=device, drained=True, reason=reason)


def _done(as_json: bool, text: str, **fields: Any) -> None:
    """What a ``node`` command did: ``text``, or ``fields`` as JSON."""
    if as_json:
        _echo_json(fields)
    else:
        click.echo(text)


@node_group.command("forget")
@click.argument("node", metavar="NODE")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def forget(node: str, as_json: bool) -> None:
    """Remove a node whose agent is gone for good (retired, renamed) from `ebb nodes` and
    the metrics. Refused while its agent still heartbeats; what it ran is requeued, as
    for any node that went silent."""
    _client().forget_node(node)
    _done(as_json, f"{node} forgotten", node=node, forgotten=True)


@node_group.command("undrain")
@click.argument("target", metavar="NODE[/DEVICE]")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
def undrain(target: str, as_json: bool) -> None:
    """Return a node or device to service at once: lifts its drain, and clears a fault
    its agent holds against it (an XID, a device that stopped answering) without waiting
    for the health checks.  Undraining a node lifts the node's drain and clears held
    faults on all its devices, but a device drained on its own (`ebb node drain
    NODE/DEVICE`) stays drained: the output names each one and how to lift it
    (`stays_drained` in --json)."""
    node, device = _target(target)
    client = _client()
    row = next((n for n in client.nodes() if n["name"] == node), None)
    was_out = _out_of_service(row, device)
    client.undrain(node, device)
    if device is None:
        stays = _own_drains(row)
        said = f"{target} back in service" if was_out else f"{target} was not drained"
        if not was_out and not stays:
            said = f"{target} was in service already"
        said = "; ".join([said, *(_stays_drained(node, i, d) for i, d in stays)])
        listed = [{"device": i, "by": d.get("by"), "reason": d.get("reason")} for i, d in stays]
        _done(as_json, said, node=node, device=device, drained=False, stays_drained=listed)
        return
    # a device's undrain leaves its node's drain as it was
    node_drain = row.get("drained") if row is not None else None
    if node_drain:  # a trial's trap: "back in service", while the node's drain held it
        said = (
            f"{target}: its own drain and fault are lifted, but it stays out of service: "
            f"{node_drain}; ebb node undrain {node} returns the node"
        )
        _done(as_json, said, node=node, device=device, drained=True, node_drained=node_drain)
        return
    said = f"{target} back in service" if was_out else f"{target} was in service already"
    _done(as_json, said, node=node, device=device, drained=False)


def _own_drains(row: dict[str, Any] | None) -> list[tuple[int, dict[str, Any]]]:
    """The drains an admin set on devices of the node of ``row`` themselves, by device:
    a node's undrain leaves them (``device_drain`` of ``ebb nodes --json``)."""
    devices = row["devices"] if row is not None else []
    return [(int(d["index"]), d["device_drain"]) for d in devices if d.get("device_drain")]


def _stays_drained(node: str, index: int, drain: dict[str, Any]) -> str:
    """``gpu-a/1 stays drained (fan): ebb node undrain gpu-a/1``."""
    why = drain.get("reason") or f"by {drain.get('by') or 'an admin'}"
    return f"{node}/{index} stays drained ({why}): ebb node undrain {node}/{index}"


def _out_of_service(row: dict[str, Any] | None, device: int | None) -> bool:
    """Whether the node of ``row`` (``ebb nodes --json``'s, or its device ``device``) is
    drained or holds a fault, as ``ebb nodes`` shows it, that its undrain lifts (True
    where it cannot tell: a node not reported, ``row`` None).  A node's undrain leaves
    its devices' own drains (``device_drain``; a server that does not report them lifts
    them too)."""
    if row is None:
        return True
    devices = [d for d in row["devices"] if device is None or int(d["index"]) == device]

    def lifted(d: dict[str, Any]) -> bool:
        return bool(d.get("drained")) and (device is not None or not d.get("device_drain"))

    return bool(row.get("drained")) or any(
        lifted(d) or d.get("health", "healthy") != "healthy" for d in devices
    )
