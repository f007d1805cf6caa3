"""From options to a :class:`~ebbtide.queue.spec.JobSpec`: the command line's over the
script's directives (:func:`build_spec_kwargs`), and ``ebb qsub``'s whole command line
(:func:`qsub_spec`), the same in the CLI and in the server's ``POST /qsub``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ebbtide import units
from ebbtide.errors import SpecError
from ebbtide.queue.qsub.directives import parse_script_directives
from ebbtide.queue.qsub.options import (
    _FLAGS,
    PBS_IGNORED,
    PBS_IGNORED_ATTRIBUTES,
    QsubOptions,
    _error,
    _note,
    _probe,
)
from ebbtide.queue.qsub.resources import check_resource, parse_resources, replaced
from ebbtide.queue.qsub.values import (
    _check_dependency_count,
    _int,
    export_env,
    parse_array,
    parse_depend,
    parse_env,
)
from ebbtide.queue.spec import JobSpec
from ebbtide.scriptfile import read_script

JOB_KINDS = ("training", "inference", "batch")


def _same_deadline(from_l: str | None, given: str, where: str | None, flag: str) -> None:
    """``-l deadline=`` and ``--deadline`` in the same place must agree: one of them
    would be dropped in silence (the command line still overrides the script's)."""
    if from_l is None:
        return
    if units.parse_duration_s(from_l) != units.parse_duration_s(given):
        raise _error(
            where,
            flag,
            f"gives the deadline as {given!r} and -l deadline= as {from_l!r}: give one of them",
        )


def _pick(cli: QsubOptions, directives: QsubOptions, name: str) -> tuple[Any, str | None]:
    """An option's value and where it came from: the command line's, else the script's."""
    value = getattr(cli, name)
    if value is not None:
        return value, cli.origin.get(name)
    return getattr(directives, name), directives.origin.get(name)


def build_spec_kwargs(
    cli: QsubOptions,
    directives: QsubOptions | None = None,
    environ: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Merge script directives under command-line options and convert to JobSpec kwargs.

    Directives accepted without effect add a line each to ``notes``, for the submitter.

    The command line wins field by field; ``-l`` resources merge key by key (the command
    line winning), and within one source ``--deadline`` wins over ``-l deadline``.
    ``-v`` and ``-W depend`` lists from the command line replace the script's.  Only
    options that were given appear in the result, so JobSpec's defaults apply to the rest.
    """
    directives = directives if directives is not None else QsubOptions()
    notes = [] if notes is None else notes
    notes.extend(directives.notes)
    notes.extend(cli.notes)
    kwargs: dict[str, Any] = {}
    compat = cli.compat or directives.compat or "pbs"

    def pick(name: str) -> tuple[Any, str | None]:
        return _pick(cli, directives, name)

    for name in ("name", "queue", "kind", "signal", "checkpoint_dir", "cwd", "image", "account"):
        value, where = pick(name)
        if value is None:
            continue
        if name == "kind" and value not in JOB_KINDS:
            raise _error(where, "--kind", f"expected one of {', '.join(JOB_KINDS)}, got {value!r}")
        if name == "signal":
            try:
                units.parse_warning_signal(value)
            except ValueError as exc:
                raise _error(where, "--signal", str(exc)) from None
        _probe({name: value}, where, _FLAGS[name])
        kwargs[name] = value
    for name in ("priority", "max_attempts"):
        value, where = pick(name)
        if value is not None:
            kwargs[name] = _int(name, value, where, _FLAGS[name])

    resources: dict[str, str] = {}
    for src in (directives, cli):
        # this source's -l resources (the command line's, or the script's)
        named: dict[str, str] = {}
        for i, text in enumerate(src.resources):
            where = src.origin.get(f"resources.{i}")
            parsed = parse_resources(text, where=where, notes=notes)
            for what, why in replaced(named, parsed):
                _note(notes, where, what, why)
            named.update(parsed)
        resources.update(named)
        if src.deadline is not None:
            where = src.origin.get("deadline")
            flag = src.origin.get("deadline.flag", "--deadline")
            check_resource("deadline", src.deadline, where, flag)
            _same_deadline(named.get("deadline"), src.deadline, where, flag)
            resources["deadline"] = src.deadline
    kwargs.update(resources)

    value, where = pick("array")
    if value is not None:
        kwargs["array"] = parse_array(value, where=where)

    src = cli if cli.depend else directives
    depends: list[dict[str, Any]] = []
    for i, text in enumerate(src.depend):
        where = src.origin.get(f"depend.{i}")
        attr = text.strip().partition("=")[0].strip()
        if attr in PBS_IGNORED_ATTRIBUTES:
            _note(notes, where, f"-W {text.strip()}", PBS_IGNORED_ATTRIBUTES[attr])
            continue
        for dep in parse_depend(text, where=where):
            if dep not in depends:
                depends.append(dep)
                _check_dependency_count(len(depends), where)
    if depends:
        kwargs["depends"] = depends

    export, where = pick("export")
    if export is None and compat == "slurm":
        export = "ALL"  # Slurm's default: the job starts with the submitter's environment
    env: dict[str, str] = export_env(export, environ, where=where) if export else {}
    src = cli if cli.env else directives
    for i, text in enumerate(src.env):
        env.update(parse_env(text, environ, where=src.origin.get(f"env.{i}")))
    if env:
        kwargs["env"] = env

    if cli.hold or directives.hold:
        kwargs["hold"] = True
    pause = cli.pause if cli.pause is not None else directives.pause
    if pause is not None:
        kwargs["pause"] = pause
    kwargs.update(_outputs(cli, directives, compat, array="array" in kwargs, notes=notes))
    shell_only = (cli if cli.signal is not None else directives).signal_shell_only
    if shell_only:
        kwargs["signal_shell_only"] = True
    if compat != "pbs":
        kwargs["compat"] = compat
    if cli.script is not None:
        kwargs["script"] = _with_shell(cli.script, *pick("shell"), notes)
    if cli.command is not None:
        kwargs["command"] = cli.command
    if cli.args:
        kwargs["args"] = cli.args
    return kwargs


def _outputs(
    cli: QsubOptions, directives: QsubOptions, compat: str, *, array: bool, notes: list[str]
) -> dict[str, str]:
    """Where stdout and stderr go: ``-o``/``-e``/``-j`` (PBS), ``--output``/``--error``
    (Slurm, ``slurm-%j.out`` by default, stderr with stdout unless ``--error``)."""
    stdout, out_where = _pick(cli, directives, "stdout")
    stderr, err_where = _pick(cli, directives, "stderr")
    join, join_where = _pick(cli, directives, "join")
    result: dict[str, str] = {}
    if compat == "slurm":
        stdout = stdout or ("slurm-%A_%a.out" if array else "slurm-%j.out")
        stderr = stderr or stdout
    else:
        stdout = _pbs_path(stdout, "o", out_where, notes)
        stderr = _pbs_path(stderr, "e", err_where, notes)
        join = None if join is None else join.strip().lower()
        if join not in (None, "oe", "eo", "n"):
            raise _error(
                join_where, "-j", f"expected oe (stderr into stdout), eo or n, got {join!r}"
            )
        if join in ("oe", "eo"):
            # as PBS does: the stream joined goes where the other goes, its own path unused
            oe = join == "oe"
            into, unused = (stdout, stderr) if oe else (stderr, stdout)
            if unused is not None and unused != into:
                _note(
                    notes,
                    err_where if oe else out_where,
                    f"{'-e' if oe else '-o'} {unused}",
                    f"not used: -j {join} sends {'stderr' if oe else 'stdout'} with "
                    f"{'stdout' if oe else 'stderr'}, "
                    + (f"to {into}" if into else "to the attempt's log (ebb logs ID)"),
                )
            stdout = stderr = into
            result["join"] = join
    for field_name, value, where, flag in (
        ("stdout", stdout, out_where, "-o"),
        ("stderr", stderr, err_where, "-e"),
    ):
        if value is not None:
            _probe({field_name: value}, where, flag)
            result[field_name] = value
    return result


def _pbs_path(value: str | None, letter: str, where: str | None, notes: list[str]) -> str | None:
    """A PBS ``-o``/``-e`` path: ``[host:]path``; a directory gets PBS's file name in it
    (``NAME.oID``)."""
    if value is None:
        return None
    host, sep, path = value.partition(":")
    if sep and path and "/" not in host:
        value = path
        _note(notes, where, f"-{letter} {host}:", "written on the node that runs the job")
    if value.endswith("/") or os.path.isdir(os.path.expanduser(value)):
        value = os.path.join(value, f"%x.{letter}%j")
    return value


def _with_shell(script: str, shell: str | None, where: str | None, notes: list[str]) -> str:
    """PBS ``-S SHELL``: the interpreter of a script with no ``#!`` line."""
    if shell is None:
        return script
    if not shell.startswith("/") or any(ch.isspace() for ch in shell):
        raise _error(where, "-S", f"expected an absolute path like /bin/bash, got {shell!r}")
    if script.startswith("#!"):
        first = script.split("\n", 1)[0][2:].strip()
        if first.split()[:1] != [shell]:
            _note(notes, where, f"-S {shell}", f"the script's own #! line ({first}) is used")
        return script
    return f"#!{shell}\n{script}"


# -- the qsub command line, wherever it is turned into a spec ---------------------------

#: ``ebb qsub``'s options (their click names) that hold one string, or None.
QSUB_TEXT_OPTIONS = (
    "name",
    "queue",
    "priority",
    "array",
    "kind",
    "deadline",
    "signal",
    "checkpoint_dir",
    "cwd",
    "max_attempts",
    "image",
    "stdout",
    "stderr",
    "join",
    "account",
    "shell",
    "mail",
    "mail_to",
    "rerun",
)
#: ... a list of strings (a repeated flag).
QSUB_LIST_OPTIONS = ("resources", "depend", "env")
#: ... True or False (``pause``: or None, the queue's default).
QSUB_FLAG_OPTIONS = ("hold", "export_all", "pause")


def _checked_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """``opts`` with each value of the type its option has; a :class:`SpecError` for
    anything else (a thin client's request is not trusted to be well formed)."""
    known = {*QSUB_TEXT_OPTIONS, *QSUB_LIST_OPTIONS, *QSUB_FLAG_OPTIONS}
    for key in opts:
        if key not in known:
            raise SpecError("options", f"{units.shown(key, 40)} is not an option of qsub")
    checked: dict[str, Any] = {}
    for key in QSUB_TEXT_OPTIONS:
        value = opts.get(key)
        if value is not None and not isinstance(value, str):
            raise SpecError("options", f"{key}: expected text, got {type(value).__name__}")
        checked[key] = value
    for key in QSUB_LIST_OPTIONS:
        value = opts.get(key) or []
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise SpecError("options", f"{key}: expected a list of text")
        checked[key] = list(value)
    for key in QSUB_FLAG_OPTIONS:
        value = opts.get(key, None if key == "pause" else False)
        if not (isinstance(value, bool) or (key == "pause" and value is None)):
            raise SpecError("options", f"{key}: expected true or false")
        checked[key] = value
    return checked


def qsub_command_line(opts: Mapping[str, Any]) -> QsubOptions:
    """The command line's :class:`QsubOptions` from ``ebb qsub``'s option values, by their
    click names (``signal`` for ``--signal``, ``export_all`` for ``-V``); ``-m``, ``-M``
    and ``-r`` become notes, as the same directives in a script do."""
    o = _checked_options(opts)
    cli = QsubOptions(
        name=o["name"],
        queue=o["queue"],
        priority=o["priority"],
        resources=o["resources"],
        array=o["array"],
        depend=o["depend"],
        hold=o["hold"],
        pause=o["pause"],
        env=o["env"],
        kind=o["kind"],
        deadline=o["deadline"],
        signal=o["signal"],
        checkpoint_dir=o["checkpoint_dir"],
        cwd=o["cwd"],
        max_attempts=o["max_attempts"],
        image=o["image"],
        stdout=o["stdout"],
        stderr=o["stderr"],
        join=o["join"],
        account=o["account"],
        export="ALL" if o["export_all"] else None,
        shell=o["shell"],
    )
    for flag, key in (("-m", "mail"), ("-M", "mail_to"), ("-r", "rerun")):
        if o[key] is not None:
            why = PBS_IGNORED[flag][1]  # as a directive line would be told
            cli.notes.append(f"{flag} {o[key]}: accepted, without effect: {why}")
    return cli


def qsub_spec(
    opts: Mapping[str, Any],
    args: list[str],
    *,
    script: tuple[str, str] | None,
    environ: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> JobSpec:
    """The job ``ebb qsub`` submits: its options (as :func:`qsub_command_line` takes
    them), then either ``script`` (its name and text) with ``args`` for it, or, with no
    script, ``args`` as the command (``ebb qsub -- CMD ARGS``).  ``environ`` is the
    submitting environment (``-V``, a bare ``-v VAR``); notes for the submitter are
    added to ``notes``.  The same here, in the CLI, and in ``ebb server`` for a thin
    client that sent its command line."""
    cli = qsub_command_line(opts)
    directives = None
    if script is None:
        cli.command = list(args)
    else:
        name, text = script
        if not text.strip():
            raise SpecError("SCRIPT", f"{name!r} is empty")
        directives = parse_script_directives(text, source=name, dialect="pbs")
        cli.script = text
        cli.args = list(args)
    kwargs = build_spec_kwargs(cli, directives, environ=environ, notes=notes)
    if script is not None:
        kwargs.setdefault("name", script_job_name(script[0]))
        kwargs["script_path"] = script[0]
    return JobSpec(**kwargs)


def script_spec(
    path: str | os.PathLike[str], args: Sequence[str] = (), *, notes: list[str] | None = None
) -> JobSpec:
    """The job ``ebb qsub PATH ARGS...`` submits with no option on its command line: the
    script at ``path``, read as qsub reads it (:func:`~ebbtide.scriptfile.read_script`),
    its directive lines and ``args`` (:meth:`JobSpec.from_script` for the SDK)."""
    name = os.fspath(path)
    return qsub_spec({}, [str(a) for a in args], script=(name, read_script(name)), notes=notes)


def script_job_name(path: str) -> str:
    """A script job's name when it names none (``-N``, ``--job-name``): the script file's
    base name, as PBS and Slurm name it (``train.sh``), in the letters a name may hold."""
    base = re.sub(r"[^A-Za-z0-9_.\-]", "_", path.rstrip("/").rsplit("/", 1)[-1])[:128]
    return base if base.strip(".") else "script"
