"""Prometheus metrics: what the scheduler and the node agents expose to dashboards and alerts.

(Longer than our modules should be: it is the one registry of what the product exposes,
every metric's name, labels and help side by side so a dashboard's author finds them in one
file, and the collector that reads the fleet for them.)

Names and label words follow Kueue's (``pending_*{status}``, ``admission_wait_time_seconds``,
``evicted_*_total{reason}``) so that a platform team's dashboards and alerts read alike.
Ratios are 0..1 and sizes are bytes, as Prometheus's conventions ask.  Labels stay bounded:
queues, nodes, device indexes, reason codes and outcomes, never job ids or users.

One :class:`Metrics` per process (:func:`default`, on prometheus_client's default
registry, with its process and Python collectors); tests make their own on a fresh
registry.  Counters and histograms are updated where things happen (the agent's end of an
attempt, the scheduler's dispatch); what is a state rather than an event (pending jobs per
queue, heartbeat ages) is read from the store at scrape time by
:class:`SchedulerCollector`, and only by the leading scheduler, so that a standby does not
double the fleet's figures.  ``deploy/grafana`` and ``deploy/prometheus`` build on these
names: :data:`CATALOGUE` lists them for the tests that keep the three in step.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ebbtide.clock import Clock
from ebbtide.errors import ConfigError
from ebbtide.preemption.victims import EvictReason
from ebbtide.probes import Probes

if TYPE_CHECKING:
    from ebbtide.queue.models import NodeRow
    from ebbtide.scheduling.snapshot import ActiveAttempt

log = logging.getLogger("ebbtide.metrics")

MIB = 1024 * 1024
#: where ``--metrics-port`` listens unless ``--metrics-address`` says otherwise (every
#: interface, as exporters do: the metrics name queues and nodes, never jobs or users)
DEFAULT_METRICS_ADDRESS = "0.0.0.0"

#: eviction latency (online spike → slice free), in seconds: deadlines are 5 s to minutes
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
#: time from queued to dispatched, in seconds: seconds to a night
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
#: one API request, in seconds
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: one scheduler pass, in seconds
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: a metric, as :meth:`Metrics._scheduler_metric` makes it
M = TypeVar("M")

#: Every metric ebbtide defines (without the ``_total``/``_bucket`` suffixes the
#: exposition adds), with its labels.
CATALOGUE: dict[str, tuple[str, ...]] = {
    # the leading scheduler
    "ebbtide_pending_jobs": ("queue", "status"),
    "ebbtide_running_jobs": ("queue",),
    "ebbtide_paused_jobs": ("queue",),
    "ebbtide_queue_window_open": ("queue",),
    "ebbtide_admitted_jobs": ("queue",),
    "ebbtide_admission_wait_time_seconds": ("queue",),
    "ebbtide_scheduler_pass_duration_seconds": (),
    "ebbtide_scheduler_leader": (),
    "ebbtide_node_heartbeat_age_seconds": ("node",),
    # every node agent
    "ebbtide_evicted_jobs": ("node", "queue", "reason"),
    "ebbtide_eviction_latency_seconds": ("node", "queue"),
    "ebbtide_deadline_misses": ("node", "queue"),
    "ebbtide_lost_work_seconds": ("node", "queue"),
    "ebbtide_pauses": ("node", "queue", "kind"),
    "ebbtide_attempts_ended": ("node", "queue", "outcome"),
    "ebbtide_online_compute_ratio": ("node", "device"),
    "ebbtide_offline_compute_ratio": ("node", "device"),
    "ebbtide_headroom_compute_ratio": ("node", "device"),
    "ebbtide_online_memory_bytes": ("node", "device"),
    "ebbtide_offline_memory_bytes": ("node", "device"),
    "ebbtide_headroom_memory_bytes": ("node", "device"),
    "ebbtide_device_memory_bytes": ("node", "device"),
    "ebbtide_device_healthy": ("node", "device"),
    "ebbtide_agent_samples": ("node",),
    "ebbtide_agent_heartbeat_age_seconds": ("node",),
    "ebbtide_agent_running_attempts": ("node",),
    # the API server
    "ebbtide_api_requests": ("method", "route", "code"),
    "ebbtide_api_request_duration_seconds": ("route",),
}

#: ``ebbtide_pending_jobs``'s status for each waiting state
PENDING_STATUS = {"queued": "queued", "held": "held", "waiting": "held"}
#: the states that hold a slice (``ebbtide_running_jobs``)
SLICE_STATES = ("dispatched", "running", "evicting")


class Metrics:
    """The metrics of one process, on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # no ``*_created`` series beside every counter and histogram: they double what a
        # scrape carries and no dashboard here reads them
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        #: whether this process's loops go round (``/healthz``, ``/readyz``)
        self.probes = Probes()
        r = self.registry
        # scheduler: events
        self.admitted = Counter(
            "ebbtide_admitted_jobs",
            "Jobs given a slice (each attempt's dispatch counts).",
            ["queue"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "ebbtide_admission_wait_time_seconds",
            "Time from submission or the last requeue to dispatch (time held or waiting "
            "on dependencies included).",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        # the pass duration and the leader gauge: made by the first scheduler that uses
        # them (:attr:`pass_duration`, :attr:`leader`)
        self._schedulers: dict[str, Any] = {}
        self._schedulers_lock = threading.Lock()
        # node agent: events
        self.evicted = Counter(
            "ebbtide_evicted_jobs",
            "Attempts that gave their slice back, by reason code.",
            ["node", "queue", "reason"],
            registry=r,
        )
        self.eviction_latency = Histogram(
            "ebbtide_eviction_latency_seconds",
            "Time from the online spike (or the decision) to the slice being free.",
            ["node", "queue"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.deadline_misses = Counter(
            "ebbtide_deadline_misses",
            "Evictions whose slice was freed after its deadline.",
            ["node", "queue"],
            registry=r,
        )
        self.lost_work = Counter(
            "ebbtide_lost_work_seconds",
            "Work since the last checkpoint thrown away by evictions, in seconds.",
            ["node", "queue"],
            registry=r,
        )
        self.pauses = Counter(
            "ebbtide_pauses",
            "Attempts paused in place (kind=pause) or suspended to host (kind=suspend).",
            ["node", "queue", "kind"],
            registry=r,
        )
        self.ended = Counter(
            "ebbtide_attempts_ended",
            "Attempts that ended, by outcome (succeeded, failed, evicted, cancelled, requeued, "
            "killed, lost).",
            ["node", "queue", "outcome"],
            registry=r,
        )
        self.samples = Counter(
            "ebbtide_agent_samples",
            "Samples of the online load the agent took.",
            ["node"],
            registry=r,
        )
        self.heartbeat_age = Gauge(
            "ebbtide_agent_heartbeat_age_seconds",
            "Seconds since the store last took this agent's heartbeat.",
            ["node"],
            registry=r,
        )
        self.running_attempts = Gauge(
            "ebbtide_agent_running_attempts",
            "Attempts this agent runs now (paused ones included).",
            ["node"],
            registry=r,
        )
        device = ["node", "device"]
        self.online_compute = Gauge(
            "ebbtide_online_compute_ratio", "Online compute use (0..1).", device, registry=r
        )
        self.offline_compute = Gauge(
            "ebbtide_offline_compute_ratio",
            "Compute the offline slices use, as measured, else as granted (0..1): a paused "
            "slice uses none, though its compute is kept for it until it thaws.",
            device,
            registry=r,
        )
        self.headroom_compute = Gauge(
            "ebbtide_headroom_compute_ratio",
            "Compute neither online nor offline work uses (0..1).",
            device,
            registry=r,
        )
        self.online_memory = Gauge(
            "ebbtide_online_memory_bytes", "Online GPU memory use.", device, registry=r
        )
        self.offline_memory = Gauge(
            "ebbtide_offline_memory_bytes",
            "GPU memory the offline slices use or hold.",
            device,
            registry=r,
        )
        self.headroom_memory = Gauge(
            "ebbtide_headroom_memory_bytes",
            "GPU memory neither online nor offline work uses.",
            device,
            registry=r,
        )
        self.device_memory = Gauge(
            "ebbtide_device_memory_bytes", "The device's GPU memory.", device, registry=r
        )
        self.device_healthy = Gauge(
            "ebbtide_device_healthy",
            "1 while the device takes work, 0 while a fault keeps it out of service.",
            device,
            registry=r,
        )
        #: per (node, device): the eight gauges above, labelled (looked up once, not per
        #: update: an agent updates them twice a second)
        self._device_gauges: dict[tuple[str, str], tuple[Any, ...]] = {}

        # API server
        self.api_requests = Counter(
            "ebbtide_api_requests",
            "API requests served, by route template and status code.",
            ["method", "route", "code"],
            registry=r,
        )
        self.api_duration = Histogram(
            "ebbtide_api_request_duration_seconds",
            "Time to serve one API request.",
            ["route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )

    @property
    def leader(self) -> Gauge:
        """``ebbtide_scheduler_leader``, registered when a scheduler first sets it: a
        process that runs none (``ebb worker``, ``ebb server``) exports no such series,
        where a constant 0 would count it among the schedulers standing by."""
        return self._scheduler_metric(
            "leader",
            lambda: Gauge(
                "ebbtide_scheduler_leader",
                "1 while this scheduler is the active one, 0 while it stands by.",
                registry=self.registry,
            ),
        )

    @property
    def pass_duration(self) -> Histogram:
        """``ebbtide_scheduler_pass_duration_seconds``, registered at a scheduler's first
        pass (as :attr:`leader`: no empty histogram from a process that runs none)."""
        return self._scheduler_metric(
            "pass_duration",
            lambda: Histogram(
                "ebbtide_scheduler_pass_duration_seconds",
                "Time one scheduler pass took (snapshot, plan, apply).",
                buckets=PASS_BUCKETS,
                registry=self.registry,
            ),
        )

    def _scheduler_metric(self, name: str, make: Callable[[], M]) -> M:
        """A scheduler's own metric ``name``, made by ``make`` at its first use."""
        with self._schedulers_lock:
            if name not in self._schedulers:
                self._schedulers[name] = make()
            metric: M = self._schedulers[name]
            return metric

    # -- node agent ---------------------------------------------------------------------

    def watch_agent(
        self, node: str, *, heartbeat_age: Callable[[], float], running: Callable[[], int]
    ) -> None:
        """Read the agent's heartbeat age and attempt count at scrape time."""
        self.heartbeat_age.labels(node).set_function(heartbeat_age)
        self.running_attempts.labels(node).set_function(running)
        self.samples.labels(node)

    def known_queues(self, node: str, queues: Iterable[str]) -> None:
        """Show the agent's counters for ``queues`` at 0 before their first event, so that
        an alert on their increase sees that first event too."""
        for queue in queues:
            self.deadline_misses.labels(node, queue)
            self.lost_work.labels(node, queue)

    def device_sample(
        self,
        node: str,
        device: int,
        *,
        memory_mib: float,
        online_compute_pct: float,
        online_memory_mib: float,
        offline_compute_pct: float,
        offline_memory_mib: float,
        healthy: bool,
    ) -> None:
        """One device's figures as the agent saw them last."""
        labels = (node, str(device))
        gauges = self._device_gauges.get(labels)
        if gauges is None:
            gauges = self._device_gauges[labels] = tuple(
                g.labels(*labels)
                for g in (
                    self.online_compute,
                    self.offline_compute,
                    self.headroom_compute,
                    self.online_memory,
                    self.offline_memory,
                    self.headroom_memory,
                    self.device_memory,
                    self.device_healthy,
                )
            )
        online_c, offline_c, headroom_c, online_m, offline_m, headroom_m, size, healthy_g = gauges
        online_c.set(online_compute_pct / 100)
        offline_c.set(offline_compute_pct / 100)
        spare = max(0.0, 100.0 - online_compute_pct - offline_compute_pct)
        headroom_c.set(spare / 100)
        online_m.set(online_memory_mib * MIB)
        offline_m.set(offline_memory_mib * MIB)
        free = max(0.0, memory_mib - online_memory_mib - offline_memory_mib)
        headroom_m.set(free * MIB)
        size.set(memory_mib * MIB)
        healthy_g.set(1 if healthy else 0)

    def attempt_ended(
        self, node: str, queue: str, outcome: str, eviction: dict[str, Any] | None = None
    ) -> None:
        """An attempt ended; ``eviction`` is the ``evicted`` event's data when it was one.
        A user's cancellation is no eviction here, as in ``ebb report`` and ``ebb top``
        (a trial's trap: one ``qdel`` of a job that ignored its warning counted an
        eviction of 30 s and fired the eviction latency alert)."""
        if eviction is not None and eviction.get("reason_code") == EvictReason.CANCELLED.value:
            outcome, eviction = "cancelled", None
        self.ended.labels(node, queue, outcome).inc()
        if eviction is None:
            return
        self.evicted.labels(node, queue, eviction.get("reason_code") or "unknown").inc()
        self.eviction_latency.labels(node, queue).observe(max(0.0, eviction["latency_s"]))
        self.lost_work.labels(node, queue).inc(max(0.0, eviction.get("lost_work_s") or 0.0))
        if eviction.get("deadline_missed"):
            self.deadline_misses.labels(node, queue).inc()

    # -- scheduler ----------------------------------------------------------------------

    def dispatched(self, queue: str, waited_s: float | None) -> None:
        self.admitted.labels(queue).inc()
        if waited_s is not None:
            self.admission_wait.labels(queue).observe(max(0.0, waited_s))

    def watch_scheduler(self, scheduler: Scheduler) -> None:
        """Read the queues and nodes from the store at scrape time while ``scheduler``
        leads (once per scheduler)."""
        self.registry.register(SchedulerCollector(scheduler))


class FleetStore(Protocol):
    """What :class:`SchedulerCollector` reads from the store at scrape time."""

    def queue_stats(self, states: Iterable[str] | None = None) -> dict[str, dict[str, int]]: ...

    def active_attempts(self, node: str | None = None) -> Sequence[ActiveAttempt]: ...

    def nodes(self) -> Sequence[NodeRow]: ...


class QueueNames(Protocol):
    """The policy, as far as the metrics need it: the queues it defines."""

    @property
    def queues(self) -> Mapping[str, object]: ...


class Scheduler(Protocol):
    """A scheduler as :class:`SchedulerCollector` sees it (the live one,
    :class:`ebbtide.scheduling.loop.Scheduler`, is one)."""

    @property
    def leading(self) -> bool: ...

    @property
    def store(self) -> FleetStore: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def policy(self) -> QueueNames: ...


class SchedulerCollector(Collector):
    """Pending, running and paused jobs per queue and the nodes' heartbeat ages, read
    from the store at scrape time; nothing while the scheduler stands by (the active one
    reports the fleet) or cannot reach the store (the scrape still succeeds)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time only: no store queries at registration

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        if not s.leading:
            return
        try:
            stats = s.store.queue_stats([*PENDING_STATUS, *SLICE_STATES])
            active = s.store.active_attempts()
            nodes = s.store.nodes()
        except Exception as exc:
            log.warning("metrics: cannot read the store (%s)", str(exc).splitlines()[0])
            return
        now = s.clock.time()
        pending = GaugeMetricFamily(
            "ebbtide_pending_jobs",
            "Jobs waiting: status=queued (for a slice) or held (by a user, the policy or "
            "a dependency).",
            labels=["queue", "status"],
        )
        running = GaugeMetricFamily(
            "ebbtide_running_jobs",
            "Jobs holding a slice (dispatched, running, being evicted; paused included).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "ebbtide_paused_jobs", "Jobs paused or suspended in place.", labels=["queue"]
        )
        window = GaugeMetricFamily(
            "ebbtide_queue_window_open",
            "1 while the policy's windows let the queue run now (on some device, or no window "
            "restricts it), 0 while they keep it out: its queued jobs wait for a window.",
            labels=["queue"],
        )
        admitted_now = _window_admits(s, now, nodes)
        queues = set(stats) | set(s.policy.queues)
        for queue in sorted(queues):
            by_state = stats.get(queue, {})
            for status in ("queued", "held"):
                count = sum(n for st, n in by_state.items() if PENDING_STATUS.get(st) == status)
                pending.add_metric([queue, status], count)
            running.add_metric([queue], sum(by_state.get(st, 0) for st in SLICE_STATES))
            paused.add_metric(
                [queue], sum(1 for a in active if a.queue == queue and a.paused_at is not None)
            )
            window.add_metric(
                [queue], 1.0 if admitted_now is None or queue in admitted_now else 0.0
            )
        ages = GaugeMetricFamily(
            "ebbtide_node_heartbeat_age_seconds",
            "Seconds since each node's last heartbeat (nodes that said they stopped are left out).",
            labels=["node"],
        )
        for n in nodes:
            if not n.stopping:
                ages.add_metric([n.name], max(0.0, now - n.heartbeat_at))
        yield from (pending, running, paused, window, ages)


def _window_admits(scheduler: Any, now: float, nodes: Sequence[Any]) -> set[str] | None:
    """The queues some device's windows let run ``now``; None when no window restricts
    any (or there is nothing to ask: no device reported).  A trial's trap:
    ``EbbtideQueueStuck`` fired every day on a queue that waits for its night window."""
    gates_of = getattr(getattr(scheduler, "runtime", None), "gates", None)
    if gates_of is None:
        return None
    devices = []
    for n in nodes:
        try:
            devices += [(n.name, int(d["index"])) for d in json.loads(n.devices_json or "[]")]
        except (ValueError, KeyError, TypeError):
            continue
    gates = gates_of(now, devices) if devices else None
    if gates is None:
        return None
    return {q for g in gates.values() for q in g.open}


def serve_metrics(metrics: Metrics, address: str, port: int) -> Callable[[], None]:
    """Serve ``metrics`` over HTTP (``/metrics``, Prometheus's text format), and whether
    this process's loops go round (``/healthz``, ``/readyz``: :mod:`ebbtide.probes`), on
    ``address``:``port`` in a thread; return what stops it.  A port that cannot be had
    is a :class:`~ebbtide.errors.ConfigError` naming it."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    scrape = make_wsgi_app(metrics.registry)
    probes = {"/healthz": metrics.probes.live, "/readyz": metrics.probes.ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return scrape(environ, start_response)
        good, text = probe()
        status = "200 OK" if good else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode() + b"\n"]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds is not news

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    try:
        server = make_server(address, port, app, Server, handler_class=Quiet)
    except OSError as exc:
        raise ConfigError(
            f"--metrics-port {port}: cannot serve metrics on {address}:{port} ({exc.strerror})"
        ) from None
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%s/metrics", address, server.server_port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


_default: Metrics | None = None
_default_lock = threading.Lock()


def default() -> Metrics:
    """This process's metrics, on prometheus_client's default registry (with its process
    and Python collectors)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Metrics(REGISTRY)
        return _default
