#!/usr/bin/env python3
"""Build ``ebbtide.json``, the Grafana dashboard of an ebbtide fleet, from the panels below.

The JSON is generated so that a change to a query is one reviewable line here; the file
Grafana imports is committed beside this script, and ``tests/unit/test_deploy_observability.py``
checks that it is this script's output.  Standard library only.

    python deploy/grafana/build_dashboard.py            # rewrite ebbtide.json
    python deploy/grafana/build_dashboard.py --check    # exit 1 if ebbtide.json is stale

Every query reads the metrics of ``ebbtide.metrics`` (the scheduler's and the node
agents'); none filters on the scrape job's name, which is the operator's choice.  The
scheduler's gauges (pending, running, paused, heartbeat ages) come from the leading
scheduler only, so sums over them count each job once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).with_name("ebbtide.json")

UID = "ebbtide-fleet"
TITLE = "ebbtide: offline GPU work in online headroom"
#: Grafana 11's dashboard schema
SCHEMA_VERSION = 39
#: the eviction deadline of a job that names none (``defaults.deadline_s``), in seconds
DEFAULT_DEADLINE_S = 30
#: an agent whose heartbeat is older than this is alerted on (EbbtideAgentSilent), in seconds
HEARTBEAT_ALERT_S = 30

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'node=~"$node"'
QUEUE = 'queue=~"$queue"'
NODE_QUEUE = f"{NODE}, {QUEUE}"
RATE = "$__rate_interval"

Panel = dict[str, Any]

# -- building blocks ------------------------------------------------------------------------


def target(expr: str, legend: str = "", *, instant: bool = False) -> dict[str, Any]:
    """One query; its refId is set when the panel is made."""
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "instant": instant,
        "legendFormat": legend or "__auto",
        "range": not instant,
    }


def _thresholds(steps: list[tuple[str, float | None]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def _panel(kind: str, title: str, description: str, targets: list[dict[str, Any]]) -> Panel:
    refs = "ABCDEFGHIJ"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [{**t, "refId": refs[i]} for i, t in enumerate(targets)],
    }


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    stack: bool = False,
    bars: bool = False,
    axis_label: str = "",
    minimum: float | None = 0,
    maximum: float | None = None,
    line_at: float | None = None,
    color: str | None = None,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """A graph over time; ``line_at`` draws a red threshold line there."""
    panel = _panel("timeseries", title, description, targets)
    defaults: dict[str, Any] = {
        "color": {"mode": "fixed", "fixedColor": color} if color else {"mode": "palette-classic"},
        "custom": {
            "axisLabel": axis_label,
            "axisPlacement": "auto",
            "drawStyle": "bars" if bars else "line",
            "fillOpacity": 80 if bars else (60 if stack else 10),
            "gradientMode": "none",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack or bars else "none"},
            "thresholdsStyle": {"mode": "line" if line_at is not None else "off"},
        },
        "thresholds": _thresholds(
            [("green", None)] + ([("red", line_at)] if line_at is not None else [])
        ),
        "unit": unit,
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    panel["gridPos"] = {"h": height, "w": width}
    return panel


def stat(
    title: str,
    description: str,
    expr: str,
    *,
    unit: str = "short",
    steps: list[tuple[str, float | None]] | None = None,
    mappings: list[dict[str, Any]] | None = None,
    no_value: str | None = None,
    decimals: int | None = None,
    width: int = 4,
    height: int = 4,
) -> Panel:
    """One number, coloured by ``steps`` (colour, from this value up)."""
    panel = _panel("stat", title, description, [target(expr, instant=True)])
    defaults: dict[str, Any] = {
        "color": {"mode": "thresholds"},
        "mappings": mappings or [],
        "thresholds": _thresholds(steps or [("text", None)]),
        "unit": unit,
    }
    if no_value is not None:
        defaults["noValue"] = no_value
    if decimals is not None:
        defaults["decimals"] = decimals
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "colorMode": "background" if steps else "value",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showPercentChange": False,
        "textMode": "auto",
        "wideLayout": True,
    }
    panel["gridPos"] = {"h": height, "w": width}
    return panel


def quantiles(
    metric: str, selector: str = "", by: str = "", qs: tuple[float, ...] = (0.5, 0.99)
) -> list[dict[str, Any]]:
    """histogram_quantile queries of ``metric``'s buckets, one per quantile."""
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    buckets = f"{metric}_bucket{{{selector}}}" if selector else f"{metric}_bucket"
    return [
        target(
            f"histogram_quantile({q}, sum by ({group}) (rate({buckets}[{RATE}])))",
            f"p{round(q * 100)}{suffix}",
        )
        for q in qs
    ]


# -- the panels -----------------------------------------------------------------------------

ONLINE = f"ebbtide_online_compute_ratio{{{NODE}}}"
OFFLINE = f"ebbtide_offline_compute_ratio{{{NODE}}}"
#: offline compute over the compute online work leaves (no value when it leaves none)
HARVEST = f"sum({OFFLINE}) / (sum(1 - {ONLINE}) > 0)"
#: the series of ebbtide's own processes, for their process_* metrics (no job filter)
EBBTIDE_TARGETS = (
    "on (instance, job) "
    "(ebbtide_agent_samples_total or ebbtide_scheduler_leader or ebbtide_api_requests_total)"
)


def overview() -> list[Panel]:
    return [
        stat(
            "Harvest",
            "Share of the GPU compute online inference leaves spare that offline jobs use now: "
            "offline compute / (1 - online compute), summed over the selected nodes' devices. "
            "Low with jobs queued means headroom is going unused (see Queues).",
            HARVEST,
            unit="percentunit",
            decimals=1,
        ),
        stat(
            "Deadline misses",
            "Evictions in the selected time range whose slice was freed after its deadline: "
            "online work waited for GPU capacity it was promised. Should be 0; any miss "
            "fires EbbtideDeadlineMiss.",
            f"ceil(sum(increase(ebbtide_deadline_misses_total{{{NODE_QUEUE}}}[$__range])))"
            " or vector(0)",
            steps=[("green", None), ("red", 1)],
        ),
        stat(
            "Devices out of service",
            "GPUs a fault (an XID, a GPU off the bus) keeps out of service now: nothing is "
            "admitted there. `ebb nodes` names the fault.",
            f"count(ebbtide_device_healthy{{{NODE}}} == 0) or vector(0)",
            steps=[("green", None), ("red", 1)],
        ),
        stat(
            "Scheduler",
            "Whether a scheduler leads now (1) or all stand by (0). With no leader nothing "
            "is admitted or requeued; running jobs keep running and are still evicted.",
            "max(ebbtide_scheduler_leader)",
            mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"color": "red", "index": 0, "text": "NO LEADER"},
                        "1": {"color": "green", "index": 1, "text": "leading"},
                    },
                }
            ],
            steps=[("red", None), ("green", 1)],
            no_value="not scraped",
        ),
        stat(
            "Evictions",
            "Offline attempts evicted in the selected time range, every reason.",
            f"round(sum(increase(ebbtide_evicted_jobs_total{{{NODE_QUEUE}}}[$__range])))"
            " or vector(0)",
        ),
        stat(
            "Jobs queued",
            "Jobs waiting for a slice now in the selected queues (held jobs not counted).",
            f'sum(ebbtide_pending_jobs{{{QUEUE}, status="queued"}})',
        ),
    ]


def harvest() -> list[Panel]:
    gpus = "GPUs' worth of compute"
    return [
        timeseries(
            "Fleet compute: online vs offline",
            "GPU compute summed over the selected nodes' devices, in GPUs (1 = one whole "
            "GPU): what online inference uses, what ebbtide's offline slices use or hold, "
            "and what stays idle. The stack's height is the number of GPUs.",
            [
                target(f"sum({ONLINE})", "online"),
                target(f"sum({OFFLINE})", "offline (ebbtide)"),
                target(f"sum(clamp_min(1 - {ONLINE} - {OFFLINE}, 0))", "idle"),
            ],
            stack=True,
            axis_label=gpus,
        ),
        timeseries(
            "Harvest over time",
            "Share of the compute online work leaves spare that offline jobs use: "
            "offline / (1 - online), fleet-wide and per node.",
            [
                target(HARVEST, "fleet"),
                target(
                    f"sum by (node) ({OFFLINE}) / (sum by (node) (1 - {ONLINE}) > 0)",
                    "{{node}}",
                ),
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries(
            "Compute headroom by node",
            "Compute neither online nor offline work uses, summed over each node's devices, "
            "in GPUs. Headroom with jobs queued means they do not fit (memory, slice size) "
            "or are held back by the forecast and margins.",
            [target(f"sum by (node) (ebbtide_headroom_compute_ratio{{{NODE}}})", "{{node}}")],
            axis_label=gpus,
            width=8,
        ),
        timeseries(
            "Memory headroom by node",
            "GPU memory neither online nor offline work uses, summed over each node's devices.",
            [target(f"sum by (node) (ebbtide_headroom_memory_bytes{{{NODE}}})", "{{node}}")],
            unit="bytes",
            width=8,
        ),
        timeseries(
            "Fleet GPU memory: online vs offline",
            "GPU memory summed over the selected nodes' devices: online use, offline slices, "
            "and the rest. The stack's height is the fleet's GPU memory.",
            [
                target(f"sum(ebbtide_online_memory_bytes{{{NODE}}})", "online"),
                target(f"sum(ebbtide_offline_memory_bytes{{{NODE}}})", "offline (ebbtide)"),
                target(
                    f"sum(ebbtide_device_memory_bytes{{{NODE}}})"
                    f" - sum(ebbtide_online_memory_bytes{{{NODE}}})"
                    f" - sum(ebbtide_offline_memory_bytes{{{NODE}}})",
                    "free",
                ),
            ],
            unit="bytes",
            stack=True,
            width=8,
        ),
    ]


def evictions() -> list[Panel]:
    return [
        timeseries(
            "Evictions per minute by reason",
            "Offline attempts giving their slice back, per minute, by reason code: "
            "online_compute / online_memory (online load rose), gpu_fault, window_closed "
            "(a policy window ended), max_pause, preempted_by_priority, ... A steady stream "
            "of online_* evictions means the forecast or margins are too thin for this load.",
            [
                target(
                    f"sum by (reason) (rate(ebbtide_evicted_jobs_total{{{NODE_QUEUE}}}[{RATE}]))"
                    " * 60",
                    "{{reason}}",
                )
            ],
            bars=True,
            unit="short",
            axis_label="evictions / min",
        ),
        timeseries(
            "Eviction latency",
            "Time from the online spike (or the eviction decision) until the slice is free, "
            f"p50 and p99. The red line is the default deadline ({DEFAULT_DEADLINE_S} s); a "
            "p99 near a queue's deadline means misses are close (EbbtideEvictionLatencyHigh).",
            quantiles("ebbtide_eviction_latency_seconds", NODE_QUEUE),
            unit="s",
            line_at=DEFAULT_DEADLINE_S,
        ),
        timeseries(
            "Deadline misses",
            "Slices freed after their deadline, per node and queue. Should be empty: every "
            "bar is a time online work waited on ebbtide (EbbtideDeadlineMiss).",
            [
                target(
                    f"sum by (node, queue) "
                    f"(increase(ebbtide_deadline_misses_total{{{NODE_QUEUE}}}[{RATE}])) > 0",
                    "{{node}} {{queue}}",
                )
            ],
            bars=True,
            color="red",
            width=8,
        ),
        timeseries(
            "Work lost to evictions",
            "Seconds of job progress since the last checkpoint that evictions threw away, "
            "per hour of wall time, by queue. High values: checkpoint more often, or give "
            "the queue a longer deadline so jobs can checkpoint when warned.",
            [
                target(
                    f"sum by (queue) "
                    f"(rate(ebbtide_lost_work_seconds_total{{{NODE_QUEUE}}}[{RATE}])) * 3600",
                    "{{queue}}",
                )
            ],
            unit="s",
            axis_label="lost per hour",
            width=8,
        ),
        timeseries(
            "Pauses per minute by kind",
            "Offline attempts frozen in place when online compute spiked (kind=pause, GPU "
            "memory kept) or suspended to host memory (kind=suspend) instead of evicted.",
            [
                target(
                    f"sum by (kind) (rate(ebbtide_pauses_total{{{NODE_QUEUE}}}[{RATE}])) * 60",
                    "{{kind}}",
                )
            ],
            bars=True,
            axis_label="pauses / min",
            width=8,
        ),
    ]


def queues() -> list[Panel]:
    return [
        timeseries(
            "Jobs by queue and state",
            "Jobs queued (waiting for a slice), held (by a user, the policy or a dependency), "
            "running (holding a slice, paused ones included) and paused, per queue; and "
            "whether the policy's windows let the queue run now (1) or keep it out (0).",
            [
                target(
                    f"sum by (queue, status) (ebbtide_pending_jobs{{{QUEUE}}})",
                    "{{queue}} {{status}}",
                ),
                target(f"sum by (queue) (ebbtide_running_jobs{{{QUEUE}}})", "{{queue}} running"),
                target(f"sum by (queue) (ebbtide_paused_jobs{{{QUEUE}}})", "{{queue}} paused"),
                target(
                    f"max by (queue) (ebbtide_queue_window_open{{{QUEUE}}})",
                    "{{queue}} window open",
                ),
            ],
        ),
        timeseries(
            "Queue wait",
            "Time from queued (submitted or requeued after an eviction) to dispatched, p50 "
            "and p99 per queue.",
            quantiles("ebbtide_admission_wait_time_seconds", QUEUE, by="queue"),
            unit="s",
        ),
        timeseries(
            "Admissions per minute by queue",
            "Attempts given a slice, per minute. Jobs queued with no admissions for an hour "
            "fire EbbtideQueueStuck.",
            [
                target(
                    f"sum by (queue) (rate(ebbtide_admitted_jobs_total{{{QUEUE}}}[{RATE}])) * 60",
                    "{{queue}}",
                )
            ],
            axis_label="admissions / min",
        ),
        timeseries(
            "Attempts ended per minute by outcome",
            "How attempts ended: succeeded, failed, evicted (requeued to resume), killed "
            "(cancelled or over their limits), lost (their node went silent).",
            [
                target(
                    f"sum by (outcome) "
                    f"(rate(ebbtide_attempts_ended_total{{{NODE_QUEUE}}}[{RATE}])) * 60",
                    "{{outcome}}",
                )
            ],
            bars=True,
            axis_label="attempts / min",
        ),
    ]


def agents() -> list[Panel]:
    return [
        timeseries(
            "Devices out of service",
            "GPUs a fault keeps out of service, by node/device (one bar each). A device "
            "returns after its health checks pass for device_recovery_s (10 min by default) "
            "or by `ebb node undrain`.",
            [
                target(
                    f"count by (node, device) (ebbtide_device_healthy{{{NODE}}} == 0)",
                    "{{node}}/{{device}}",
                )
            ],
            bars=True,
            color="red",
            width=6,
        ),
        timeseries(
            "Heartbeat age",
            "Seconds since each agent's heartbeat last reached the store, as the agent sees "
            "it and as the leading scheduler sees it. Past the policy's heartbeat_timeout_s "
            "(10 s by default) the agent kills its attempts and the scheduler requeues them; "
            f"the red line is where EbbtideAgentSilent fires ({HEARTBEAT_ALERT_S} s).",
            [
                target(
                    f"max by (node) (ebbtide_agent_heartbeat_age_seconds{{{NODE}}})",
                    "{{node}} (agent)",
                ),
                target(
                    f"max by (node) (ebbtide_node_heartbeat_age_seconds{{{NODE}}})",
                    "{{node}} (scheduler)",
                ),
            ],
            unit="s",
            line_at=HEARTBEAT_ALERT_S,
            width=6,
        ),
        timeseries(
            "Agent samples per second",
            "Online-load samples each agent takes per second (NVML is sampled 20 times a "
            "second). A drop means the agent is stalled and reacts late to online spikes.",
            [
                target(
                    f"sum by (node) (rate(ebbtide_agent_samples_total{{{NODE}}}[{RATE}]))",
                    "{{node}}",
                )
            ],
            unit="short",
            width=6,
        ),
        timeseries(
            "Attempts running per agent",
            "Offline attempts each agent runs now, paused ones included.",
            [target(f"max by (node) (ebbtide_agent_running_attempts{{{NODE}}})", "{{node}}")],
            width=6,
        ),
    ]


def scheduler() -> list[Panel]:
    return [
        timeseries(
            "Scheduler pass duration",
            "Time one scheduler pass takes (snapshot, plan, apply), p50 and p99. Slow passes "
            "delay admissions, not evictions (the agents evict on their own).",
            quantiles("ebbtide_scheduler_pass_duration_seconds"),
            unit="s",
            width=6,
        ),
        timeseries(
            "Scheduler leader",
            "Schedulers leading (should be exactly 1) and standing by. 0 leaders fires "
            "EbbtideNoLeader, 2 EbbtideTwoLeaders.",
            [
                target("sum(ebbtide_scheduler_leader)", "leading"),
                target("count(ebbtide_scheduler_leader == 0)", "standing by"),
            ],
            width=6,
        ),
        timeseries(
            "ebbtide processes: memory",
            "Resident memory of ebbtide's processes: scheduler, agents, API server "
            "(prometheus_client's process metrics of the targets that export ebbtide's).",
            [
                target(
                    f"process_resident_memory_bytes and {EBBTIDE_TARGETS}",
                    "{{instance}}",
                )
            ],
            unit="bytes",
            width=6,
        ),
        timeseries(
            "ebbtide processes: CPU",
            "CPU time ebbtide's processes use, in cores. An agent near one core falls "
            "behind its 20 samples a second.",
            [
                target(
                    f"rate(process_cpu_seconds_total[{RATE}]) and {EBBTIDE_TARGETS}",
                    "{{instance}}",
                )
            ],
            axis_label="cores",
            width=6,
        ),
    ]


def api() -> list[Panel]:
    requests = f"ebbtide_api_requests_total[{RATE}]"
    return [
        timeseries(
            "API requests per second by status",
            "Requests `ebb server` answers (users' qsub, qstat, qdel... and the SDK), by "
            "HTTP status code.",
            [target(f"sum by (code) (rate({requests}))", "{{code}}")],
            unit="reqps",
            stack=True,
            width=8,
        ),
        timeseries(
            "API server errors",
            "Share of API requests answered with a 5xx status: the server could not do what "
            "a user asked (the store unreachable, a bug). 4xx answers are users' mistakes "
            "and not counted.",
            [
                target(
                    f'sum(rate(ebbtide_api_requests_total{{code=~"5.."}}[{RATE}]))'
                    f" / (sum(rate({requests})) > 0)",
                    "5xx share",
                )
            ],
            unit="percentunit",
            color="red",
            width=8,
        ),
        timeseries(
            "API request latency by route",
            "Time to serve one request, p99 per route template (a log follow counts until "
            "it ends, so follow routes run long by design).",
            quantiles("ebbtide_api_request_duration_seconds", by="route", qs=(0.99,)),
            unit="s",
            width=8,
        ),
    ]


def sections() -> list[tuple[str, list[Panel]]]:
    return [
        ("Overview", overview()),
        ("Harvest: offline work in the online fleet's spare GPU", harvest()),
        ("Evictions: giving the GPU back", evictions()),
        ("Queues", queues()),
        ("Agents and devices", agents()),
        ("Scheduler", scheduler()),
        ("API server", api()),
    ]


# -- the dashboard --------------------------------------------------------------------------


def _variable_query(name: str, label: str, metric: str) -> dict[str, Any]:
    query = f"label_values({metric}, {name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "hide": 0,
    }


def templating() -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "regex": "",
            "hide": 0,
        },
        _variable_query("node", "Node", "ebbtide_agent_samples_total"),
        _variable_query("queue", "Queue", "ebbtide_pending_jobs"),
    ]


def layout(parts: list[tuple[str, list[Panel]]]) -> list[Panel]:
    """Rows and panels with ids and positions: panels fill 24 columns left to right."""
    panels: list[Panel] = []
    y = 0
    for title, row in parts:
        panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        y += 1
        x, line_height = 0, 0
        for panel in row:
            w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            panel["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panels.append(panel)
            x += w
            line_height = max(line_height, h)
        y += line_height
    for number, panel in enumerate(panels, start=1):
        panel["id"] = number
    return [{"id": p.pop("id"), **p} for p in panels]


def build() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": TITLE,
        "description": (
            "An ebbtide fleet: how much spare GPU the offline jobs harvest, how fast they "
            "give it back, and the health of the queues, agents and scheduler."
        ),
        "tags": ["ebbtide", "gpu", "batch"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": templating()},
        "panels": layout(sections()),
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
