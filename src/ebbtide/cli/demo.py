"""``ebb demo``: a one-command tour of ebbtide on simulated GPUs, nothing to install.

(Longer than our modules should be: it is one command's script: the tour's jobs, its feed of
submissions, the tables it prints as it goes and its summary all follow the one timeline of
the tour.)

Embedded mode (scheduler and one node agent in this process, SQLite in a fresh home,
dramatiq's in-memory broker) on two simulated 80 GiB devices whose online load replays
the real trace shipped in ``ebbtide/data`` (see its ATTRIBUTION.md).  A few checkpointing
jobs (:mod:`ebbtide.demo_job`) are submitted through the SDK; the demo prints the online
load, the slices held and every job event as it happens, then a summary: evictions,
deadline misses, eviction latency, work lost and GPU time harvested.

Job lengths are in trace seconds, so ``--speedup`` shortens the whole tour alike; the
eviction deadlines stay in wall seconds (they are the hard bound the product promises).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ebbtide.client import Client
from ebbtide.config.settings import Settings
from ebbtide.queue.spec import MIN_JOB_DURATION_S, JobSpec
from ebbtide.queue.states import FINAL_STATES, JobState
from ebbtide.queue.store import Store
from ebbtide.runtime import Runtime, build
from ebbtide.scheduling.snapshot import ActiveAttempt
from ebbtide.units import format_mib
from ebbtide.workers.headroom.base import DeviceInfo, DeviceSample, HeadroomSource
from ebbtide.workers.headroom.factory import open_source

#: the online trace the demo replays, shipped in ``ebbtide/data``
TRACE_NAME = "genai_sample.csv"
#: the simulated devices: how many, and their memory in MiB
DEVICE_COUNT = 2
DEVICE_MEMORY_MIB = 80 * 1024
NODE = "demo-node"
#: how often the demo reads new events from the store, in seconds
POLL_PERIOD_S = 0.1
#: how often a line of online load is printed when the output is not a terminal, in seconds
LOAD_PERIOD_S = 2.0
#: one step of a demo job, in trace seconds
STEP_TRACE_S = 0.05
#: how long the agent watches the online load before the jobs are submitted, in trace seconds
WARMUP_TRACE_S = 4.0
#: give up when the jobs are not done after this many trace seconds (the trace loops)...
GIVE_UP_TRACE_S = 400.0
#: ...plus this many wall seconds (admission waits out recent peaks in wall time)
GIVE_UP_S = 60.0
#: resolution of the integral of the spare compute the trace left, in wall seconds
SPARE_STEP_S = 0.05

log = logging.getLogger("ebbtide")


@dataclasses.dataclass(frozen=True)
class DemoJob:
    name: str
    kind: str
    #: the slice: compute share in percent, memory in GiB
    gpu_pct: float
    gpumem_gib: float
    #: work to do and the time between checkpoints, in trace seconds
    work_s: float
    every_s: float
    #: eviction deadline, in wall seconds
    deadline_s: float
    ignore_warning: bool = False
    priority: int = 0
    #: a compute spike may pause it (False: like a collective that times out, evicted)
    pause: bool = True

    def describe(self) -> str:
        text = (
            f"{self.gpu_pct:g}% · {self.gpumem_gib:g}GiB, {self.work_s:g} s of work, "
            f"checkpoints every {self.every_s:g} s, deadline {self.deadline_s:g} s"
        )
        if self.ignore_warning:
            text += f", priority {self.priority}, ignores the warning"
        if not self.pause:
            text += ", cannot be paused"
        return text


#: the jobs submitted, in order (``--jobs N`` takes the first N, cycling)
JOB_MIX: tuple[DemoJob, ...] = (
    # cannot be paused (say a collective with timeouts): a compute spike evicts it
    DemoJob("finetune-a", "training", 30, 16, 50, 1, 5, pause=False),
    DemoJob("embed", "inference", 20, 40, 40, 1, 5),
    # low priority, so it is the first victim on its device; ignores the warning, and
    # cannot be paused: killed at its deadline
    DemoJob(
        "eval-stubborn", "batch", 20, 8, 45, 3, 3, ignore_warning=True, priority=-1, pause=False
    ),
    DemoJob("finetune-b", "training", 25, 12, 45, 1, 5),
    DemoJob("batch-infer", "inference", 20, 12, 30, 1, 5),
    DemoJob("sweep", "training", 15, 6, 20, 1, 5),
)


def pick_jobs(count: int) -> list[DemoJob]:
    out = []
    for i, job in zip(range(count), itertools.cycle(JOB_MIX), strict=False):
        lap = i // len(JOB_MIX)
        out.append(job if lap == 0 else dataclasses.replace(job, name=f"{job.name}-{lap}"))
    return out


def job_spec(job: DemoJob, speedup: float, cwd: Path) -> JobSpec:
    steps = max(1, round(job.work_s / STEP_TRACE_S))
    every = max(1, round(job.every_s / STEP_TRACE_S))
    command = [sys.executable, "-m", "ebbtide.demo_job", str(steps)]
    command += ["--step-s", f"{STEP_TRACE_S / speedup:g}", "--every", str(every)]
    return JobSpec(
        name=job.name,
        kind=job.kind,
        command=[*command, "--ignore-warning"] if job.ignore_warning else command,
        compute_pct=job.gpu_pct,
        memory_mib=round(job.gpumem_gib * 1024),
        deadline_s=job.deadline_s,
        priority=job.priority,
        # at --speedup 20 a 1 s interval would be shorter than any job may ask for
        checkpoint_interval_s=max(MIN_JOB_DURATION_S, job.every_s / speedup),
        cwd=str(cwd),
        pause=job.pause,
    )


# -- what is shown while it runs --------------------------------------------------------


def _gpu(devices: Any) -> str:
    return ",".join(f"gpu{d}" for d in devices) if devices else "-"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


class Feed:
    """Reads the demo jobs' new events through the SDK and prints each as one line."""

    STYLES = {
        "evict": "bold red",
        "evicted": "magenta",
        "paused": "yellow",
        "thawed": "cyan",
        "resumed": "cyan",
        "succeeded": "green",
    }

    def __init__(
        self, client: Client, console: Console, t0: float, jobs: dict[int, DemoJob]
    ) -> None:
        self.client, self.console, self.t0, self.jobs = client, console, t0, jobs
        #: events of each job already shown (a job's events only grow, oldest first)
        self.seen: dict[int, int] = {}
        self.final: dict[int, str] = {}
        self._device: dict[int, Any] = {}

    def poll(self) -> None:
        new: list[list[tuple[float, int, dict[str, Any]]]] = []
        for job_id in list(self.jobs):
            events = self.client.events(job_id)
            new.append([(e["time"], job_id, e) for e in events[self.seen.get(job_id, 0) :]])
            self.seen[job_id] = len(events)
        # in time order across jobs, each job's in its own order
        for at, job_id, event in heapq.merge(*new, key=lambda n: n[0]):
            shown = self._describe(job_id, event["type"], event["attempt"], event)
            if shown is not None:
                self.line(at, *shown, job_id=job_id)

    def line(self, at: float, what: str, detail: str, *, job_id: int | None = None) -> None:
        label = f"#{job_id} {self.jobs[job_id].name}" if job_id is not None else ""
        text = Text(f"{at - self.t0:6.1f}s  ")
        text.append(f"{what:<10} ", style=self.STYLES.get(what, "bold"))
        text.append(f"{label:<19} {detail}")
        self.console.print(text)

    def _describe(
        self, job_id: int, kind: str, attempt: int | None, data: dict[str, Any]
    ) -> tuple[str, str] | None:
        if kind == "submitted":
            return "submitted", self.jobs[job_id].describe()
        if kind == "dispatched":
            self._device[job_id] = data.get("devices")
            slice_ = f"{data['compute_pct']:g}% · {format_mib(data['memory_mib'])}"
            return "dispatched", f"→ {_gpu(data.get('devices'))} ({slice_}), attempt {attempt}"
        if kind == "started" and (attempt or 1) > 1:
            job = self.client.get(job_id)
            done, total = job.progress_done or 0, job.progress_total
            if job.checkpoint_path is None:
                start = "from the start (no checkpoint yet)"
            else:
                start = "from its checkpoint" + (f" at {100 * done / total:.0f}%" if total else "")
            return "resumed", f"attempt {attempt} on {_gpu(self._device.get(job_id))} {start}"
        if kind == "paused":
            return "paused", f"{data.get('reason')} (frozen in place, nothing lost)"
        if kind == "thawed":
            return "thawed", f"runs on after {float(data.get('paused_s') or 0):.1f} s paused"
        if kind == "evict_requested":
            return "evict", f"{data.get('reason')} [by the {data.get('source')}]"
        if kind == "evicted":
            if data.get("killed"):
                how = "killed at the deadline"
            else:
                how = "exited" + (" after a checkpoint" if data.get("checkpointed") else "")
            miss = " — DEADLINE MISSED" if data.get("deadline_missed") else ""
            lost = f"lost {data.get('lost_work_s', 0):.1f} s of work"
            return "evicted", f"slice free in {_ms(data.get('latency_s', 0))} ({how}); {lost}{miss}"
        if kind == "requeued":
            return "requeued", "resumes from its last checkpoint when a slice is free"
        if kind == "lost":
            return "lost", str(data.get("reason"))
        if kind in {s.value for s in FINAL_STATES}:
            if kind == "failed" and not data.get("final"):
                return "failed", f"exit code {data.get('exit_code')}; retried"
            self.final[job_id] = kind
            return kind, f"after {attempt} attempt(s)" if attempt else ""
        return None


def _held(active: list[ActiveAttempt], index: int) -> str:
    here = [a for a in active if index in a.devices]
    parts = [
        f"#{a.job_id} {a.compute_pct:g}%·{format_mib(a.memory_mib)}"
        + ("(evicting)" if a.state == JobState.EVICTING else "")
        for a in here
    ]
    return ", ".join(parts) or "—"


def load_line(samples: list[DeviceSample], active: list[ActiveAttempt]) -> str:
    return "   ".join(
        f"gpu{s.index} {s.online_compute_pct:3.0f}% {format_mib(s.online_memory_mib):>8} "
        f"[{_held(active, s.index)}]"
        for s in samples
    )


def _bar(online_pct: float, offline_pct: float, width: int = 20) -> Text:
    online = min(width, round(online_pct / 100 * width))
    offline = min(width - online, round(offline_pct / 100 * width))
    bar = Text("█" * online, style="red")
    bar.append("▒" * offline, style="cyan")
    bar.append("·" * (width - online - offline), style="dim")
    return bar


def load_table(samples: list[DeviceSample], active: list[ActiveAttempt], t: float) -> Table:
    table = Table(
        title=f"{t:6.1f}s  compute: █ online  ▒ offline slices  · idle",
        title_justify="left",
    )
    for column in ("device", "compute", "online", "online memory", "offline slices held"):
        table.add_column(column)
    for s in samples:
        offline = sum(a.compute_pct for a in active if s.index in a.devices)
        table.add_row(
            f"gpu{s.index}",
            _bar(s.online_compute_pct, offline),
            f"{s.online_compute_pct:3.0f}%",
            f"{format_mib(s.online_memory_mib)} of {format_mib(DEVICE_MEMORY_MIB)}",
            _held(active, s.index),
        )
    return table


class _ConsoleLog(logging.Handler):
    """Prints ebbtide's warnings as demo lines instead of raw log records."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(Text(f"warning: {record.getMessage()}", style="yellow"))


# -- the summary ------------------------------------------------------------------------


def summarize(
    client: Client,
    store: Store,
    jobs: dict[int, DemoJob],
    source: HeadroomSource,
    t0: float,
    t_end: float,
) -> dict[str, Any]:
    events = {j: client.events(j) for j in jobs}
    evicted = [e for j in jobs for e in events[j] if e["type"] == "evicted"]
    pauses = sum(e["type"] == "paused" for j in jobs for e in events[j])
    latencies = [float(e.get("latency_s") or 0.0) for e in evicted]
    harvested = 0.0
    for j in jobs:
        for a in store.attempts(j):
            if a.started_at is not None:
                harvested += a.compute_pct / 100 * ((a.ended_at or t_end) - a.started_at)
    spare = 0.0
    t = t0
    while t < t_end:
        spare += sum(100 - s.online_compute_pct for s in source.sample(t)) / 100 * SPARE_STEP_S
        t += SPARE_STEP_S
    done = {j: client.get(j) for j in jobs}
    states = {j: job.state for j, job in done.items()}
    return {
        "jobs_submitted": len(jobs),
        "jobs_succeeded": sum(s == JobState.SUCCEEDED for s in states.values()),
        "jobs_failed": sum(s == JobState.FAILED for s in states.values()),
        "pauses": pauses,
        "evictions": len(evicted),
        "checkpointed": sum(bool(e.get("checkpointed")) and not e.get("killed") for e in evicted),
        "killed_at_deadline": sum(bool(e.get("killed")) for e in evicted),
        "deadline_misses": sum(
            bool(e.get("deadline_missed")) or e.get("latency_s", 0) > e.get("deadline_s", 1e9)
            for e in evicted
        ),
        "eviction_latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "eviction_latency_max_s": round(max(latencies), 4) if latencies else None,
        "lost_work_s": round(sum(float(e.get("lost_work_s") or 0.0) for e in evicted), 2),
        "harvested_gpu_s": round(harvested, 1),
        "spare_gpu_s": round(spare, 1),
        "harvested_pct_of_spare": round(100 * harvested / spare, 1) if spare else None,
        "wall_s": round(t_end - t0, 1),
        "jobs": [
            {"id": j, "name": d.name, "state": states.get(j), "evictions": done[j].evictions}
            for j, d in jobs.items()
        ],
    }


def print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title="ebb demo: summary", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    lat = (
        f"p50 {_ms(s['eviction_latency_p50_s'])} · max {_ms(s['eviction_latency_max_s'])}"
        if s["evictions"]
        else "-"
    )
    rows = [
        ("jobs done", f"{s['jobs_succeeded']} / {s['jobs_submitted']}"),
        ("pauses", f"{s['pauses']} (compute spikes: frozen in place, nothing lost)"),
        ("evictions", f"{s['evictions']} ({s['checkpointed']} checkpointed on the warning)"),
        ("killed at the deadline", str(s["killed_at_deadline"])),
        ("deadline misses", str(s["deadline_misses"])),
        ("eviction latency", lat + " (spike seen → slice free)"),
        ("work lost", f"{s['lost_work_s']:.1f} s (since the last checkpoints)"),
        (
            "GPU time harvested",
            f"{s['harvested_gpu_s']:.1f} GPU-s, {s['harvested_pct_of_spare'] or 0:.0f}% of the "
            f"{s['spare_gpu_s']:.0f} GPU-s online left idle",
        ),
        ("wall time", f"{s['wall_s']:.0f} s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


# -- the tour ---------------------------------------------------------------------------


#: The shipped trace is compressed this many times in time (see data/ATTRIBUTION.md).
TRACE_COMPRESSION = 30.0


def _intro(console: Console, source: HeadroomSource, speedup: float, count: int) -> None:
    duration = getattr(source, "duration_s", 0.0) / speedup
    console.print(
        f"[bold]ebb demo[/]: {DEVICE_COUNT} simulated {format_mib(DEVICE_MEMORY_MIB)} GPUs "
        f"whose online load replays a real production trace ({duration:.0f} s at {speedup:g}×).\n"
        "Trace: two Stable Diffusion serving pods, 45 min compressed 30×, from the Alibaba "
        "GenAI trace GenTD26 (SoCC'25), github.com/alibaba/clusterdata, CC BY 4.0.\n"
        f"{count} checkpointing offline jobs run in the headroom; when online load spikes they "
        "are warned, checkpoint and exit (or are killed at their deadline), then resume.\n"
        "Shown: online load and the slices held, each job event as it happens, then a summary.",
        highlight=False,
    )


def _demo_policy(home: Path, speedup: float) -> Path:
    """The trace runs 30× faster than life (and ``speedup`` on top), so the anti-thrash,
    forecast and pause settings shrink with it: a 30 s cooldown is 1 s of demo time."""
    scale = TRACE_COMPRESSION * speedup
    path = home / "ebbtide.yaml"
    path.write_text(
        "apiVersion: ebbtide/v1\n"
        "defaults:\n"
        f"  eviction_cooldown_s: {30 / scale:.3f}\n"
        f"  backoff_base_s: {30 / scale:.3f}\n"
        f"  backoff_max_s: {1800 / scale:.3f}\n"
        f"  forecast_history_s: {3600 / scale:.3f}\n"
        f"  forecast_warmup_s: {600 / scale:.3f}\n"
        f"  pause_min_s: {5 / scale:.3f}\n"
        f"  max_pause_s: {max(1.0, 600 / scale):.3f}\n"
    )
    return path


def run(home: Path | None, speedup: float, count: int, as_json: bool) -> int:
    """Run the tour; return the exit status (0: every job succeeded, no deadline missed)."""
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    keep = home is not None
    home = (home or Path(tempfile.mkdtemp(prefix="ebbtide-demo-"))).expanduser().absolute()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)  # --home may name a new directory
    settings = Settings.from_env({"EBBTIDE_HOME": str(home)})
    devices = [DeviceInfo(index=i, memory_mib=DEVICE_MEMORY_MIB) for i in range(DEVICE_COUNT)]
    source = open_source(f"trace:{TRACE_NAME}", devices, speedup=speedup, loop=True)
    rt = build(
        settings,
        scheduler=True,
        agent_name=NODE,
        source=source,
        policy_path=_demo_policy(home, speedup),
    )
    handler = _ConsoleLog(console)
    log.addHandler(handler)
    try:
        _intro(console, source, speedup, count)
        return _tour(rt, console, source, home, speedup, count, as_json, keep)
    finally:
        log.removeHandler(handler)
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


def _tour(
    rt: Runtime,
    console: Console,
    source: HeadroomSource,
    home: Path,
    speedup: float,
    count: int,
    as_json: bool,
    keep: bool,
) -> int:
    client = Client(rt.settings, store=rt.store, policy=rt.policy)
    t0 = time.time()
    rt.start()
    jobs: dict[int, DemoJob] = {}
    feed = Feed(client, console, t0, jobs)
    warmup_s = WARMUP_TRACE_S / speedup
    feed.line(t0, "watching", f"the online load for {warmup_s:.1f} s before submitting jobs")
    fancy = console.is_terminal and not as_json
    live = Live(console=console, transient=True, refresh_per_second=4) if fancy else None
    give_up = t0 + GIVE_UP_TRACE_S / speedup + GIVE_UP_S
    next_load = t0
    interrupted = False
    try:
        if live is not None:
            live.start()
        while not jobs or (len(feed.final) < len(jobs) and time.time() < give_up):
            if not jobs and time.time() >= t0 + warmup_s:
                for j in pick_jobs(count):
                    jobs[client.submit(job_spec(j, speedup, home))] = j
            feed.poll()
            now = time.time()
            if live is not None or now >= next_load:
                samples = source.sample(now)
                active = rt.store.active_attempts(node=NODE)
                if live is not None:
                    live.update(load_table(samples, active, now - t0))
                else:
                    feed.line(now, "online", load_line(samples, active))
                    next_load += LOAD_PERIOD_S
            time.sleep(POLL_PERIOD_S)
        feed.poll()
    except KeyboardInterrupt:
        interrupted = True
        console.print("interrupted: stopping; running jobs are evicted within their deadline")
    finally:
        if live is not None:
            live.stop()
    t_end = time.time()
    if len(feed.final) < len(jobs) and not interrupted:
        console.print(f"[red]gave up: jobs not done after {t_end - t0:.0f} s[/]")
    summary = summarize(client, rt.store, jobs, source, t0, t_end)
    summary.update(speedup=speedup, home=str(home) if keep else None)
    rt.stop()
    if as_json:
        print(json.dumps(summary))
    else:
        print_summary(console, summary)
        if keep:
            console.print(f"State kept in {home}: EBBTIDE_HOME={home} ebb qstat / ebb events ID")
    if interrupted:
        return 130
    ok = summary["jobs_succeeded"] == len(jobs) and summary["deadline_misses"] == 0
    return 0 if ok else 1
