"""Whether the fleet's nodes, as they last reported, could ever hold a submission, and
how a whole GPU asked for with no memory is sized to their cards: what ``qsub`` and
``qalter`` check before a job is stored, so a job that could only wait for ever is refused
(or told) at once.  :mod:`ebbtide.client_checks` holds the policy's side of the same checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.whose_jobs import refuses
from ebbtide.scheduling.capacity import DEVICE_COMPUTE_PCT
from ebbtide.scheduling.fit import EPS as FIT_EPS
from ebbtide.units import format_mib
from ebbtide.waiting import NO_AGENT_NOTE as NO_AGENT_NOTE
from ebbtide.waiting import NO_SCHEDULER_NOTE as NO_SCHEDULER_NOTE


def _kept_back(device: dict[str, Any], margin_mib: float, planning_mib: float) -> float:
    """The memory the planner keeps back on ``device`` whatever its online load: the
    margin, and on a device measured for planning only (Prometheus, ``eviction_trigger``
    false) the planning margin too."""
    return margin_mib + (planning_mib if device.get("eviction_trigger") is False else 0.0)


def check_fits_fleet(
    spec: JobSpec, nodes: Sequence[Any], margin_mib: float = 0.0, planning_mib: float = 0.0
) -> None:
    """Refuse, saying what the fleet offers, a job no node that has reported could ever
    hold: more GPUs than any node has, or more memory per GPU than any card less what the
    planner always keeps back there for the online side (``margin_mib``, and
    ``planning_mib`` more on a node measured through Prometheus: a whole 80GiB card's
    worth asked of an 80GiB card would wait forever).  With no node reported yet there is
    nothing to compare with, so nothing is refused."""
    fleet = []
    usable = []
    planning_only = False
    for node in nodes:
        devices = json.loads(node.devices_json or "[]")
        planning_only |= any(d.get("eviction_trigger") is False for d in devices)
        memories = sorted((int(d.get("memory_mib") or 0) for d in devices), reverse=True)
        if memories:
            fleet.append((node.name, memories))
            usable.append(
                [
                    int(d.get("memory_mib") or 0) - _kept_back(d, margin_mib, planning_mib)
                    for d in devices
                ]
            )
    need = max(spec.gpus, 1)
    if not fleet or any(sum(1 for m in room if m >= spec.memory_mib) >= need for room in usable):
        return
    largest = sorted(fleet, key=lambda n: (len(n[1]), n[1][0]), reverse=True)[:3]
    offers = ", ".join(f"{name}: {len(mems)} × {format_mib(mems[0])}" for name, mems in largest)
    more = f" (and {len(fleet) - 3} more)" if len(fleet) > 3 else ""
    asked = f"{need} GPU{'s' if need > 1 else ''} with {format_mib(spec.memory_mib)} each"
    planned = f", {format_mib(int(planning_mib))} more where measured through Prometheus"
    kept = (
        f" (of which {format_mib(int(margin_mib))} a card is always kept for the online side"
        f"{planned if planning_only and planning_mib else ''})"
        if margin_mib
        else ""
    )
    raise SpecError(
        "gpu" if need > max(len(m) for _, m in fleet) else "gpumem",
        f"no node could ever hold it: it asks for {asked} on one node, and the largest "
        f"nodes are {offers}{more}{kept}; give --allow-future (allow_future=True) if such a "
        "node will join",
    )


def check_share_fits(
    spec: JobSpec, nodes: Sequence[Any], margin_pct: float = 0.0, planning_pct: float = 0.0
) -> None:
    """Refuse a share of a GPU that no device could ever give: the planner keeps
    ``margin_pct`` of every GPU's compute for the online side (``planning_pct`` more on a
    device measured through Prometheus), so ``-l gpu=96%`` would wait for good, while
    ``-l gpu=1`` (a whole GPU, beside the online load) would run.  Whole GPUs are not
    shares: they are left alone."""
    if spec.gpus or (not margin_pct and not planning_pct):
        return
    devices = [d for node in nodes for d in json.loads(node.devices_json or "[]")]
    planned = bool(devices) and all(d.get("eviction_trigger") is False for d in devices)
    most = DEVICE_COMPUTE_PCT - margin_pct - (planning_pct if planned else 0.0)
    if spec.compute_pct <= most + FIT_EPS:
        return
    more = f", and {planning_pct:g}% more where measured through Prometheus" if planned else ""
    raise SpecError(
        "gpu",
        f"no device could ever give {spec.compute_pct:g}% of a GPU: {margin_pct:g}% of "
        f"each GPU's compute is always kept for the online side{more}, so a share is at "
        f"most {most:g}%; ask for less, or for a whole GPU (-l gpu=1), which runs beside "
        "the online load",
    )


def runs_jobs_of(owner: str, nodes: Sequence[Any]) -> list[Any]:
    """The ``nodes`` that would run ``owner``'s jobs (their heartbeat's ``runs_jobs_of``;
    one that did not say runs anyone's), or all of them where none would: then
    :func:`check_someone_runs` says so."""
    return [n for n in nodes if refuses(getattr(n, "runs_jobs_of", None), owner) is None] or list(
        nodes
    )


def check_someone_runs(owner: str, nodes: Sequence[Any]) -> None:
    """Refuse ``owner``'s job when every node that has reported says it would refuse it
    at its start (whose jobs it runs: its heartbeat's ``runs_jobs_of``), naming what each
    runs, rather than accept a job that could only fail.  With no node reported, or one
    that did not say (an older agent), nothing is refused."""
    said = [(n.name, getattr(n, "runs_jobs_of", None)) for n in nodes]
    if not said or any(not runs for _, runs in said):
        return
    why = [(name, refuses(runs, owner)) for name, runs in said]
    if any(reason is None for _, reason in why):
        return
    shown = "; ".join(f"node {name} {reason}" for name, reason in why[:3])
    more = f" (and {len(why) - 3} more nodes)" if len(why) > 3 else ""
    raise SpecError(
        "owner",
        f"no node runs {owner}'s jobs: {shown}{more}. An agent run as root with --run-as "
        "owner runs each job as its owner; give --allow-future (allow_future=True) if "
        "such a node will join",
    )


def waiting_notes(nodes: Sequence[Any], scheduler_running: Callable[[], bool | None]) -> list[str]:
    """What a submission is told of what it waits for: no node agent ever reported (a new
    system, or a mistyped EBBTIDE_HOME), or agents but no scheduler (a trial's trap: the
    job sat queued, unsaid; ``scheduler_running`` is asked only then)."""
    if not nodes:
        return [NO_AGENT_NOTE]
    return [NO_SCHEDULER_NOTE] if scheduler_running() is False else []


def fit_to_fleet(
    spec: JobSpec, user: str, nodes: Sequence[Any], defaults: Any, check: bool = True
) -> tuple[JobSpec, str | None]:
    """``spec`` as ``user``'s nodes would hold it (a whole GPU's memory, with a note:
    :func:`with_whole_gpu_memory`), and with ``check`` refused unless one of them could
    ever hold it (:func:`check_fits_fleet`, :func:`check_share_fits`): what ``qsub`` and
    ``qalter`` both check, under the policy's ``defaults``."""
    mine = runs_jobs_of(user, nodes)  # a whole GPU is one of theirs
    margin, planning = defaults.margin_memory_mib, defaults.planning_margin_memory_mib
    spec, note = with_whole_gpu_memory(spec, mine, margin, planning)
    if check:
        check_fits_fleet(spec, mine, margin, planning)
        check_share_fits(
            spec, mine, defaults.margin_compute_pct, defaults.planning_margin_compute_pct
        )
    return spec, note


def with_whole_gpu_memory(
    spec: JobSpec, nodes: Sequence[Any], margin_mib: float = 0.0, planning_mib: float = 0.0
) -> tuple[JobSpec, str | None]:
    """A job that asks for whole GPUs (``-l ngpus=1``, ``--gres=gpu:1``) and not for an
    amount of their memory is given all of each card's memory it can ever have, as a PBS
    or Slurm user expects of a GPU: the smallest card's among the nodes that have reported
    (so it may run on any of them; MIG instances count only where no whole GPU has
    reported), less what the planner always keeps back there for the online side
    (``margin_mib``, ``defaults.margin_memory_mib``, and on a node measured
    through Prometheus ``planning_mib`` more: a grant of the whole card would never fit),
    with a note saying so, and saying when no card has that much free now (online memory,
    the forecast's reserve: the job waits until one has).  With an amount asked for,
    ``spec`` as it is; with no card reported, ``spec`` as it is and a note saying what
    it is granted."""
    if not spec.gpus or "memory_mib" in spec.model_fields_set:
        return spec, None
    devices = [
        (node.name, d)
        for node in nodes
        for d in json.loads(node.devices_json or "[]")
        if d.get("memory_mib")
    ]
    if not devices:  # a trial's trap: granted the default gpumem, and not told
        plural = "s" if spec.gpus > 1 else ""
        return spec, (
            f"{spec.gpus} whole GPU{plural} with no gpumem, and no node has reported its "
            f"cards yet: granted {format_mib(spec.memory_mib)} of memory on each (the "
            f"default); {_gpumem_flag(spec)} asks for what it needs (ebb qalter can change "
            "it until it starts)"
        )
    # MIG instances are GPUs to the planner, but a whole GPU asked for means a card
    cards = [(name, d) for name, d in devices if d.get("mig_parent") is None]
    what = "the smallest card here" if cards else "the smallest MIG instance here"
    devices = cards or devices
    _, least = min(
        devices,
        key=lambda nd: int(nd[1]["memory_mib"]) - _kept_back(nd[1], margin_mib, planning_mib),
    )
    card, kept_mib = int(least["memory_mib"]), _kept_back(least, margin_mib, planning_mib)
    memory = max(1, int(card - kept_mib))
    plural = "s" if spec.gpus > 1 else ""
    kept = f" less the {format_mib(int(kept_mib))} kept for the online side" if kept_mib else ""
    note = (
        f"{spec.gpus} whole GPU{plural} with no gpumem: granted {format_mib(memory)} of "
        f"memory on each, {what} ({format_mib(card)}){kept}; "
        f"{_gpumem_flag(spec)} asks for less"
    )
    return spec.model_copy(update={"memory_mib": memory}), note + _room_now(
        spec, devices, memory, margin_mib
    )


def _gpumem_flag(spec: JobSpec) -> str:
    """How the submitter asks for GPU memory: Slurm has no flag for it (its
    ``--mem-per-gpu`` is host memory), so a Slurm script says it on an ``#EBB`` line."""
    return "an '#EBB -l gpumem=SIZE' line" if spec.compat == "slurm" else "-l gpumem=SIZE"


def _room_now(
    spec: JobSpec, devices: Sequence[tuple[str, dict[str, Any]]], memory: int, margin: float
) -> str:
    """What to add to the whole-GPU note when no card has ``memory`` free as its agent
    last reported it (its online memory and its forecast's reserve, the planning margin
    of a node measured through Prometheus included): the most any card has, and whether
    that card's agent is still warming up, or else that online memory may never leave
    room, and what ``spec`` may ask for to run now."""

    def free(d: dict[str, Any]) -> float:
        held = float(d.get("online_memory_mib") or 0.0) + float(d.get("reserve_memory_mib") or 0.0)
        return float(d["memory_mib"]) - held - margin

    name, best = max(devices, key=lambda nd: free(nd[1]))
    if free(best) >= memory:
        return ""
    cold = float(best.get("reserve_cold_for_s") or 0.0)
    why = (
        f", while its agent learns the online load for {cold / 60:.0f} more min "
        "(defaults.forecast_warmup_s)"
        if cold > 0
        else ""
    )
    most = int(max(0.0, free(best)))
    never = ""
    if not cold:  # a trial's trap: "it waits until one has" read as soon, where an
        # inference server holds its memory for as long as it runs
        never = ", which an online service that keeps its memory may never allow"
        if most >= 1024:
            never += f": {_gpumem_flag(spec)} of up to {most // 1024}GiB runs beside it now"
    return (
        f"; no card has that free now (at most {format_mib(most)}, on "
        f"{name}/{best.get('index')}, beside online memory and the reserve kept for its "
        f"growth{why}), so it waits until one has{never}"
    )
