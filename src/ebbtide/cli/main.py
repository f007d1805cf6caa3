"""``ebb`` (alias ``ebbtide``): the qsub-style command line.

User mistakes print one line (``ebb: error: …``) and exit 1; never a traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Sequence
from typing import Any

import click

from ebbtide import __version__
from ebbtide.errors import EbbtideError, UserError

log = logging.getLogger("ebbtide")

JOB_STATES_HELP = (
    "held, waiting, queued, dispatched, running, evicting, succeeded, failed, cancelled"
)


def _client() -> Any:
    from ebbtide.client import Client

    return Client()


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("dramatiq", "pika"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"ebb: error: {exc}", err=True)
            ctx.exit(1)
        except EbbtideError as exc:
            click.echo(f"ebb: error: {exc}", err=True)
            ctx.exit(1)
        except ValueError as exc:  # parsers of flags raise ValueError with a clear message
            click.echo(f"ebb: error: {exc}", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ebbtide")
def cli() -> None:
    """ebbtide: run checkpointable offline GPU jobs in the headroom online inference
    leaves, and give it back within a hard deadline.

    \b
    Submit and watch jobs (PBS / Grid Engine style):
      ebb qsub -l gpu=25%,gpumem=4GiB train.sh     submit a script
      ebb qsub -N count -- python count.py 100     submit a command
      ebb qstat                                    list jobs
      ebb qstat -f 12                              one job in full
      ebb events 12                                what happened to a job
      ebb qdel 12 / ebb qhold 12 / ebb qrls 12     cancel, hold, release

    \b
    Run it:
      ebb demo                                     a tour on simulated GPUs
      ebb up --devices 2x80GiB                     everything in one process
      ebb scheduler / ebb worker --node NAME       distributed (Redis + PostgreSQL)

    State lives in $EBBTIDE_HOME (default ~/.ebbtide); see the README for all settings.
    """


# -- qsub -------------------------------------------------------------------------------


class _QsubCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["ebb_dashdash"] = "--" in args
        return super().parse_args(ctx, args)


@cli.command(
    "qsub",
    cls=_QsubCommand,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help"]},
)
@click.option("-N", "name", help="Job name.")
@click.option("-q", "queue", help="Queue (default: default).")
@click.option("-p", "priority", help="Priority, -1024..1023; higher runs first.")
@click.option(
    "-l",
    "resources",
    multiple=True,
    help="Resources: gpu=25%|0.25|1|2, gpumem=4GiB, walltime=HH:MM:SS, "
    "deadline=30s, checkpoint_interval=10m. Repeatable.",
)
@click.option("-J", "array", help="Array: 1-100, 1-100:2, 1-100%4 (at most 4 at once).")
@click.option(
    "-W", "depend", multiple=True, help="depend=afterok:ID[:ID],afternotok:ID,afterany:ID"
)
@click.option("-h", "hold", is_flag=True, help="Submit held (release with qrls).")
@click.option("-v", "env", multiple=True, help="Environment: VAR=val,VAR2 (bare: copied).")
@click.option(
    "--kind",
    type=click.Choice(["training", "inference", "batch"]),
    help="What the job is (default: batch).",
)
@click.option("--deadline", help="Eviction deadline, e.g. 30s (decision to free slice).")
@click.option("--signal", "signal_", help="Warning signal at eviction (default TERM).")
@click.option("--checkpoint-dir", help="Where the job keeps checkpoints.")
@click.option("-d", "--cwd", help="Working directory of the job.")
@click.option("--max-attempts", help="Failed attempts allowed before the job fails.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead.')
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def qsub(
    ctx: click.Context, args: Sequence[str], as_json: bool, signal_: str | None, **opts: Any
) -> None:
    """Submit a job: `ebb qsub [opts] SCRIPT [ARGS]` or `ebb qsub [opts] -- CMD ARGS`.

    #EBB and #PBS directive lines at the top of SCRIPT are honoured; command-line flags
    win. Prints only the job id (an array prints ID[]).
    """
    from ebbtide.cli.qsub import QsubOptions, build_spec_kwargs, load_script
    from ebbtide.queue.spec import JobSpec

    if not args:
        raise UserError("qsub needs a SCRIPT, or -- followed by a command")
    cli_opts = QsubOptions(
        name=opts["name"],
        queue=opts["queue"],
        priority=opts["priority"],
        resources=list(opts["resources"]),
        array=opts["array"],
        depend=list(opts["depend"]),
        hold=opts["hold"],
        env=list(opts["env"]),
        kind=opts["kind"],
        deadline=opts["deadline"],
        signal=signal_,
        checkpoint_dir=opts["checkpoint_dir"],
        cwd=opts["cwd"],
        max_attempts=opts["max_attempts"],
    )
    directives = None
    if ctx.meta.get("ebb_dashdash"):
        cli_opts.command = list(args)
    else:
        text, directives = load_script(args[0])
        cli_opts.script = text
        cli_opts.args = list(args[1:])
    spec = JobSpec(**build_spec_kwargs(cli_opts, directives))
    client = _client()
    ids = client.submit_many(spec)
    if as_json:
        out: dict[str, Any] = {"id": ids[0]}
        if spec.array:
            out["array"] = True
            out["tasks"] = ids
        _echo_json(out)
    else:
        click.echo(f"{ids[0]}[]" if spec.array else str(ids[0]))


# -- qstat ------------------------------------------------------------------------------


def _fmt_time(t: float | None) -> str:
    if not t:
        return "-"
    import datetime as dt

    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _slice_text(job: Any) -> str:
    from ebbtide.units import format_mib

    share = f"{job.gpus}gpu" if job.gpus else f"{job.compute_pct:g}%"
    return f"{share}/{format_mib(job.memory_mib)}"


@cli.command("qstat")
@click.option("-f", "full", type=int, metavar="ID", help="Show one job in full.")
@click.option("-u", "user", help="Only this user's jobs.")
@click.option("-Q", "queues", is_flag=True, help="Show queues with job counts per state.")
@click.option(
    "-s", "--state", "states", multiple=True, help=f"Only these states: {JOB_STATES_HELP}."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def qstat(
    full: int | None, user: str | None, queues: bool, states: Sequence[str], as_json: bool
) -> None:
    """Show jobs (all states, oldest first), one job in full (-f), or queues (-Q)."""
    from ebbtide.queue.states import JobState

    client = _client()
    if queues:
        stats = client.store.queue_stats()
        if as_json:
            _echo_json(stats)
            return
        click.echo(f"{'queue':<16} " + " ".join(f"{s.value[:9]:>9}" for s in JobState))
        for q, counts in sorted(stats.items()):
            click.echo(f"{q:<16} " + " ".join(f"{counts.get(s.value, 0):>9}" for s in JobState))
        return
    if full is not None:
        job = client.get(full)
        data = client.as_dict(job)
        if as_json:
            _echo_json(data)
            return
        for key, value in data.items():
            click.echo(f"{key:>20}: {value}")
        return
    try:
        wanted = [JobState(s) for s in states] or None
    except ValueError:
        raise UserError(f"--state: expected one of {JOB_STATES_HELP}") from None
    jobs = client.list(state=wanted, owner=user)
    if as_json:
        _echo_json([client.as_dict(j) for j in jobs])
        return
    click.echo(
        f"{'ID':>6} {'NAME':<20} {'USER':<10} {'QUEUE':<10} {'PRI':>4} {'STATE':<10} "
        f"{'ATT':>3} {'NODE/DEV':<14} {'SLICE':<12} {'START':>8}  REASON"
    )
    for j in jobs:
        where = f"{j.node}/{j.devices}" if j.node else "-"
        click.echo(
            f"{j.id:>6} {j.name[:20]:<20} {j.owner[:10]:<10} {j.queue[:10]:<10} {j.priority:>4} "
            f"{j.state:<10} {j.attempts:>3} {where[:14]:<14} {_slice_text(j):<12} "
            f"{_fmt_time(j.started_at):>8}  {j.reason}"
        )


# -- qdel / qhold / qrls ----------------------------------------------------------------


def _expand_ids(client: Any, ids: Sequence[str]) -> list[int]:
    out: list[int] = []
    for text in ids:
        raw = text.split(".", 1)[0]
        if raw.endswith("[]"):
            if not raw[:-2].isdigit():
                raise UserError(f"{text!r} is not a job id")
            tasks = client.list(array_id=int(raw[:-2]))
            if not tasks:
                raise UserError(f"no array with id {raw[:-2]}")
            out.extend(t.id for t in tasks)
        elif raw.isdigit():
            out.append(int(raw))
        else:
            raise UserError(f"{text!r} is not a job id (expected a number like 12, or 12[])")
    return out


def _act(ids: Sequence[str], action: str, as_json: bool) -> None:
    client = _client()
    results = []
    failed = False
    for job_id in _expand_ids(client, ids):
        try:
            job = getattr(client, action)(job_id)
            results.append({"id": job_id, "ok": True, "state": job.state})
        except UserError as exc:
            failed = True
            results.append({"id": job_id, "ok": False, "error": str(exc)})
            if not as_json:
                click.echo(f"ebb: error: {exc}", err=True)
    if as_json:
        _echo_json(results)
    if failed:
        sys.exit(1)


@cli.command("qdel")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qdel(ids: Sequence[str], as_json: bool) -> None:
    """Cancel jobs. A running job is evicted (warned, then killed at its deadline)."""
    _act(ids, "cancel", as_json)


@cli.command("qhold")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qhold(ids: Sequence[str], as_json: bool) -> None:
    """Hold queued or waiting jobs so they are not started."""
    _act(ids, "hold", as_json)


@cli.command("qrls")
@click.argument("ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True)
def qrls(ids: Sequence[str], as_json: bool) -> None:
    """Release held jobs."""
    _act(ids, "release", as_json)


@cli.command("events")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the events as a JSON list.")
def events(job_id: int, as_json: bool) -> None:
    """Show what happened to a job, oldest first."""
    client = _client()
    evs = client.events(job_id)
    if as_json:
        _echo_json(evs)
        return
    for e in evs:
        extra = {k: v for k, v in e.items() if k not in ("type", "time", "attempt")}
        att = f"#{e['attempt']}" if e["attempt"] else "  "
        detail = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        click.echo(f"{_fmt_time(e['time'])} {att:>3} {e['type']:<16} {detail}")


@cli.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nodes(as_json: bool) -> None:
    """Show node agents: heartbeat age, and each device's latest online load."""
    import time

    from ebbtide.units import format_mib

    client = _client()
    rows = client.store.nodes()
    now = time.time()
    cooldown_s = client.policy.defaults.eviction_cooldown_s

    def devices(n: Any) -> list[dict[str, Any]]:
        out = json.loads(n.devices_json)
        for d in out:
            evicted = d.get("last_eviction_at")
            d["cooldown_until"] = evicted + cooldown_s if evicted else None
        return out

    if as_json:
        _echo_json(
            [
                {
                    "name": n.name,
                    "heartbeat_age_s": round(now - n.heartbeat_at, 3),
                    "stopping": n.stopping,
                    "devices": devices(n),
                }
                for n in rows
            ]
        )
        return
    click.echo(f"{'NODE':<16} {'AGE':>6}  DEVICES (online compute / memory)")
    for n in rows:
        devs = "  ".join(
            f"{d['index']}:{d['online_compute_pct']:.0f}%/{format_mib(d['online_memory_mib'])}"
            f" of {format_mib(d['memory_mib'])}"
            + (
                f" (cooling down {d['cooldown_until'] - now:.0f}s)"
                if d["cooldown_until"] and d["cooldown_until"] > now
                else ""
            )
            for d in devices(n)
        )
        state = " (stopping)" if n.stopping else ""
        click.echo(f"{n.name[:16]:<16} {now - n.heartbeat_at:>5.1f}s  {devs}{state}")


# -- run modes --------------------------------------------------------------------------


def _agent_options(fn: Any) -> Any:
    fn = click.option("--mps", is_flag=True, help="Set CUDA MPS limits for each slice.")(fn)
    fn = click.option(
        "--headroom",
        default="static",
        show_default=True,
        help="Where online usage comes from: nvml, static, static:20%,8GiB, "
        "trace:FILE or trace:FILE@10x (replay 10x faster).",
    )(fn)
    fn = click.option(
        "--devices",
        default=None,
        help="Simulated devices for machines without GPUs: 2x80GiB, 1x40GiB,1x80GiB "
        "(default 1x80GiB; ignored with --headroom nvml).",
    )(fn)
    fn = click.option("--node", default=None, help="This node's name (default: host name).")(fn)
    return fn


def _open_source(devices: str | None, headroom: str) -> Any:
    from ebbtide.workers.devices import parse_devices
    from ebbtide.workers.headroom.factory import open_source

    devs = parse_devices(devices) if devices else None
    return open_source(headroom, devs)


@cli.command("up")
@_agent_options
@click.option("--policy", type=click.Path(dir_okay=False), help="Policy file (ebbtide.yaml).")
@click.option("--log-level", default="info", show_default=True)
def up(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    policy: str | None,
    log_level: str,
) -> None:
    """Embedded mode: scheduler and one node agent in one process, until signalled.

    SQLite in $EBBTIDE_HOME and dramatiq's in-memory broker: nothing else to install.
    SIGINT/SIGTERM evicts running attempts within their deadline and requeues them.
    """
    _run_node(node, devices, headroom, mps, policy, log_level, with_scheduler=True)


def _run_node(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    policy: str | None,
    log_level: str,
    *,
    with_scheduler: bool,
) -> None:
    """Run a node agent (with the scheduler beside it for ``ebb up``) until signalled."""
    from pathlib import Path

    from ebbtide.config.settings import Settings
    from ebbtide.runtime import build, describe_devices

    _setup_logging(log_level)
    settings = Settings.from_env()
    source = _open_source(devices, headroom)
    name = node or socket.gethostname()
    rt = build(
        settings,
        scheduler=with_scheduler,
        agent_name=name,
        source=source,
        mps=mps,
        policy_path=Path(policy) if policy else None,
    )
    log.info(
        "ebbtide %s: node %s, devices %s, headroom %s, home %s",
        "up" if with_scheduler else "worker",
        name,
        describe_devices(source.devices()),
        headroom,
        settings.home,
    )
    rt.run_until_signalled()


@cli.command("scheduler")
@click.option("--policy", type=click.Path(dir_okay=False), help="Policy file (ebbtide.yaml).")
@click.option("--log-level", default="info", show_default=True)
def scheduler(policy: str | None, log_level: str) -> None:
    """Run the scheduler alone (distributed mode: needs EBBTIDE_REDIS_URL)."""
    from pathlib import Path

    from ebbtide.config.settings import Settings
    from ebbtide.runtime import build

    _setup_logging(log_level)
    rt = build(Settings.from_env(), scheduler=True, policy_path=Path(policy) if policy else None)
    log.info("ebbtide scheduler up")
    rt.run_until_signalled()


@cli.command("worker")
@_agent_options
@click.option("--policy", type=click.Path(dir_okay=False), help="Policy file (ebbtide.yaml).")
@click.option("--log-level", default="info", show_default=True)
def worker(
    node: str | None,
    devices: str | None,
    headroom: str,
    mps: bool,
    policy: str | None,
    log_level: str,
) -> None:
    """Run a node agent (distributed mode: needs EBBTIDE_REDIS_URL)."""
    _run_node(node, devices, headroom, mps, policy, log_level, with_scheduler=False)


@cli.command("demo")
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


def _register_policy() -> None:
    from ebbtide.cli.policy_cmd import policy_group

    cli.add_command(policy_group)


_register_policy()


@cli.command("sim")
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
@click.option("--margins", default="5%,2GiB", show_default=True, help="ebbtide's safety margins.")
@click.option(
    "--quantiles",
    default="0.9,1",
    show_default=True,
    help="ebbtide's forecast: quantiles of recent compute and memory rises kept in reserve.",
)
@click.option(
    "--history", default="1h", show_default=True, help="ebbtide's forecast: history it rests on."
)
@click.option(
    "--clock-start",
    metavar="HH:MM",
    help="Local time at the trace's start (genai: 09:12 from its timestamps; trace: 00:00).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random draw.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Draw a PNG here.")
@click.option("--debug", is_flag=True, help="Check conservation on every change (slow).")
def sim(**options: Any) -> None:
    """Simulate offline jobs in the headroom of a recorded online load, beside baselines.

    The real planner, victim policy and forecast on a virtual clock. Prints harvest,
    interference, OOMs, evictions, wasted work and job completion times per policy.

    \b
      T=../shared/traces
      ebb sim --online genai:$T --jobs openb:$T/openb_pod_list_default.csv
      ebb sim --online trace:online.csv --jobs synthetic:7 --json
    """
    from ebbtide.sim.cli import run_sim

    run_sim(**options)


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="ebb")


if __name__ == "__main__":
    main()
