"""Properties of ``qsub`` input: ``-l`` resource lists, option values from the command
line, ``#PBS``/``#EBB`` directive lines, and the click command itself.  Each input is a
:class:`SpecError` (or a click usage error) or a job within bounds, never another
exception."""

from __future__ import annotations

import shlex
from typing import Any
from unittest import mock

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.cli import qsub_cmd
from ebbtide.cli.main import cli
from ebbtide.errors import SpecError
from ebbtide.queue.qsub import (
    KNOWN_RESOURCES,
    QsubOptions,
    build_spec_kwargs,
    parse_resources,
    parse_script_directives,
)
from ebbtide.queue.spec import JobSpec
from tests.unit.fuzz_support import (
    GOOD,
    NUMBER_TEXT,
    QUANTITY_TEXT,
    assert_spec_in_bounds,
    fuzz,
    mostly,
)

ENVIRON = {"HOME": "/home/me", "EMPTY": ""}

GOOD_RESOURCE = {
    "gpu": GOOD["gpu"],
    "ngpus": st.sampled_from(["1", "2", "64"]),
    "gpumem": GOOD["gpumem"],
    "walltime": GOOD["duration"],
    "deadline": GOOD["deadline"],
    "checkpoint_interval": GOOD["duration"],
    "gpus": st.sampled_from(["1", "2", "64"]),
    "ncpus": st.sampled_from(["1", "8", "4096"]),
    "mem": GOOD["gpumem"],
    "select": st.sampled_from(["1:ngpus=1", "1:ncpus=8:ngpus=2:mem=32gb", "2:ngpus=1"]),
    "nodes": st.sampled_from(["1:ppn=4:gpus=1", "1", "node01:ppn=2", "4"]),
}
RESOURCE = mostly(
    st.sampled_from(KNOWN_RESOURCES).flatmap(
        lambda key: mostly(GOOD_RESOURCE[key], st.one_of(NUMBER_TEXT, QUANTITY_TEXT)).map(
            lambda value: f"{key}={value}"
        )
    ),
    st.builds(
        lambda key, sep, value: f"{key}{sep}{value}",
        st.sampled_from([*KNOWN_RESOURCES, "GPU", "mem", "", " gpu "]),
        st.sampled_from(["=", "", "=="]),
        st.one_of(NUMBER_TEXT, QUANTITY_TEXT),
    ),
)
RESOURCES = st.lists(RESOURCE, min_size=1, max_size=3).map(",".join)
ARRAY_BAD = st.one_of(
    st.builds(
        lambda a, b, step, limit: (
            f"{a}{'-' + b if b else ''}{':' + step if step else ''}{'%' + limit if limit else ''}"
        ),
        NUMBER_TEXT,
        st.one_of(st.none(), NUMBER_TEXT),
        st.one_of(st.none(), NUMBER_TEXT),
        st.one_of(st.none(), NUMBER_TEXT),
    ),
    st.text(max_size=12),
)
ARRAY = mostly(GOOD["array"], ARRAY_BAD)
DEPEND_BAD = st.builds(
    lambda attr, kind, ids: f"{attr}={kind}:{':'.join(ids)}",
    st.sampled_from(["depend", "depend", "umask"]),
    st.sampled_from(["afterok", "afternotok", "afterany", "before"]),
    st.lists(st.one_of(NUMBER_TEXT, st.sampled_from(["12.server", "3[]", "x"])), max_size=3),
)
DEPEND = mostly(GOOD["depend"], DEPEND_BAD)
ENV_BAD = st.one_of(
    st.builds(
        lambda name, value: f"{name}={value}",
        st.sampled_from(["A", "A B", "1A", "", "A\0", "_x", "HOME"]),
        st.text(max_size=10),
    ),
    st.sampled_from(["HOME", "NOPE", "EMPTY", "A='x,y'", "A='x", "A=1,B"]),
    st.text(max_size=12),
)
ENV = mostly(GOOD["env"], ENV_BAD)
SIGNAL = mostly(
    GOOD["signal"],
    st.one_of(
        st.sampled_from(["KILL", "STOP", "9", "19", "0", "SEGV", "CHLD", "TSTP"]),
        NUMBER_TEXT,
        st.text(max_size=6),
    ),
)
WORDS = st.one_of(st.text(max_size=16), NUMBER_TEXT)

#: Option values by ``QsubOptions`` field.
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "name": mostly(GOOD["name"], WORDS),
    "queue": mostly(st.just("default"), WORDS),
    "priority": mostly(GOOD["int"], NUMBER_TEXT),
    "array": ARRAY,
    "kind": st.sampled_from(["training", "inference", "batch", "nap", ""]),
    "deadline": mostly(GOOD["deadline"], QUANTITY_TEXT),
    "signal": SIGNAL,
    "checkpoint_dir": mostly(GOOD["path"], WORDS),
    "cwd": mostly(GOOD["path"], WORDS),
    "max_attempts": mostly(st.sampled_from(["1", "3", "100"]), NUMBER_TEXT),
}
LISTS: dict[str, st.SearchStrategy[Any]] = {"resources": RESOURCES, "depend": DEPEND, "env": ENV}


def _check(cli_opts: QsubOptions, directives: QsubOptions | None = None) -> None:
    """The property: a SpecError, or kwargs that JobSpec turns into a sane job."""
    try:
        kwargs = build_spec_kwargs(cli_opts, directives, ENVIRON)
        spec = JobSpec(**kwargs)
    except SpecError as exc:
        assert str(exc) and "\n" not in exc.reason
        return
    assert_spec_in_bounds(spec)


@fuzz(500)
@given(st.one_of(RESOURCES, st.text(max_size=30)))
def test_resource_lists(text: str) -> None:
    try:
        kwargs = parse_resources(text)
    except SpecError as exc:
        assert str(exc).startswith("-l")
        return
    assert_spec_in_bounds(JobSpec(command=["true"], **kwargs))


@st.composite
def options(draw: st.DrawFn) -> QsubOptions:
    opts = QsubOptions(command=["true"], hold=draw(st.booleans()))
    for name in draw(st.lists(st.sampled_from([*VALUES, *LISTS]), max_size=5, unique=True)):
        if name in LISTS:
            setattr(opts, name, draw(st.lists(LISTS[name], min_size=1, max_size=2)))
        else:
            setattr(opts, name, draw(VALUES[name]))
    return opts


@fuzz(500)
@given(options())
def test_command_line_options(opts: QsubOptions) -> None:
    _check(opts)


def _values(name: str) -> st.SearchStrategy[str]:
    return LISTS[name] if name in LISTS else VALUES[name]


FLAGS = {
    "name": "-N",
    "queue": "-q",
    "priority": "-p",
    "resources": "-l",
    "array": "-J",
    "depend": "-W",
    "env": "-v",
    "cwd": "-d",
    "kind": "--kind",
    "deadline": "--deadline",
    "signal": "--signal",
    "checkpoint_dir": "--checkpoint-dir",
    "max_attempts": "--max-attempts",
}


@st.composite
def directive_line(draw: st.DrawFn) -> str:
    """One ``#PBS``/``#EBB`` line: options with values, sometimes mangled."""
    prefix = draw(st.sampled_from(["#PBS", "#EBB", "#PBS", "#PBSX", "  #EBB"]))
    tokens: list[str] = []
    for name in draw(st.lists(st.sampled_from(sorted(FLAGS)), min_size=1, max_size=3)):
        value = draw(_values(name))
        form = draw(st.sampled_from(["split", "split", "joined", "bare"]))
        flag = FLAGS[name]
        if form == "joined" and flag.startswith("--"):
            tokens.append(shlex.quote(f"{flag}={value}"))
        elif form == "joined":
            tokens.append(shlex.quote(f"{flag}{value}"))
        elif form == "bare":
            tokens.append(flag)
        else:
            tokens += [flag, shlex.quote(value)]
    if draw(st.booleans()):
        tokens.append(draw(st.sampled_from(["-h", "-X", "stray", "# comment", "'", '"', "\\"])))
    return f"{prefix} {' '.join(tokens)}"


@st.composite
def scripts(draw: st.DrawFn) -> str:
    lines = ["#!/bin/sh"] if draw(st.booleans()) else []
    lines += draw(
        st.lists(
            st.one_of(
                directive_line(), st.sampled_from(["", "# note", "\t"]), st.text(max_size=20)
            ),
            max_size=5,
        )
    )
    lines.append("python train.py")
    return draw(st.sampled_from(["\n", "\r\n"])).join(lines) + "\n"


@fuzz(500)
@given(scripts(), st.one_of(st.none(), options()))
def test_script_directives(text: str, cli_opts: QsubOptions | None) -> None:
    try:
        directives = parse_script_directives(text, source="job.sh")
    except SpecError as exc:
        assert str(exc).startswith("job.sh line ")
        return
    opts = cli_opts or QsubOptions()
    opts.command, opts.script = None, text
    _check(opts, directives)


class _Recorder:
    """Stands in for the SDK client: records what ``qsub`` would submit."""

    def __init__(self) -> None:
        self.specs: list[JobSpec] = []
        self.last_notes: list[str] = []

    def submit_many(self, spec: JobSpec, *, allow_future: bool = False) -> list[int]:
        self.specs.append(spec)
        return [1]


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    out: list[str] = []
    for name in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4)):
        out += [FLAGS[name], draw(_values(name))]
    if draw(st.booleans()):
        out.append(draw(st.sampled_from(["-h", "--json", "-Z", "--bogus", "-p"])))
    return [*out, "--", "true"]


@fuzz(200)
@given(argv())
def test_qsub_command(args: list[str]) -> None:
    recorder = _Recorder()
    with mock.patch.object(qsub_cmd, "_client", lambda **_: recorder):
        result = CliRunner().invoke(cli, ["qsub", *args])
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        [spec] = recorder.specs
        assert_spec_in_bounds(spec)
    else:
        assert not recorder.specs
