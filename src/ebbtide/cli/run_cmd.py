"""``ebb up | scheduler | worker | demo | sim``: run ebbtide, or a tour or simulation of it.

(Longer than our modules should be: the commands that run ebbtide's processes share the node
agent's options (``_agent_options``, ``_suspend_options``, ``_run_as_option``) and how a
headroom source is opened; ``demo`` and ``sim`` only hand over to :mod:`ebbtide.cli.demo`
and :mod:`ebbtide.sim`.)
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import click

from ebbtide.cli.common import _setup_logging, log, metrics_options


def _agent_options(fn: Any) -> Any:
    fn = click.option("--mps", is_flag=True, help="Set CUDA MPS limits for each slice.")(fn)
    fn = click.option(
        "--headroom",
        default="static",
        show_default=True,
        help="Where online usage comes from: nvml (real GPUs, per process), static, "
        "static:20%,8GiB, trace:FILE or trace:FILE@10x (replay 10x faster; once it ends "
        "its last row holds), or "
        "prometheus:URL (DCGM exporter figures through Prometheus or the exporter's "
        "/metrics; for planning: online load never triggers an eviction from them; a "
        "Prometheus server is asked for Hostname=--node unless ?LABEL=VALUE says otherwise).",
    )(fn)
    fn = click.option(
        "--devices",
        default=None,
        help="Simulated devices for machines without GPUs: 2x80GiB, 1x40GiB,1x80GiB "
        "(default 1x80GiB; ignored with --headroom nvml and prometheus:URL). With neither "
        "this nor --headroom, refused on a host where NVML sees GPUs.",
    )(fn)
    fn = click.option("--node", default=None, help="This node's name (default: host name).")(fn)
    return fn


def _bandwidth_mib_s(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    """``--host-copy-bandwidth``: a size per second (``10GiB``, ``10GiB/s``) in MiB/s."""
    if value is None:
        return None
    from ebbtide.units import parse_memory_mib

    text = value.strip()
    text = text[:-2] if text.lower().endswith("/s") else text
    try:
        mib = parse_memory_mib(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if mib <= 0:
        raise click.BadParameter(f"{value!r}: a copy bandwidth must be more than 0")
    return float(mib)


def _suspend_options(fn: Any) -> Any:
    """Suspend to host, for a policy that says ``suspend_to_host: auto``."""
    fn = click.option(
        "--host-copy-bandwidth",
        callback=_bandwidth_mib_s,
        metavar="SIZE",
        help="How fast this node copies GPU memory to host memory, per second (10GiB or "
        "10GiB/s): a suspension is chosen only if moving the job's memory at this rate "
        "fits its deadline (default 10000MiB, a guess until measured on the node's GPUs).",
    )(fn)
    fn = click.option(
        "--cuda-checkpoint",
        type=click.Path(dir_okay=False),
        metavar="PATH",
        help="NVIDIA's cuda-checkpoint utility (driver 550 or later), used where the "
        "policy says suspend_to_host: auto, to move a job's GPU memory to host memory "
        "instead of evicting it when online memory is short (default: found on PATH).",
    )(fn)
    return fn


def _run_as_option(default: str, help: str) -> Any:
    return click.option(
        "--run-as",
        type=click.Choice(["owner", "agent"]),
        default=default,
        show_default=True,
        envvar="EBBTIDE_RUN_AS",
        show_envvar=True,
        help=help,
    )


def _whom(executor: str, run_as: str) -> str:
    """Whom jobs run as, in words, for the start-up line."""
    if executor != "local":
        return "their pod spec says"
    return "their owners" if run_as == "owner" else "the agent's user"


def _open_source(devices: str | None, headroom: str, node: str) -> Any:
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.factory import open_source

    devs = parse_devices(devices) if devices else None
    return open_source(headroom, devs, node=node)


@click.command("up")
@_agent_options
@_suspend_options
@click.option("--policy", type=click.Path(dir_okay=False), help="Policy file (ebbtide.yaml).")
@_run_as_option(
    "agent",
    "Whom jobs run as. agent: the user running `ebb up` (one box, one user: the SQLite "
    "store is 0600 in a 0700 $EBBTIDE_HOME, so only that user submits; as root, only "
    "root's jobs run); owner: each job's owner (needs root; see `ebb worker --help`).",
)
@metrics_options
@click.option("--log-level", default="info", show_default=True)
def up(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    cuda_checkpoint: str | None,
    host_copy_bandwidth: float | None,
    policy: str | None,
    run_as: str,
    metrics_port: int | None,
    metrics_address: str,
    log_level: str,
) -> None:
    """Embedded mode: scheduler and one node agent in one process, until signalled.

    SQLite in $EBBTIDE_HOME and dramatiq's in-memory broker: nothing else to install.
    SIGINT/SIGTERM evicts running attempts within their deadline and requeues them.
    Jobs run as the user running it (--run-as agent).
    """
    _run_node(
        node,
        devices,
        headroom,
        mps,
        policy,
        log_level,
        with_scheduler=True,
        run_as=run_as,
        cuda_checkpoint=cuda_checkpoint,
        host_copy_mib_s=host_copy_bandwidth,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )


def _run_node(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    policy: str | None,
    log_level: str,
    *,
    with_scheduler: bool,
    executor: str = "local",
    profile: str | None = None,
    run_as: str = "agent",
    cuda_checkpoint: str | None = None,
    host_copy_mib_s: float | None = None,
    metrics_port: int | None = None,
    metrics_address: str = "0.0.0.0",
) -> None:
    """Run a node agent (with the scheduler beside it for ``ebb up``) until signalled."""
    from pathlib import Path

    from ebbtide.config.settings import Settings, redacted
    from ebbtide.runtime import build, describe_devices

    _setup_logging(log_level)
    settings = Settings.from_env()
    name = node or socket.gethostname()
    if devices is None and not _given("headroom"):
        _check_simulation_meant("up" if with_scheduler else "worker")
    source = _open_source(devices, headroom, name)
    rt = build(
        settings,
        scheduler=with_scheduler,
        agent_name=name,
        source=source,
        mps=mps,
        policy_path=Path(policy) if policy else None,
        executor=executor,
        profile=profile,
        run_as=run_as,
        # as root with --run-as agent, other users' jobs would run as root: refused
        others_as_agent=False,
        # ebb up: one box, one install: jobs find its Python (ebb worker: the host's own)
        own_python=with_scheduler,
        cuda_checkpoint=cuda_checkpoint,
        host_copy_mib_s=host_copy_mib_s,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    log.info(
        "ebbtide %s: node %s, devices %s, headroom %s, home %s, store %s, %s, jobs run as %s",
        "up" if with_scheduler else "worker",
        name,
        describe_devices(source.devices()),
        headroom,
        settings.home,
        redacted(settings.db_url),
        _messaging(settings),
        _whom(executor, run_as),
    )
    if (
        executor == "local"
        and run_as == "owner"
        and os.geteuid() == 0
        and not rt.policy.allow_root_jobs
    ):
        log.info(
            "root's jobs are refused here (they would run as root): submit as another "
            "user, or give this agent a policy file of its own (--policy) with "
            "allow_root_jobs: true (the scheduler's published one cannot open it), or "
            "--run-as agent"
        )
    rt.run_until_signalled()


def _given(param: str) -> bool:
    """Whether the command line (or its environment variable) set ``param``, not its
    default."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(param) if ctx is not None else None
    return source not in (None, ParameterSource.DEFAULT)


def _check_simulation_meant(command: str) -> None:
    """Neither --headroom nor --devices given: the agent would simulate one 80 GiB device
    with no online load.  Refused where NVML sees GPUs (a trial's trap: `ebb worker` on a
    GPU host joined the fleet's store with a simulated card, and put offline jobs beside
    online load nothing measured); said once where it sees none."""
    from ebbtide.errors import UserError
    from ebbtide.workers.headroom.nvml import gpus_here

    gpus = gpus_here()
    if gpus:
        raise UserError(
            f"this host has {gpus} NVIDIA GPU{'s' * (gpus > 1)} (NVML): give --headroom nvml "
            f"to measure them; without it ebb {command} simulates one 80GiB device with no "
            "online load, and would place offline jobs beside online work it cannot see "
            "(--headroom static or --devices simulates on purpose)"
        )
    log.warning(
        "no --headroom and no --devices: one simulated 80GiB device with no online load "
        "(--headroom static); on a GPU host give --headroom nvml"
    )


def _messaging(settings: Any) -> str:
    """Where commands and liveness go, for the startup line: Redis (its URL, password
    masked, and the key namespace), or in this process."""
    from ebbtide.config.settings import redacted

    if not settings.redis_url:
        return "messages in process (no EBBTIDE_REDIS_URL)"
    return f"Redis {redacted(settings.redis_url)} (namespace {settings.namespace})"


@click.command("scheduler")
@click.option("--policy", type=click.Path(dir_okay=False), help="Policy file (ebbtide.yaml).")
@metrics_options
@click.option("--log-level", default="info", show_default=True)
def scheduler(
    policy: str | None, metrics_port: int | None, metrics_address: str, log_level: str
) -> None:
    """Run the scheduler alone (distributed mode: needs EBBTIDE_REDIS_URL)."""
    from pathlib import Path

    from ebbtide.config.settings import Settings, redacted
    from ebbtide.runtime import build

    _setup_logging(log_level)
    settings = Settings.from_env()
    rt = build(
        settings,
        scheduler=True,
        policy_path=Path(policy) if policy else None,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )
    log.info("ebbtide scheduler up: store %s, %s", redacted(settings.db_url), _messaging(settings))
    rt.run_until_signalled()


@click.command("worker")
@_agent_options
@_suspend_options
@click.option(
    "--policy",
    type=click.Path(dir_okay=False),
    help="Policy file (ebbtide.yaml), reloaded on SIGHUP. Without one (and no "
    "$EBBTIDE_POLICY) the worker follows the policy the scheduler publishes.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "kubernetes"]),
    default="local",
    show_default=True,
    help="How attempts run: local processes below an attempt shim, or pods on this node "
    "(--node must be the Kubernetes node's name; the policy's `kubernetes:` section says "
    "the namespace, resource profile and default image).",
)
@click.option(
    "--profile",
    type=click.Choice(["qgpu", "hami", "volcano", "koordinator", "mig", "whole", "direct"]),
    default=None,
    help="This node's GPU resource profile, for --executor kubernetes (default: the "
    "policy's kubernetes.profile).",
)
@_run_as_option(
    "owner",
    "Whom jobs run as. owner: each job's owner (its Unix user on this node: uid, gid and "
    "groups; the agent runs as root, or runs only its own user's jobs; root's jobs only "
    "with the policy's allow_root_jobs); agent: every job as the user running the agent "
    "(a single-user box, a container, CI; as root, only root's jobs). Local executor "
    "only: pods run as their pod spec says.",
)
@metrics_options
@click.option("--log-level", default="info", show_default=True)
def worker(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    cuda_checkpoint: str | None,
    host_copy_bandwidth: float | None,
    policy: str | None,
    executor: str,
    profile: str | None,
    run_as: str,
    metrics_port: int | None,
    metrics_address: str,
    log_level: str,
) -> None:
    """Run a node agent (distributed mode: needs EBBTIDE_REDIS_URL)."""
    _run_node(
        node,
        devices,
        headroom,
        mps,
        policy,
        log_level,
        with_scheduler=False,
        executor=executor,
        profile=profile,
        run_as=run_as,
        cuda_checkpoint=cuda_checkpoint,
        host_copy_mib_s=host_copy_bandwidth,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
    )


@click.command("demo")
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    help="Keep the demo's state here to look at it afterwards (default: a temporary "
    "directory, removed at the end).",
)
@click.option(
    "--speedup",
    type=click.FloatRange(0.25, 20),
    default=1.0,
    show_default=True,
    help="Replay the trace (and run the jobs) this many times faster.",
)
@click.option(
    "--jobs",
    "count",
    type=click.IntRange(1, 12),
    default=5,
    show_default=True,
    help="How many offline jobs to submit.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as one JSON object (events to stderr).",
)
def demo(home: str | None, speedup: float, count: int, as_json: bool) -> None:
    """A tour on two simulated 80 GiB GPUs, nothing to install (about 90 s).

    The online load replays 45 minutes of two real production inference GPUs (the
    Alibaba GenAI trace, CC BY 4.0), compressed into 91 s. A few checkpointing offline
    jobs run in the headroom it leaves. Shown as it happens: the online load and the
    slices held, each job dispatched, evicted when online load spikes (warned,
    checkpointed, exited, or killed at its deadline), requeued and resumed; then a
    summary: evictions, deadline misses, eviction latency, work lost, GPU time harvested.

    Embedded mode in this process: SQLite in a fresh directory and an in-memory broker,
    whatever EBBTIDE_* says. Exits 1 if a job failed or a deadline was missed.
    """
    from pathlib import Path

    from ebbtide.cli.demo import run

    sys.exit(run(Path(home) if home else None, speedup, count, as_json))


@click.command("sim")
@click.option(
    "--online",
    required=True,
    metavar="genai:DIR|trace:CSV",
    help="Online load per device: the GenAI trace directory (its two files, gzipped or "
    "not) or a CSV in the trace: format.",
)
@click.option(
    "--jobs",
    default="synthetic",
    show_default=True,
    metavar="openb:CSV|synthetic[:SEED]",
    help="Offline jobs: the openb pod list's best-effort GPU pods, or a seeded synthetic mix.",
)
@click.option(
    "--load",
    type=click.Choice(["backlogged", "trace"]),
    default="backlogged",
    show_default=True,
    help="backlogged: the job stream repeats so the queue never runs dry; trace: jobs "
    "arrive when the stream says.",
)
@click.option(
    "--arrival-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="With --load trace, arrivals come this many times faster than recorded.",
)
@click.option(
    "--hours", type=click.FloatRange(min=0, min_open=True), help="Simulate at most H hours."
)
@click.option("--devices", type=click.IntRange(min=1), help="Take only the first N online devices.")
@click.option("--device-memory", default="80GiB", show_default=True, help="Memory of each device.")
@click.option(
    "--job-gpu-memory",
    default="16GiB",
    show_default=True,
    help="openb jobs: memory of the GPU their gpu_milli is a share of.",
)
@click.option(
    "--stubborn-frac",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="openb jobs: share that ignores the eviction warning (killed at the deadline).",
)
@click.option(
    "--baselines/--no-baselines",
    "baselines_on",
    default=True,
    show_default=True,
    help="Also run exclusive, static-night and greedy.",
)
@click.option(
    "--margins",
    default="5%,2GiB",
    show_default=True,
    help="ebbtide's safety margins (given with --policy: over its margin_compute_pct and "
    "margin_memory_mib).",
)
@click.option(
    "--quantiles",
    default="0.9,1",
    show_default=True,
    help="ebbtide's forecast: quantiles of recent compute and memory rises kept in reserve "
    "(given with --policy: over its forecast_compute_quantile).",
)
@click.option(
    "--history",
    default="1h",
    show_default=True,
    help="ebbtide's forecast: history it rests on (given with --policy: over its "
    "forecast_history_s).",
)
@click.option(
    "--clock-start",
    metavar="HH:MM",
    help="Local time at the trace's start (genai: 09:12 from its timestamps; trace: 00:00).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False),
    help="Run ebbtide under this policy file: its defaults (margins, deadline, cooldown, "
    "backoff, forecast, pausing), windows and queue limits and protections (jobs are in "
    "queue default; devices are gpuK/0). Windows are read on a simulated calendar day, "
    "Monday 2024-01-08, from --clock-start's time of day in the first cron window's "
    "timezone (UTC without one); a note says when no window opens in the span or a pool "
    "matches no device. --margins, --quantiles and --history given on the command line, "
    "--no-pause and --suspend-to-host apply over the file. Without it, ebbtide keeps the "
    "built-in policy's cooldown and backoff.",
)
@click.option(
    "--pause/--no-pause",
    default=True,
    show_default=True,
    help="ebbtide's graduated response: a compute spike while memory fits pauses jobs "
    "in place rather than evicting them (--no-pause: every shortfall evicts).",
)
@click.option(
    "--suspend-to-host/--no-suspend-to-host",
    default=None,
    help="ebbtide's suspend to host: a memory shortage moves a pausable job's GPU memory to "
    "host memory rather than evicting it, where the copy fits its deadline and the host's "
    "budget (default: the policy file's suspend_to_host, else off, as in the built-in "
    "policy). Counted as suspensions, restores and evictions_while_suspended.",
)
@click.option(
    "--restart-overhead",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="Time a resumed job spends on the GPU restoring its checkpoint and CUDA context "
    "before it makes progress (a thaw after a pause costs none).",
)
@click.option(
    "--tile",
    default="1",
    show_default=True,
    metavar="N",
    help="A fleet N times larger (1-1000): the online devices repeated N times, each copy's "
    "usage shifted by a phase under 1 h drawn from --seed, and the offline stream repeated "
    "N times with them (N times the arrivals under --load trace).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random draw.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: the workload, and per policy the table's figures and what "
    "they rest on (README, Simulation).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also draw a PNG here (or what the name's suffix says; checked before the run; "
    "needs matplotlib: pip install 'ebbtide[plot]').",
)
@click.option("--debug", is_flag=True, help="Check conservation on every change (slow).")
def sim(**options: Any) -> None:
    """Simulate offline jobs in the headroom of a recorded online load, beside baselines.

    The real planner, victim policy and forecast on a virtual clock. Prints harvest,
    interference, OOMs, evictions, wasted work and job completion times per policy.

    \b
      T=../shared/traces
      ebb sim --online genai:$T --jobs openb:$T/openb_pod_list_default.csv
      ebb sim --online trace:genai_sample.csv --jobs synthetic:7 --json
    """
    from click.core import ParameterSource

    from ebbtide.sim.cli import run_sim

    ctx = click.get_current_context()
    given = [
        name
        for name in ("margins", "quantiles", "history")
        if ctx.get_parameter_source(name)
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    ]
    run_sim(**options, given=given)
