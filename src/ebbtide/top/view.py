"""What ``ebb top`` shows of a snapshot, and what each key does to it.

A :class:`ViewState` is the person's choice: the sort, the filters (node, user, queue),
the scroll offset, the panel, a filter being typed.  :func:`press` is pure: a state and
a key in, the next state out; the terminal loop only reads keys and draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ebbtide.top.snapshot import AttemptView, EvictionView, FleetSnapshot, GpuView, QueueView

#: The sorts ``s`` cycles through: node order, then the busiest first by each figure.
SORTS = ("node", "online", "offline", "headroom")
#: The panels Tab cycles through: one row per GPU, per eviction, per queue.
PANELS = ("gpus", "evictions", "queues")
#: The key that starts typing each filter, and the filter.
FILTER_KEYS = {"n": "node", "u": "user", "Q": "queue"}
#: Longest filter text, in characters.
MAX_FILTER_CHARS = 64

HELP = (
    "q quit  s sort  n/u/Q filter node/user/queue  c clear filters  "
    "↑↓ j/k PgUp/PgDn scroll  Tab panel  r refresh"
)


@dataclass(frozen=True, slots=True)
class ViewState:
    """What the person chose to see."""

    #: one of :data:`SORTS`
    sort: str = "node"
    #: filters: rows whose node name, attempt owner or attempt queue contains the text
    #: (case-insensitive); "" shows all
    node: str = ""
    user: str = ""
    queue: str = ""
    #: the first row shown of the panel
    offset: int = 0
    #: one of :data:`PANELS`
    panel: str = "gpus"
    #: the filter being typed (``node``, ``user``, ``queue``), and its text so far
    prompt: str | None = None
    typed: str = ""
    #: q pressed: leave
    quit: bool = False
    #: r pressed: read a new snapshot now
    refresh: bool = False

    @property
    def filters(self) -> dict[str, str]:
        """The filters in force, by name."""
        named = {"node": self.node, "user": self.user, "queue": self.queue}
        return {name: text for name, text in named.items() if text}


# -- what a state shows -----------------------------------------------------------------


def _has(text: str, wanted: str) -> bool:
    return not wanted or wanted.lower() in text.lower()


def shown_attempts(gpu: GpuView, state: ViewState) -> tuple[AttemptView, ...]:
    """The attempts on ``gpu`` that the user and queue filters let through."""
    if not state.user and not state.queue:
        return gpu.attempts
    return tuple(
        a for a in gpu.attempts if _has(a.owner, state.user) and _has(a.queue, state.queue)
    )


#: Each sort but ``node``: the figure whose highest comes first.
_FIGURES: dict[str, Callable[[GpuView], float]] = {
    "online": lambda g: -g.online_compute_pct,
    "offline": lambda g: -g.offline_compute_pct,
    "headroom": lambda g: -g.headroom_compute_pct,
}


def visible_gpus(snapshot: FleetSnapshot, state: ViewState) -> list[GpuView]:
    """The GPUs the filters let through (with the user or queue filter: those holding a
    matching attempt), in the state's sort (ties in node order)."""
    gpus: Sequence[GpuView] = snapshot.gpus
    if state.node:
        gpus = [g for g in gpus if _has(g.node, state.node)]
    if state.user or state.queue:
        gpus = [g for g in gpus if shown_attempts(g, state)]
    figure = _FIGURES.get(state.sort)
    if figure is None:  # node order, as the snapshot has them
        return list(gpus)
    return sorted(gpus, key=figure)  # stable: node order within ties


def visible_evictions(snapshot: FleetSnapshot, state: ViewState) -> list[EvictionView]:
    return [
        e
        for e in snapshot.evictions
        if _has(e.node or "", state.node)
        and _has(e.owner, state.user)
        and _has(e.queue, state.queue)
    ]


def visible_queues(snapshot: FleetSnapshot, state: ViewState) -> list[QueueView]:
    return [q for q in snapshot.queues if _has(q.name, state.queue)]


def panel_rows(snapshot: FleetSnapshot, state: ViewState) -> int:
    """How many rows the state's panel has, scrolled or not."""
    if state.panel == "evictions":
        return len(visible_evictions(snapshot, state))
    if state.panel == "queues":
        return len(visible_queues(snapshot, state))
    return len(visible_gpus(snapshot, state))


def clamp(offset: int, total: int, page: int) -> int:
    """A scroll offset that keeps the last page full, never below 0."""
    return max(0, min(offset, total - max(1, page)))


# -- what a key does --------------------------------------------------------------------


def press(state: ViewState, key: str, *, page: int, total: int) -> ViewState:
    """The state after ``key`` (a character, or ``up``, ``down``, ``pgup``, ``pgdn``,
    ``home``, ``end``, ``tab``, ``enter``, ``esc``, ``backspace``, ``ctrl-c``), with
    ``page`` rows visible of the panel's ``total``."""
    replace = dataclasses.replace
    if key == "ctrl-c":
        return replace(state, quit=True)
    if state.prompt is not None:
        if key == "enter":
            text = state.typed.strip()
            return replace(state, prompt=None, typed="", offset=0, **{state.prompt: text})
        if key == "esc":
            return replace(state, prompt=None, typed="")
        if key == "backspace":
            return replace(state, typed=state.typed[:-1])
        if len(key) == 1 and key.isprintable() and len(state.typed) < MAX_FILTER_CHARS:
            return replace(state, typed=state.typed + key)
        return state
    if key == "q":
        return replace(state, quit=True)
    if key == "s":
        following = SORTS[(SORTS.index(state.sort) + 1) % len(SORTS)]
        return replace(state, sort=following, offset=0)
    if key in FILTER_KEYS:
        return replace(state, prompt=FILTER_KEYS[key], typed="")
    if key == "c":
        return replace(state, node="", user="", queue="", offset=0)
    if key == "r":
        return replace(state, refresh=True)
    if key == "tab":
        following = PANELS[(PANELS.index(state.panel) + 1) % len(PANELS)]
        return replace(state, panel=following, offset=0)
    moves = {
        "up": -1,
        "k": -1,
        "down": 1,
        "j": 1,
        "pgup": -page,
        "pgdn": page,
        " ": page,
        "home": -total,
        "g": -total,
        "end": total,
        "G": total,
    }
    if key in moves:
        return replace(state, offset=clamp(state.offset + moves[key], total, page))
    return state
