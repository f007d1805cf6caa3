"""``ebb`` (alias ``ebbtide``): the qsub-style command line.

User mistakes print one line (``ebb: error: …``) and exit 1; never a traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import click

from ebbtide import __version__
from ebbtide.cli.common import _client, _client_warnings, _echo_json, _setup_logging, log
from ebbtide.errors import EbbtideError, UserError

#: Every command: the module that defines it, and its name there.  A module is imported
#: only when its command runs (or for ``--help``), so ``ebb qsub`` does not pay for the
#: scheduler, the simulator or the Kubernetes client.
COMMANDS = {
    "qsub": ("ebbtide.cli.qsub_cmd", "qsub"),
    "sbatch": ("ebbtide.cli.qsub_cmd", "sbatch"),
    "qstat": ("ebbtide.cli.qstat_cmd", "qstat"),
    "qalter": ("ebbtide.cli.jobs_cmd", "qalter"),
    "qdel": ("ebbtide.cli.jobs_cmd", "qdel"),
    "qhold": ("ebbtide.cli.jobs_cmd", "qhold"),
    "qrls": ("ebbtide.cli.jobs_cmd", "qrls"),
    "events": ("ebbtide.cli.logs_cmd", "events"),
    "logs": ("ebbtide.cli.logs_cmd", "logs"),
    "recommend": ("ebbtide.cli.recommend_cmd", "recommend"),
    "nodes": ("ebbtide.cli.nodes_cmd", "nodes"),
    "node": ("ebbtide.cli.nodes_cmd", "node_group"),
    "top": ("ebbtide.cli.top_cmd", "top"),
    "report": ("ebbtide.cli.report_cmd", "report"),
    "up": ("ebbtide.cli.run_cmd", "up"),
    "scheduler": ("ebbtide.cli.run_cmd", "scheduler"),
    "worker": ("ebbtide.cli.run_cmd", "worker"),
    "demo": ("ebbtide.cli.run_cmd", "demo"),
    "sim": ("ebbtide.cli.run_cmd", "sim"),
    "policy": ("ebbtide.cli.policy_cmd", "policy_group"),
    "k8s": ("ebbtide.cli.k8s_cmd", "k8s_group"),
    "server": ("ebbtide.cli.server_cmd", "server"),
    "token": ("ebbtide.cli.token_cmd", "token_group"),
    "admin": ("ebbtide.cli.admin_cmd", "admin_group"),
}

__all__ = ["_client", "_echo_json", "_setup_logging", "cli", "log", "main"]


def _usage_error(exc: click.UsageError) -> str:
    """What click's usage error says (``Invalid value for '--hours': ...`` as ``--hours:
    ...``, ``No such option: -a``) and where the command's help is."""
    param = exc.param if isinstance(exc, click.BadParameter) else None
    if param is None or isinstance(exc, click.MissingParameter):
        text = exc.format_message().rstrip(".")
    else:
        name = (
            "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
        )
        text = f"{name}: {exc.message.rstrip('.')}"
    where = exc.ctx.command_path if exc.ctx is not None else "ebb"
    return f"{text} ({where} --help)"


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # what click refused: one line, as ours are
            if exc.ctx is None and ctx.invoked_subcommand:  # (click gave it no context)
                exc.ctx = click.Context(ctx.command, info_name=f"ebb {ctx.invoked_subcommand}")
            click.echo(f"ebb: error: {_usage_error(exc)}", err=True)
            ctx.exit(2)
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
      ebb sbatch train.sbatch                      submit a Slurm script (#SBATCH)
      ebb qstat                                    list jobs
      ebb qstat -f 12                              one job in full
      ebb events 12                                what happened to a job
      ebb logs [-e] [-f] 12                        what it wrote (-e stderr, -f as it comes)
      ebb qdel 12 / ebb qhold 12 / ebb qrls 12     cancel, hold, release
      ebb qalter 12 -l gpu=50%,walltime=4:00:00    change a job that has not started
      ebb recommend 12 / -u alice                  the slice to ask for, from what it used
      ebb nodes                                    node agents, device load and health
      ebb node drain gpu-a/3                       take a device out of service (admins)
      ebb top                                      the fleet live: GPUs, attempts, evictions
      ebb report --since 7d --plot week.png        harvest, evictions, waits over a window

    \b
    Run it:
      ebb demo                                     a tour on simulated GPUs
      ebb up --devices 2x80GiB                     everything in one process
      ebb scheduler / ebb worker --node NAME       distributed (Redis + PostgreSQL)
      ebb k8s render --profile hami -- CMD         the Pod an attempt would run in

    \b
    Serve a fleet's users (they set EBBTIDE_URL; no database URL needed):
      ebb server --listen 0.0.0.0:8786 --tls-cert C --tls-key K
      ebb server --socket /run/ebbtide/api.sock    local users, known by the kernel
      ebb token create alice                       a bearer token for alice (admins)
      ebb admin purge --older-than 90d             remove old finished jobs (admins)

    State lives in $EBBTIDE_HOME (default ~/.ebbtide); see the README for all settings.
    """
    _client_warnings()


# -- commands -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="ebb")


if __name__ == "__main__":
    main()
