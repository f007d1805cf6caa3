"""One frame of ``ebb top``: a header with the fleet's totals and each queue's depth, one
row per GPU (or per eviction, or per queue: the panel), the latest evictions, the keys.

Pure: a snapshot, a view and the terminal's size in, a rich renderable out.  Only the
rows that fit are built, so a frame of 1,000 GPUs costs what a frame of 50 does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from rich.console import Group, RenderableType
from rich.text import Text

from ebbtide.top.snapshot import (
    NO_WORK_STATES,
    AttemptView,
    EvictionView,
    FleetSnapshot,
    GpuView,
    QueueView,
    keeps_back,
)
from ebbtide.top.view import (
    HELP,
    ViewState,
    clamp,
    shown_attempts,
    visible_evictions,
    visible_gpus,
    visible_queues,
)

T = TypeVar("T")

#: Width of a GPU's compute bar, in characters (half on a narrow terminal).
BAR_WIDTH = 20
#: Evictions the footer lists under the GPUs, at most.
FOOTER_EVICTIONS = 5
#: Attempts named in a GPU's row before "+N more".
MAX_ATTEMPTS_NAMED = 8
#: The panel keeps at least this many rows before the footer gives up its evictions.
MIN_BODY_ROWS = 5
#: Lines above the panel (title, totals, queues) and below it (keys).
HEADER_LINES = 3
HELP_LINES = 1

#: How each device state looks in its row.
STATE_LOOK = {
    "ok": ("ok", "green"),
    "cooling": ("cool", "yellow"),
    "stale": ("stale", "yellow"),
    "stopping": ("stop", "yellow"),
    "drained": ("drain", "yellow"),
    "out": ("OUT", "bold red"),
    "silent": ("SILENT", "bold red"),
}
#: What an attempt's state adds to its name in a row.
ATTEMPT_MARKS = {"dispatched": ("starting", "dim"), "evicting": ("evicting", "red")}


@dataclass(frozen=True, slots=True)
class FrameLayout:
    """How many rows each part of a frame gets."""

    #: rows of the panel (None: all of them)
    body: int | None
    #: evictions listed in the footer (0: no footer)
    footer_evictions: int


def frame_layout(height: int | None, snapshot: FleetSnapshot, state: ViewState) -> FrameLayout:
    """Rows for the panel and the footer on a terminal ``height`` lines tall (None: no
    limit, as ``--once`` into a file): the footer's evictions shrink first."""
    footer = 0
    if state.panel != "evictions":
        footer = min(FOOTER_EVICTIONS, len(visible_evictions(snapshot, state)))
    if height is None:
        return FrameLayout(None, footer)
    fixed = HEADER_LINES + HELP_LINES + 1  # + the panel's column headings
    body = height - fixed - (footer + 1 if footer else 0)
    if body < MIN_BODY_ROWS and footer:
        footer = max(0, footer - (MIN_BODY_ROWS - body))
        body = height - fixed - (footer + 1 if footer else 0)
    return FrameLayout(max(1, body), footer)


def page_rows(height: int | None, snapshot: FleetSnapshot, state: ViewState) -> int:
    """The rows one screen of the panel holds (what PgDn moves)."""
    body = frame_layout(height, snapshot, state).body
    return body if body is not None else 1_000_000


def render(
    snapshot: FleetSnapshot,
    state: ViewState,
    width: int,
    height: int | None,
    *,
    status: str | None = None,
    keys: bool = True,
) -> RenderableType:
    """The frame of ``snapshot`` in ``state`` for a terminal ``width`` × ``height``
    (height None: every row); ``status`` (e.g. why the last refresh failed) shows in
    the title; ``keys`` False leaves out the keys' help (``--once``: no key works)."""
    layout = frame_layout(height, snapshot, state)
    parts: list[RenderableType] = [
        _title(snapshot, state, status),
        _totals(snapshot, width),
        _queues_line(visible_queues(snapshot, state)),
    ]
    if state.panel == "evictions":
        evictions = visible_evictions(snapshot, state)
        first, some_evictions = _window(evictions, state.offset, layout.body)
        panel, total, count = _eviction_lines(some_evictions), len(evictions), len(some_evictions)
    elif state.panel == "queues":
        queues = visible_queues(snapshot, state)
        first, some_queues = _window(queues, state.offset, layout.body)
        panel, total, count = _queue_lines(some_queues), len(queues), len(some_queues)
    else:
        gpus = visible_gpus(snapshot, state)
        first, some_gpus = _window(gpus, state.offset, layout.body)
        panel, total, count = _gpu_lines(some_gpus, state, width), len(gpus), len(some_gpus)
    parts.extend(panel)
    if layout.footer_evictions:
        recent = visible_evictions(snapshot, state)[: layout.footer_evictions]
        parts.extend(_eviction_lines(recent))
    parts.append(_help(state, first, count, total, keys=keys))
    return Group(*parts)


def _window(rows: Sequence[T], offset: int, body: int | None) -> tuple[int, Sequence[T]]:
    """The first row shown (the offset, clamped) and the rows that fit in ``body``."""
    page = len(rows) if body is None else body
    first = clamp(offset, len(rows), page)
    return first, rows[first : first + page]


# -- the header -------------------------------------------------------------------------


def _line() -> Text:
    return Text(no_wrap=True, overflow="ellipsis", end="\n")


def _title(snapshot: FleetSnapshot, state: ViewState, status: str | None) -> Text:
    t = snapshot.totals
    line = _line()
    line.append("ebb top", style="bold")
    if status:  # first: the rest of the line may not fit
        line.append(f"  {status}", style="bold red")
    line.append(f"  {_clock(snapshot.taken_at)}  ")
    line.append(f"{t.gpus:,} GPUs on {t.nodes:,} nodes  ")
    line.append(f"{t.attempts:,} attempts ({t.paused:,} paused)  ")
    line.append(f"sort: {state.sort}", style="cyan")
    for name, text in state.filters.items():
        line.append(f"  {name}~{text}", style="magenta")
    for note in snapshot.notes:
        line.append(f"  {note}", style="yellow")
    return line


def _totals(snapshot: FleetSnapshot, width: int) -> Text:
    t = snapshot.totals
    line = _line()
    line.append("compute ")
    line.append(f"online {t.online_compute_pct:.0f}%", style="red")
    line.append("  ")
    line.append(f"offline {t.offline_compute_pct:.0f}%", style="green")
    # headroom and free are before the reserve and the margin are kept back: the
    # reserve (KEPT) is said beside them
    line.append(f"  headroom {t.headroom_compute_pct:.0f}% (kept {t.reserve_compute_pct:.0f}%) ")
    line.append_text(_bar(t.online_compute_pct, t.offline_compute_pct, True, _bar_width(width)))
    line.append(
        f"   memory online {_gib(t.online_memory_mib)}  offline {_gib(t.offline_memory_mib)}  "
        f"free {_gib(t.headroom_memory_mib)} of {_gib(t.memory_mib)} GiB "
        f"(kept {_gib(t.reserve_memory_mib)})"
    )
    if t.unavailable:
        line.append(f"   {t.unavailable} GPUs take no work", style="yellow")
    if t.silent_nodes:
        line.append(f"   {t.silent_nodes} nodes silent", style="bold red")
    return line


def _queues_line(queues: Sequence[QueueView]) -> Text:
    line = _line()
    line.append("queues  ")
    if not queues:
        line.append("none", style="dim")
    for pos, q in enumerate(queues):
        if pos:
            line.append(" · ", style="dim")
        line.append(q.name, style="bold")
        line.append(f" {q.active} running {q.count('queued')} queued")
        for state in ("waiting", "held"):
            if q.count(state):
                line.append(f" {q.count(state)} {state}")
    return line


# -- the panels -------------------------------------------------------------------------
#
# Rows are lines of fixed-width columns, not a rich Table: a table measures every cell
# of every row each frame, and a frame must stay well under 200 ms at 1,000 GPUs.


def _fit(text: str, width: int, *, right: bool = False) -> str:
    """``text`` in exactly ``width`` characters: cut with … or padded."""
    if len(text) > width:
        text = text[: max(0, width - 1)] + "…"
    return text.rjust(width) if right else text.ljust(width)


def _heading(text: str) -> Text:
    line = _line()
    line.append(text, style="bold")
    return line


def _gpu_lines(gpus: Sequence[GpuView], state: ViewState, width: int) -> list[Text]:
    bar_width = _bar_width(width)
    wide = width >= 100  # room for the memory column
    names = min(max(max((len(g.name) for g in gpus), default=3), 3), 24)
    memory = f"{'MEM GiB':>13} {'KEPT GiB':>8} " if wide else ""
    lines = [
        _heading(
            f"{_fit('GPU', names)} {_fit('COMPUTE', bar_width)} {'ONL':>4} {'OFF':>4} "
            f"{'FREE':>4} {'KEPT':>4} {memory}{'STATE':<6} ATTEMPTS"
        )
    ]
    for g in gpus:
        word, style = STATE_LOOK.get(g.state, (g.state, ""))
        line = _line()
        line.append(_fit(g.name, names) + " ")
        usable = g.state not in NO_WORK_STATES
        _append_bar(line, g.online_compute_pct, g.offline_compute_pct, usable, bar_width)
        # a device that takes no work keeps nothing back from admission (nor do the totals)
        kept = f"{g.reserve_compute_pct:>3.0f}%" if usable else "   -"
        line.append(
            f" {g.online_compute_pct:>3.0f}% {g.offline_compute_pct:>3.0f}% "
            f"{g.headroom_compute_pct:>3.0f}% {kept} "
        )
        if wide:
            used = f"{_gib(g.online_memory_mib)}+{_gib(g.offline_memory_mib)}/{_gib(g.memory_mib)}"
            line.append(_fit(used, 13, right=True) + " ")
            kept_gib = _gib(g.reserve_memory_mib) if usable else "-"
            line.append(_fit(kept_gib, 8, right=True) + " ")
        line.append(_fit(word, 6), style=style)
        line.append(" ")
        _append_attempts(line, g, shown_attempts(g, state))
        lines.append(line)
    return lines


def _append_attempts(line: Text, gpu: GpuView, attempts: Sequence[AttemptView]) -> None:
    noted = bool(gpu.note) and gpu.state != "ok"
    if noted:
        line.append(gpu.note + (": " if attempts else ""), style="yellow")
    elif (
        gpu.reserve_cold_for_s > 0
        and gpu.state not in NO_WORK_STATES
        and keeps_back(gpu.reserve_compute_pct, gpu.reserve_memory_mib)
    ):
        # KEPT is the cold reserve, not a forecast: say so, as `ebb nodes` does
        line.append("warming up (cold reserve)" + (": " if attempts else ""), style="cyan")
        noted = True
    for pos, a in enumerate(attempts[:MAX_ATTEMPTS_NAMED]):
        if pos:
            line.append(", ")
        line.append(f"#{a.job_id}", style="bold")
        line.append(f" {a.owner}/{a.queue}")
        if a.suspended:
            line.append(" (suspended)", style="yellow")
        elif a.paused:
            line.append(" (paused)", style="yellow")
        elif a.state in ATTEMPT_MARKS:
            mark, style = ATTEMPT_MARKS[a.state]
            line.append(f" ({mark})", style=style)
    if len(attempts) > MAX_ATTEMPTS_NAMED:
        line.append(f", +{len(attempts) - MAX_ATTEMPTS_NAMED} more", style="dim")
    if not attempts and not noted:
        line.append("-", style="dim")


def _eviction_lines(evictions: Sequence[EvictionView]) -> list[Text]:
    jobs = [f"#{e.job_id} {e.owner}/{e.queue}" for e in evictions]
    job_width = min(max(max((len(j) for j in jobs), default=3), 3), 32)
    where_width = min(max(max((len(e.where) for e in evictions), default=4), 4), 24)
    lines = [
        _heading(
            f"{'EVICTED':<8} {_fit('JOB', job_width)} {_fit('FROM', where_width)} "
            f"{'LATENCY':>8} {'DEADLINE':<10} REASON"
        )
    ]
    for e, job in zip(evictions, jobs, strict=True):
        line = _line()
        latency = "-" if e.latency_s is None else f"{e.latency_s:.2f}s"
        line.append(
            f"{_clock(e.time)} {_fit(job, job_width)} {_fit(e.where, where_width)} {latency:>8} "
        )
        deadline, style = _deadline(e)
        line.append(_fit(deadline, 10), style=style)
        line.append(" " + e.reason + (" (killed at the deadline)" if e.killed else ""))
        lines.append(line)
    return lines


def _deadline(e: EvictionView) -> tuple[str, str]:
    """Whether the eviction met its deadline, in a word and the deadline, and a style."""
    of = "" if e.deadline_s is None else f" {e.deadline_s:g}s"
    if e.met_deadline is None:
        return "?" + of, "dim"
    if e.met_deadline:
        return "met" + of, "green"
    return "MISSED" + of, "bold red"


def _queue_lines(queues: Sequence[QueueView]) -> list[Text]:
    from ebbtide.queue.states import JobState

    names = min(max(max((len(q.name) for q in queues), default=5), 5), 24)
    widths = [max(len(s.value), 7) for s in JobState]
    lines = [
        _heading(
            _fit("QUEUE", names)
            + "".join(f" {s.value.upper():>{w}}" for s, w in zip(JobState, widths, strict=True))
        )
    ]
    for q in queues:
        counts = "".join(
            f" {q.count(s.value):>{w},}" for s, w in zip(JobState, widths, strict=True)
        )
        line = _line()
        line.append(_fit(q.name, names), style="bold")
        line.append(counts)
        lines.append(line)
    return lines


# -- the footer -------------------------------------------------------------------------


def _help(state: ViewState, first: int, shown: int, total: int, *, keys: bool = True) -> Text:
    line = _line()
    where = f"{first + 1}-{first + shown} of {total:,}" if shown else f"0 of {total:,}"
    line.append(f"{state.panel} {where}  ", style="cyan")
    if not keys:
        return line
    if state.prompt is not None:
        line.append(f"filter {state.prompt}: ", style="bold")
        line.append(state.typed + "▏", style="reverse")
        line.append("  Enter applies (empty clears), Esc cancels", style="dim")
    else:
        line.append(HELP, style="dim")
    return line


# -- small pieces -----------------------------------------------------------------------


def _bar_width(width: int) -> int:
    return BAR_WIDTH if width >= 140 else BAR_WIDTH // 2


def _bar(online_pct: float, offline_pct: float, usable: bool, width: int) -> Text:
    bar = Text(no_wrap=True)
    _append_bar(bar, online_pct, offline_pct, usable, width)
    return bar


def _append_bar(
    line: Text, online_pct: float, offline_pct: float, usable: bool, width: int
) -> None:
    """``█`` online (red), ``▒`` offline slices (green), ``·`` headroom; ``×`` where the
    device takes no work."""
    online = max(0, min(width, round(online_pct / 100 * width)))
    offline = max(0, min(width - online, round(offline_pct / 100 * width)))
    line.append("█" * online, style="red")
    line.append("▒" * offline, style="green")
    line.append(("·" if usable else "×") * (width - online - offline), style="dim")


def _gib(mib: float) -> str:
    return f"{mib / 1024:,.0f}"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "--:--:--"
