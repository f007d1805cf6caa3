"""``ebb qsub | sbatch``: submit jobs, PBS's way or Slurm's."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import click

from ebbtide.cli import fast
from ebbtide.cli.common import _client, _echo_json
from ebbtide.errors import SpecError, UserError
from ebbtide.scriptfile import read_script
from ebbtide.units import shown


class _QsubCommand(click.Command):
    """``ebb qsub``: a ``--`` where the options are read ends them and makes the rest a
    command (``ebb_dashdash``); one after SCRIPT is the script's own argument, and one
    given as an option's value (``-N --``) is refused."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = list(args)
        rest = super().parse_args(ctx, args)
        # a trial's trap: any "--" at all (``SCRIPT -- ARGS``) made a command of the
        # script, its directives dropped.  The positional words are the last ones (no
        # option after the first of them), and click drops the "--" that ends the options
        given = ctx.params.get("args") or ()
        options = words[: len(words) - len(given)]
        for param in self.params:
            value = ctx.params.get(param.name or "")
            values = value if isinstance(value, tuple) else (value,)
            if isinstance(param, click.Option) and "--" in values:
                raise UserError(
                    f"{param.opts[0]} was given '--' as its value: give it one before the "
                    f"--, e.g. `ebb qsub {param.opts[0]} VALUE -- CMD`"
                )
        ctx.meta["ebb_dashdash"] = "--" in options
        return rest


@click.command(
    "qsub",
    cls=_QsubCommand,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["--help"]},
)
@click.option("-N", "name", help="Job name.")
@click.option("-q", "queue", help="Queue, or one of its aliases in the policy (default: default).")
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
    "-W",
    "depend",
    multiple=True,
    help="depend=afterok:ID[:ID],afternotok:ID,afterany:ID; ID[] a whole array, ID[3] its task 3",
)
@click.option("-h", "hold", is_flag=True, help="Submit held (release with qrls).")
@click.option(
    "--pause/--no-pause",
    "pause",
    default=None,
    help="Whether an online compute spike may pause the job (frozen in place, keeping its "
    "GPU memory) rather than evict it. --no-pause for jobs that cannot stop, e.g. "
    "collectives with timeouts. Default: the queue's (yes unless the policy says no).",
)
@click.option("-v", "env", multiple=True, help="Environment: VAR=val,VAR2 (bare: copied).")
@click.option(
    "--kind",
    type=click.Choice(["training", "inference", "batch"], case_sensitive=False),
    help="What the job is (default: batch).",
)
@click.option("--deadline", help="Eviction deadline, 1s..1h, e.g. 30s (decision to free slice).")
@click.option(
    "--signal",
    "signal_",
    help="Warning signal at eviction: TERM (default), INT, HUP, USR1, USR2, QUIT, ALRM, XCPU.",
)
@click.option(
    "--checkpoint-dir",
    help="Where the job keeps checkpoints (%j id, %A array id, %a index, %x name, %u user: "
    "an array's tasks need %a, e.g. ckpt/%a).",
)
@click.option("-d", "--cwd", help="Working directory of the job.")
@click.option("--max-attempts", help="Failed attempts allowed before the job fails, 1..100.")
@click.option(
    "--image",
    help="Container image of the job under the Kubernetes executor "
    "(default: the queue's, else the policy's kubernetes.image).",
)
@click.option(
    "-o",
    "stdout",
    help="Where stdout goes: a path (relative to the job's directory; %j id, %A array "
    "id, %a index, %x name, %u user, %N node). Default: kept with the attempt (ebb logs).",
)
@click.option("-e", "stderr", help="Where stderr goes, as -o. Default: kept with the attempt.")
@click.option(
    "-j",
    "join",
    help="oe: stderr goes where stdout goes (the -o file, else the attempt's log; -e is "
    "unused); eo: stdout where stderr goes; n: apart (the default).",
)
@click.option("-A", "account", help="Account to record against the job (qstat -f shows it).")
@click.option(
    "-V", "export_all", is_flag=True, help="Copy the submitting environment into the job."
)
@click.option("-S", "shell", help="Shell for a script with no #! line, e.g. /bin/bash.")
@click.option(
    "--allow-future",
    is_flag=True,
    help="Accept a job no node could hold today (more GPUs or memory than any has): one "
    "that can will join.",
)
@click.option("-m", "mail", help="Accepted, without effect: mail is not sent.")
@click.option("-M", "mail_to", help="Accepted, without effect: mail is not sent.")
@click.option("-r", "rerun", help="Accepted, without effect: evicted jobs are always requeued.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead.')
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def qsub(
    ctx: click.Context, args: Sequence[str], as_json: bool, signal_: str | None, **opts: Any
) -> None:
    """Submit a job: `ebb qsub [opts] SCRIPT [ARGS]` or `ebb qsub [opts] -- CMD ARGS`.

    #EBB and #PBS directive lines at the top of SCRIPT are honoured, as PBS Pro, OpenPBS
    and Torque scripts carry them (-l select=1:ncpus=8:ngpus=1:mem=32gb,
    -l nodes=1:ppn=8:gpus=1, -J / -t arrays, -o, -e, -j oe, -A, -V); a script with only
    #SBATCH lines is read as Slurm's (see ebb sbatch). Command-line flags win. A directive
    with no effect here (-m, -l place=...) is accepted with a note on stderr; a job that
    needs more than one node is refused. Prints only the job id (an array prints ID[]).

    Units, the same in flags, scripts, the SDK and policy files: sizes (gpumem, mem) need
    a unit, like 4GiB, 512MiB or 16GB (a bare number is refused, never guessed); in a -l
    list, PBS's kb, mb, gb and tb are powers of 1024 (gpumem=32gb is 32GiB), as PBS reads
    mem; durations are 30s, 5m, 2h, HH:MM:SS, DD:HH:MM:SS or a bare number of seconds.

    The job sees EBBTIDE_* variables and PBS's: PBS_JOBID, PBS_JOBNAME, PBS_O_WORKDIR,
    PBS_O_HOST, PBS_QUEUE, PBS_ARRAY_INDEX and PBS_ARRAYID (array tasks), PBS_NODEFILE.

    Under the policy's kubernetes section, the slice is rounded to what the fleet's
    resource profile grants (qstat -f shows both), and a slice the profile cannot
    express, a --signal other than TERM, or a job with no image is refused.
    """
    if not args:
        # a trial's trap: `ebb qsub -h` read as a request for help, as most tools' -h is
        hold = " (-h holds the job, as PBS's qsub -h; ebb qsub --help shows the help)"
        raise UserError(
            "qsub needs a SCRIPT, or -- followed by a command" + (hold if opts["hold"] else "")
        )
    opts = {**opts, "signal": signal_}
    allow_future = opts.pop("allow_future")
    dashdash = bool(ctx.meta.get("ebb_dashdash"))
    script = None if dashdash else (args[0], read_script(args[0]))
    rest = list(args if dashdash else args[1:])
    submitted = None
    if fast.socket_url() is not None:  # a server on this host: no store, no heavy imports
        submitted = fast.qsub(opts, rest, script=script, allow_future=allow_future)
    if submitted is not None:
        ids, is_array, notes = submitted["ids"], submitted["array"], submitted["notes"]
    else:
        from ebbtide.queue.qsub import qsub_spec

        notes = []
        spec = qsub_spec(opts, rest, script=script, notes=notes)
        try:
            ids, is_array = _submitted(spec, notes, allow_future)
        except SpecError as exc:  # a trial's trap: a script's queue, named without its line
            where = _queue_line(script) if exc.field == "queue" and not opts["queue"] else None
            if where is None:
                raise
            raise SpecError(f"{where}: queue", exc.reason) from None
    if script is not None and not opts["shell"]:
        notes += _no_shebang_note(*script)
    _say_submitted("qsub", ids, is_array, notes, as_json)
    if not as_json:
        click.echo(f"{ids[0]}[]" if is_array else str(ids[0]))


#: Interpreters of scripts by their suffix, for :func:`_no_shebang_note`.
_INTERPRETERS = {".py": "python3", ".pl": "perl", ".rb": "ruby", ".jl": "julia", ".r": "Rscript"}


def _no_shebang_note(path: str, text: str) -> list[str]:
    """A trial's trap: ``ebb qsub train.py`` with no ``#!`` line ran the script under
    /bin/sh (as PBS does), and it failed with ``import: not found``."""
    interpreter = _INTERPRETERS.get(os.path.splitext(path)[1].lower())
    if interpreter is None or text.startswith("#!"):
        return []
    return [
        f"{path} has no #! line, so it runs under /bin/sh; start it with "
        f"#!/usr/bin/env {interpreter}, or submit `ebb qsub -- {interpreter} {path}`"
    ]


def _queue_line(script: tuple[str, str] | None) -> str | None:
    """Where ``script``'s directives name the queue (``SCRIPT line N``, the last such
    line: the one that counts), or None."""
    from ebbtide.queue.qsub.directives import directive_lines

    if script is None:
        return None
    lines = [
        n
        for n, prefix, tokens in directive_lines(script[1], source=script[0])
        if prefix in ("#PBS", "#EBB") and any(t.startswith("-q") for t in tokens)
    ]
    return f"{script[0]} line {lines[-1]}" if lines else None


def _submitted(spec: Any, notes: list[str], allow_future: bool) -> tuple[list[int], bool]:
    """Submit ``spec`` through the SDK's client; its ids and whether it is an array.
    What the client says about how the spec was taken is added to ``notes``."""
    client = _client(create=True)
    ids = client.submit_many(spec, allow_future=allow_future)
    notes.extend(client.last_notes)  # how it was taken here (through a server: its notes)
    return ids, spec.array is not None


def _say_submitted(
    command: str, ids: list[int], is_array: bool, notes: list[str], as_json: bool
) -> None:
    """With ``as_json`` the ids and the notes on stdout; else one line on stderr per
    note (a directive accepted without full effect, ...)."""
    if as_json:
        out: dict[str, Any] = {"id": ids[0]}
        if is_array:
            out["array"] = True
            out["tasks"] = list(ids)
        if notes:
            out["notes"] = notes
        _echo_json(out)
        return
    for note in notes:
        click.echo(f"ebb {command}: note: {note}", err=True)


#: What ``ebb sbatch`` passes its own parser for ``--``: click drops a ``--`` it meets,
#: and without it a script named ``-x.sh`` would be read as options.
_END_OF_OPTIONS = "--\0"


class _KeepsEndOfOptions(click.Command):
    """A command whose first ``--`` reaches its arguments (as :data:`_END_OF_OPTIONS`
    after it): click takes nothing after it for its own options, and drops it when it
    reads that far (:func:`_end_of_options` puts it back either way)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            args = [*args[: i + 1], _END_OF_OPTIONS, *args[i + 1 :]]
        return super().parse_args(ctx, args)


def _end_of_options(args: Sequence[str]) -> list[str]:
    """``ebb sbatch``'s words as given: the first ``--`` where it was, once (click drops
    it when it is still reading its options there, and passes it on when it is not)."""
    words = list(args)
    if _END_OF_OPTIONS in words:
        k = words.index(_END_OF_OPTIONS)
        if k > 0 and words[k - 1] == "--":
            del words[k - 1]
            k -= 1
        words[k] = "--"
    return words


@click.command(
    "sbatch",
    cls=_KeepsEndOfOptions,
    context_settings={
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
        "help_option_names": ["--help"],
    },
)
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ...} instead.')
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sbatch(args: Sequence[str], as_json: bool) -> None:
    """Submit a Slurm batch script: `ebb sbatch [OPTIONS] SCRIPT [ARGS]` or
    `ebb sbatch [OPTIONS] --wrap "CMD"`.

    #SBATCH lines at the top of SCRIPT and sbatch options before it are read as Slurm
    reads them (options win): -J/--job-name, --gres=gpu[:TYPE]:N, -G/--gpus,
    --gpus-per-node, -t/--time, -a/--array (1-10, 0-15:4, 1-100%5), -o/--output and
    -e/--error (%j %A %a %x %u %N; default slurm-%j.out in the job's directory, stderr
    with stdout), --signal=[B:]SIG[@SECS] (the eviction warning; B: to the script's shell
    alone; SECS its time to checkpoint, i.e. the eviction deadline), -d/--dependency
    (afterok, afternotok, afterany), -D/--chdir, -p/--partition (the queue, or an alias
    the policy gives it), -A/--account and -c/--cpus-per-task and --mem (recorded),
    --export (ALL by default, NONE, VAR[=value]), -H/--hold, --requeue. Options with no
    meaning here (--mail-type, --qos, --exclusive, ...) are accepted with a note on
    stderr; more than one node or task is refused, and so is a job no node could hold
    today unless --allow-future.

    Prints "Submitted batch job ID" (--parsable: the id alone). The job sees EBBTIDE_*
    variables and Slurm's: SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_SUBMIT_DIR,
    SLURM_SUBMIT_HOST, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID (and _MIN, _MAX, _STEP,
    _COUNT), SLURM_JOB_PARTITION, SLURM_JOB_NODELIST, SLURM_CPUS_PER_TASK,
    SLURM_RESTART_COUNT. A Slurm eviction is a warning signal, then the kill at the
    deadline: the job checkpoints and exits 99 (or ends) and is requeued.
    """
    from ebbtide.queue.qsub import load_script
    from ebbtide.queue.slurm import parse_sbatch_command_line

    words = _end_of_options(args)
    cli_opts, given, rest = parse_sbatch_command_line(words)
    if given & {"-h", "--help"}:  # sbatch's -h is its --help, after other options too
        click.echo(click.get_current_context().get_help())
        return
    allow_future = "--allow-future" in given  # ebbtide's own, among the options
    as_json = as_json or "--json" in given
    directives = None
    if cli_opts.command is not None:
        if rest:
            raise UserError(f"--wrap takes the command; unexpected {shown(rest[0])}")
    else:
        if not rest:
            raise UserError('sbatch needs a SCRIPT, or --wrap "CMD"')
        text, directives = load_script(rest[0], dialect="slurm")
        cli_opts.script = text
        cli_opts.args = rest[1:]
    from ebbtide.queue.qsub import build_spec_kwargs
    from ebbtide.queue.qsub.build import script_job_name
    from ebbtide.queue.spec import JobSpec

    notes: list[str] = []
    kwargs = build_spec_kwargs(cli_opts, directives, notes=notes)
    if cli_opts.command is None:
        kwargs.setdefault("name", script_job_name(rest[0]))
        kwargs["script_path"] = rest[0]
    spec = JobSpec(**kwargs)
    ids, is_array = _submitted(spec, notes, allow_future)
    if is_array:  # Slurm's array job id names every task; here an id names one job
        first = ids[0]
        notes.append(
            f"job {first} is the array's first task; {first}[] names all {len(ids)} "
            f"(ebb qstat -t {first}[], ebb qdel {first}[], as Slurm's {first} does)"
        )
    _say_submitted("sbatch", ids, is_array, notes, as_json)
    if not as_json:
        click.echo(str(ids[0]) if "--parsable" in given else f"Submitted batch job {ids[0]}")
