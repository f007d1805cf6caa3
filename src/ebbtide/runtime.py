"""Run modes: wire the store, the bus, the scheduler and the node agent together.

- embedded (``ebb up``): scheduler and one agent in one process, SQLite, dramatiq's
  in-memory broker.  Nothing else to install.
- distributed: ``ebb scheduler`` and ``ebb worker`` as separate processes on Redis and
  PostgreSQL (or SQLite on one host).

SIGINT/SIGTERM is graceful everywhere: running attempts are evicted within their
deadline and requeued, never lost.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebbtide.config.policy import Policy, load_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import ConfigError
from ebbtide.messaging.bus import Bus
from ebbtide.messaging.liveness import call_timeout_s
from ebbtide.metrics import DEFAULT_METRICS_ADDRESS, Metrics, serve_metrics
from ebbtide.metrics import default as default_metrics
from ebbtide.queue.store import Store
from ebbtide.scheduling.leader import LeaderLock
from ebbtide.scheduling.loop import Scheduler
from ebbtide.scheduling.snapshot import QueueLimits
from ebbtide.units import format_mib
from ebbtide.workers.agent import NodeAgent
from ebbtide.workers.headroom.base import DeviceInfo, HeadroomSource
from ebbtide.workers.heartbeat import HeartbeatRules
from ebbtide.workers.policy_follow import FileFollower, PolicyFollower
from ebbtide.workers.suspend import DEFAULT_HOST_COPY_MIB_S, CudaCheckpoint

log = logging.getLogger("ebbtide")


@dataclass
class Runtime:
    """The parts of one ebbtide process; :meth:`stop` takes them down gracefully."""

    settings: Settings
    store: Store
    bus: Bus
    policy: Policy
    policy_path: Path | None = None
    scheduler: Scheduler | None = None
    agent: NodeAgent | None = None
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    #: the agent's ``cuda-checkpoint`` for a policy, where it says ``suspend_to_host:
    #: auto`` and this node can suspend (None otherwise); a reload to auto asks again
    suspender: Callable[[Policy], CudaCheckpoint | None] | None = None
    metrics: Metrics = field(default_factory=Metrics)
    #: (address, port) to serve the metrics on; None: not served
    metrics_at: tuple[str, int] | None = None
    #: a lone agent with no policy file of its own follows the scheduler's published one
    follower: PolicyFollower | None = None

    def start(self) -> None:
        if self.agent:  # refused before its commands are served, if another has the name
            self.agent.claim_name()
        if self.metrics_at is not None:
            stop = serve_metrics(self.metrics, *self.metrics_at)
            self.on_stop.append(stop)
        nodes = {self.agent.name: self.agent.command} if self.agent else {}
        events = self.scheduler.wake if self.scheduler else None
        self.bus.serve(nodes=nodes, events=events)
        if self.agent:
            self.agent.start()
        if self.scheduler:
            self.scheduler.start()
        if self.follower is not None:
            self.follower.start()
            self.on_stop.insert(0, self.follower.stop)

    def stop(self) -> None:
        if self.agent:
            log.info("evicting running attempts before leaving")
            self.agent.shutdown()
        if self.scheduler:
            self.scheduler.stop()
        self.bus.close()
        for fn in self.on_stop:
            fn()
        self.store.close()

    def apply_policy(self, policy: Policy) -> None:
        """A new policy took effect: the agent's fast path follows it too."""
        self.policy = policy
        if self.agent is not None:
            self.agent.margins = policy.defaults.margins
            self.agent.queues = queue_limits(policy)
            self.agent.metrics.known_queues(self.agent.name, self.agent.queues)
            self.agent.deadline_s = policy.defaults.deadline_s
            self.agent.heartbeat_timeout_s = policy.defaults.heartbeat_timeout_s
            self.agent.sync.heartbeats.rules = heartbeat_rules(policy)
            self.agent.health.recovery_s = policy.defaults.device_recovery_s
            self.agent.planning_margin = policy.defaults.planning_margins
            self.agent.pause_rules = policy.defaults.pause_rules()
            if self.agent.cuda_checkpoint is None and self.suspender is not None:
                # turned to suspend_to_host: auto (once there, it stays: suspended
                # attempts are restored with it after a turn back to never)
                self.agent.cuda_checkpoint = self.suspender(policy)
            self.agent.allow_root_jobs = policy.allow_root_jobs

    def reload_policy(self) -> None:
        """SIGHUP: the scheduler reloads (and tells the agent); a lone agent reloads its
        file, or with none looks at the policy the scheduler published at once."""
        if self.scheduler is not None:
            self.scheduler.request_reload()
            return
        path = self.policy_path
        if self.follower is not None:  # the published policy, or the file if it changed
            self.follower.wake()
            return
        if path is None:
            return
        try:
            self.apply_policy(load_policy(path))
            log.info("policy reloaded from %s", path)
        except ConfigError as exc:
            for line in str(exc).splitlines():
                log.error("policy not reloaded, keeping the old one: %s", line)

    def run_until_signalled(self) -> None:
        done = threading.Event()

        def _handler(signum: int, _frame: object) -> None:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            done.set()

        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGHUP, lambda _s, _f: self.reload_policy())
        self.start()
        log.info("ready: SIGINT or SIGTERM stops gracefully, SIGHUP reloads the policy")
        done.wait()
        self.stop()


def _bus(settings: Settings, *, embedded: bool) -> Bus:
    if settings.redis_url:
        return Bus.redis(settings.redis_url, settings.namespace)
    if embedded:
        return Bus.memory(settings.namespace)
    raise ConfigError(
        "distributed mode needs a broker: set EBBTIDE_REDIS_URL (e.g. redis://127.0.0.1:6379/0)"
        " or run `ebb up` for the embedded mode"
    )


def build(
    settings: Settings,
    *,
    scheduler: bool,
    agent_name: str | None = None,
    source: HeadroomSource | None = None,
    mps: bool = False,
    policy_path: Path | None = None,
    executor: str = "local",
    profile: str | None = None,
    run_as: str = "agent",
    others_as_agent: bool = True,
    cuda_checkpoint: str | None = None,
    host_copy_mib_s: float | None = None,
    metrics_port: int | None = None,
    metrics_address: str = DEFAULT_METRICS_ADDRESS,
    own_python: bool = False,
) -> Runtime:
    path = policy_path or settings.policy_path
    policy = load_policy(path)
    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)  # logs, checkpoints: private
    store = Store(settings.db_url)
    follower = None
    if path is None and not scheduler and agent_name is not None:
        # a worker with no file of its own: the scheduler's policy, now and as it changes
        follower = PolicyFollower(store)
        policy = follower.read() or policy
    elif path is not None and not scheduler and agent_name is not None:
        follower = FileFollower(path)  # its own file, read again when it changes
    if settings.redis_url and store.engine.dialect.name == "sqlite":
        # a trial's trap: a worker with the broker set and no EBBTIDE_DB_URL ran on a
        # SQLite file of its own, and never appeared in the fleet
        log.warning(
            "the store is the SQLite file %s: only processes on this host that use it "
            "share it; set EBBTIDE_DB_URL=postgresql://... to join a fleet",
            store.engine.url.database,
        )
    # the agent's executor is checked before the broker: a wrong --executor/--profile or
    # policy section is said first
    runs = _executor(executor, policy, agent_name, profile) if agent_name is not None else None
    suspender = (
        _suspender(policy, executor, cuda_checkpoint, host_copy_mib_s)
        if agent_name is not None
        else None
    )
    bus = _bus(settings, embedded=scheduler and agent_name is not None)
    # distributed: nodes say they are alive through Redis, and the store merges that in
    liveness = bus.liveness(timeout_s=call_timeout_s(policy.defaults.heartbeat_timeout_s))
    store.liveness = liveness
    rt = Runtime(settings=settings, store=store, bus=bus, policy=policy, policy_path=path)
    rt.suspender = suspender
    if follower is not None:
        follower.apply = rt.apply_policy
        rt.follower = follower
    if metrics_port is not None:  # served: the process's own, with its process metrics
        rt.metrics = default_metrics()
        rt.metrics_at = (metrics_address, metrics_port)
    if scheduler:
        rt.scheduler = Scheduler(
            store,
            policy=policy,
            policy_path=path,
            send=bus.send_to_node,
            leader=LeaderLock(store.engine, settings.home),
            on_policy=rt.apply_policy,
            metrics=rt.metrics,
            liveness=liveness,
        )
    if agent_name is not None:
        assert source is not None
        rt.agent = NodeAgent(
            agent_name,
            store,
            source,
            home=settings.home,
            margins=policy.defaults.margins,
            notify=bus.notify_scheduler,
            mps=mps,
            queues=queue_limits(policy),
            forecast=policy.defaults.forecaster,
            deadline_s=policy.defaults.deadline_s,
            heartbeat_timeout_s=policy.defaults.heartbeat_timeout_s,
            device_recovery_s=policy.defaults.device_recovery_s,
            planning_margin=policy.defaults.planning_margins,
            pause=policy.defaults.pause_rules(),
            cuda_checkpoint=suspender(policy) if suspender is not None else None,
            executor=runs,
            run_as=run_as,
            allow_root_jobs=policy.allow_root_jobs,
            others_as_agent=others_as_agent,
            metrics=rt.metrics,
            own_python=own_python,
            liveness=liveness,
        )
        rt.agent.sync.heartbeats.rules = heartbeat_rules(policy)
        rt.on_stop.append(source.close)
    return rt


def heartbeat_rules(policy: Policy) -> HeartbeatRules:
    """When the agent's heartbeats are written, under ``policy``: its heartbeat timeout's
    write period, deadbands within half its margins."""
    d = policy.defaults
    return HeartbeatRules.for_policy(
        d.heartbeat_timeout_s, d.margins.compute_pct, d.margins.memory_mib
    )


def _executor(kind: str, policy: Policy, node: str, profile: str | None) -> Any:
    """The node agent's executor: None (local processes, the agent's default) or pods."""
    if kind == "local":
        if profile is not None:
            raise ConfigError(f"--profile {profile}: only for --executor kubernetes")
        return None
    if kind != "kubernetes":
        raise ConfigError(f"--executor: {kind!r} is not one of local, kubernetes")
    if policy.kubernetes is None:
        raise ConfigError(
            "--executor kubernetes needs a `kubernetes:` section in the policy file "
            "(its namespace, resource profile and default image; an empty `kubernetes:` "
            "is none: write `kubernetes: {}` for the defaults)"
        )
    from kubernetes import client, config

    from ebbtide.kube.executor import KubernetesExecutor

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(
                f"--executor kubernetes: no cluster to talk to (not in a pod, no kubeconfig: {exc})"
            ) from None
    # the agent's loop makes API calls: each is bounded by its own timeout, never retried
    # behind the loop's back (the client's default retries three times)
    configuration = client.Configuration.get_default_copy()
    configuration.retries = 0
    return KubernetesExecutor(
        client.CoreV1Api(client.ApiClient(configuration)),
        policy.kubernetes,
        node=node,
        profile=profile,
        queue_settings=policy.queues,
    )


def _suspender(
    policy: Policy, executor: str, path: str | None, host_copy_mib_s: float | None
) -> Callable[[Policy], CudaCheckpoint | None]:
    """What gives the node agent its ``cuda-checkpoint`` under a policy: one where the
    policy says ``suspend_to_host: auto``, attempts run as local processes and the
    utility is there (``path``, else found on ``PATH``); None otherwise, with the reason
    in the log.  A ``--cuda-checkpoint`` that cannot be run is an error at once."""
    bandwidth_mib_s = DEFAULT_HOST_COPY_MIB_S if host_copy_mib_s is None else host_copy_mib_s
    if path is not None and not CudaCheckpoint(path).available():
        raise ConfigError(
            f"--cuda-checkpoint {path}: not an executable file (NVIDIA's cuda-checkpoint, "
            "with driver 550 or later)"
        )
    if path is not None and policy.defaults.suspend_to_host != "auto":
        log.info("--cuda-checkpoint is unused while the policy says suspend_to_host: never")

    def make(current: Policy) -> CudaCheckpoint | None:
        if current.defaults.suspend_to_host != "auto":
            return None
        if executor != "local":
            log.warning(
                "suspend_to_host is auto, but this agent cannot suspend pods "
                "(--executor %s): memory shortage evicts on this node",
                executor,
            )
            return None
        cc = CudaCheckpoint(path, bandwidth_mib_s=bandwidth_mib_s)
        if not cc.available():
            log.warning(
                "suspend_to_host is auto, but cuda-checkpoint is not on PATH (give "
                "--cuda-checkpoint PATH): memory shortage evicts on this node"
            )
            return None
        if not current.defaults.pause:
            log.warning("suspend_to_host is auto, but pause is false: nothing is suspended")
        log.info(
            "suspend to host: on, with %s (host copy assumed at %s/s)",
            cc.path,
            format_mib(bandwidth_mib_s),
        )
        return cc

    return make


def queue_limits(policy: Policy) -> dict[str, QueueLimits]:
    return {name: q.limits for name, q in policy.queues.items()}


def describe_devices(devices: list[DeviceInfo]) -> str:
    from ebbtide.units import format_mib

    return ", ".join(f"{d.index}:{format_mib(d.memory_mib)}" for d in devices)
