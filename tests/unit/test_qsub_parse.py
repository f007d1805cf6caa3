"""Table-driven tests for the qsub option parsers (``ebbtide.queue.qsub``)."""

from __future__ import annotations

import re
import signal

import pytest

from ebbtide.errors import SpecError
from ebbtide.queue.qsub import (
    QsubOptions,
    build_spec_kwargs,
    load_script,
    parse_array,
    parse_depend,
    parse_directive_tokens,
    parse_directives,
    parse_env,
    parse_resources,
    parse_script_directives,
    qsub_spec,
)
from ebbtide.queue.spec import JobSpec

# ---------------------------------------------------------------- -l resources


@pytest.mark.parametrize(
    ("text", "kwargs", "compute_pct", "gpus"),
    [
        ("gpu=0.25", {"gpu": "0.25"}, 25.0, 0),
        ("gpu=25%", {"gpu": "25%"}, 25.0, 0),
        ("gpu=1", {"gpu": "1"}, 100.0, 1),
        ("gpu=2", {"gpu": "2"}, 100.0, 2),
        ("ngpus=2", {"gpu": "2"}, 100.0, 2),
        ("gpu=100%", {"gpu": "100%"}, 100.0, 1),
        (" gpu = 50% , ", {"gpu": "50%"}, 50.0, 0),
        ("GPU=50%", {"gpu": "50%"}, 50.0, 0),
        ("gpu=25%,ngpus=1", {"gpu": "1"}, 100.0, 1),
    ],
)
def test_resources_gpu(text: str, kwargs: dict, compute_pct: float, gpus: int) -> None:
    assert parse_resources(text) == kwargs
    spec = JobSpec(command=["true"], **kwargs)
    assert (spec.compute_pct, spec.gpus) == (compute_pct, gpus)


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("gpumem=4GiB", "memory_mib", 4096),
        ("gpumem=512MiB", "memory_mib", 512),
        ("walltime=02:00:00", "walltime_s", 7200.0),
        ("walltime=30:00", "walltime_s", 1800.0),
        ("walltime=90m", "walltime_s", 5400.0),
        ("deadline=30s", "deadline_s", 30.0),
        ("checkpoint_interval=10m", "checkpoint_interval_s", 600.0),
    ],
)
def test_resources_sizes_and_durations(text: str, field: str, value: float) -> None:
    spec = JobSpec(command=["true"], **parse_resources(text))
    assert getattr(spec, field) == value


def test_resources_several_keys() -> None:
    assert parse_resources("gpu=25%,gpumem=4GiB,walltime=02:00:00") == {
        "gpu": "25%",
        "gpumem": "4GiB",
        "walltime": "02:00:00",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gpumen=1GiB",
            "-l: unknown resource 'gpumen'; did you mean 'gpumem'? known: gpu, gpumem, "
            "walltime, deadline, checkpoint_interval, ngpus, gpus, ncpus, mem, select, nodes",
        ),
        ("Foo-bar=1", "-l: unknown resource 'foo-bar'"),
        ("mem=lots", "-l mem: expected a size"),
        ("ncpus=0", "-l ncpus: expected a whole number of CPUs from 1 to 4096"),
        ("select=2:ngpus=1", "-l select: asks for 2 chunks; a job runs on one node"),
        ("select=1:ngpus=1+1:ncpus=2", "-l select: '1:ngpus=1+1:ncpus=2' asks for several"),
        ("nodes=4:ppn=8", "-l nodes: asks for 4 nodes"),
        ("select=1:ngpus=lots", "-l ngpus: expected a whole number of GPUs"),
        ("gpu", "-l: expected KEY=VALUE, got 'gpu'"),
        ("gpu=lots", "-l gpu: expected a share of one GPU"),
        ("gpu=1.5", "-l gpu: more than one GPU must be a whole number"),
        ("gpu=150%", "-l gpu: a percentage must be in (0, 100]"),
        ("gpu=0", "-l gpu: must be positive"),
        ("gpumem=4XB", "-l gpumem: unknown unit 'xb'"),
        ("gpumem=0", "-l gpumem: must be more than zero"),
        ("walltime=0", "-l walltime: must be more than zero"),
        ("walltime=2 hours", "-l walltime: expected a duration"),
        ("walltime=1:2:3:4:5", "-l walltime: expected a duration"),
        ("deadline=2h", "-l deadline: must be at most 3600s (1h)"),
        ("ngpus=0.5", "-l ngpus: expected a whole number of GPUs"),
    ],
)
def test_resources_bad(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_resources(text)
    assert str(info.value).startswith(message)


def test_resources_error_names_script_line() -> None:
    with pytest.raises(SpecError, match=r"^job\.sh line 3: -l gpumem: "):
        parse_resources("gpumem=lots", where="job.sh line 3")


# ---------------------------------------------------------------- -J arrays


@pytest.mark.parametrize(
    ("text", "kwargs", "indices"),
    [
        ("1-100", {"start": 1, "end": 100}, range(1, 101)),
        ("1-100:2", {"start": 1, "end": 100, "step": 2}, range(1, 101, 2)),
        ("1-100%4", {"start": 1, "end": 100, "limit": 4}, range(1, 101)),
        ("1-100:2%4", {"start": 1, "end": 100, "step": 2, "limit": 4}, range(1, 101, 2)),
        ("0-9", {"start": 0, "end": 9}, range(10)),
        ("5", {"start": 5, "end": 5}, range(5, 6)),
        (" 3-3 ", {"start": 3, "end": 3}, range(3, 4)),
    ],
)
def test_array(text: str, kwargs: dict, indices: range) -> None:
    assert parse_array(text) == kwargs
    spec = JobSpec(command=["true"], array=kwargs)
    assert spec.array is not None
    assert spec.array.indices() == indices
    assert spec.array.limit == kwargs.get("limit")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5-1", "-J: the range ends (1) before it starts (5)"),
        ("1-x", "-J: expected a range like 1-100"),
        ("1-10%0", "-J: the %limit (tasks at once) must be at least 1"),
        ("1-10:0", "-J: the :step must be at least 1"),
        ("", "-J: expected a range"),
        ("-1-5", "-J: expected a range"),
        ("1-10%", "-J: expected a range"),
        ("1-200000", "-J: an array may have at most 100000 tasks"),
    ],
)
def test_array_bad(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_array(text)
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------- -W depend=


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("depend=afterok:12", [("afterok", 12)]),
        ("depend=afterok:12:13", [("afterok", 12), ("afterok", 13)]),
        (
            "depend=afterok:12:13,afterany:14",
            [("afterok", 12), ("afterok", 13), ("afterany", 14)],
        ),
        ("depend=afternotok:7", [("afternotok", 7)]),
        ("depend=afterok:12.server", [("afterok", 12)]),
        ("depend=afterok:12[]", [("afterok", 12, True)]),
        ("depend=afterok:12[].head.example.org", [("afterok", 12, True)]),
        ("depend=afterok:12[]:12", [("afterok", 12, True), ("afterok", 12)]),
        ("depend=afterok:12:12", [("afterok", 12)]),
        ("depend=afterok:12[3]", [("afterok", 12, 3)]),
        ("depend=afterok:12[0].server:12[3]:12[3]", [("afterok", 12, 0), ("afterok", 12, 3)]),
        ("depend=afterok:12[3]:12[]", [("afterok", 12, 3), ("afterok", 12, True)]),
    ],
)
def test_depend(text: str, expected: list[tuple[object, ...]]) -> None:
    """(kind, id) of each dependency, and True after them for a whole array (``12[]``),
    the index for one of its tasks (``12[3]``)."""

    def brackets(array: bool, task: int | None) -> list[object]:
        return [True] if array else ([] if task is None else [task])

    deps = parse_depend(text)
    assert [
        (d["kind"], d["job_id"], *brackets(d.get("array", False), d.get("task"))) for d in deps
    ] == expected
    spec = JobSpec(command=["true"], depends=deps)
    assert [(d.kind, d.job_id, *brackets(d.array, d.task)) for d in spec.depends] == expected
    if "." not in text:  # the SDK's text form (no server suffix) reads them alike
        sdk = JobSpec(command=["true"], depends=text.removeprefix("depend=").split(","))
        assert set(sdk.depends) == set(spec.depends)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("depend=before:12", "-W: unknown dependency type 'before'; known: afterok"),
        ("depend=afterok", "-W: afterok needs at least one job id"),
        (
            "depend=afterok:x",
            "-W: expected a job id like 12, 12.server, 12[] (the whole array) or 12[3] (its "
            "task 3), got 'x'",
        ),
        ("depend=afterok:0", "-W: expected a job id"),
        ("depend=afterok:12[x]", "-W: expected a job id"),
        ("depend=afterok:12[3", "-W: expected a job id"),
        ("depend=afterok:12[99999999999]", "-W: array indices go up to 2147483647"),
        ("umask=022", "-W: only depend=TYPE:ID"),
        ("afterok:12", "-W: only depend=TYPE:ID"),
    ],
)
def test_depend_bad(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_depend(text)
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------- -v env


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1", {"A": "1"}),
        ("A=1,B=two", {"A": "1", "B": "two"}),
        ("HOME", {"HOME": "/home/me"}),
        ("A=1,HOME", {"A": "1", "HOME": "/home/me"}),
        ("EMPTY=", {"EMPTY": ""}),
        ("A=x=y", {"A": "x=y"}),
        ("A='x,y',B=2", {"A": "x,y", "B": "2"}),
        ('A="x y"', {"A": "x y"}),
        ("A=1,", {"A": "1"}),
    ],
)
def test_env(text: str, expected: dict[str, str]) -> None:
    assert parse_env(text, {"HOME": "/home/me"}) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NOPE", "-v: NOPE is not set in the submitting environment"),
        ("1A=2", "-v: expected VAR=value or VAR"),
        ("=2", "-v: expected VAR=value or VAR"),
        ("A='x", "-v: unclosed ' quote"),
    ],
)
def test_env_bad(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_env(text, {})
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------- directives

SCRIPT = """\
#!/bin/bash
# a plain comment
#PBS -N train -q gpu

#EBB -l gpu=25%,gpumem=4GiB
# another comment
#PBS -J 1-10%2   # trailing comment
#PBSX -N ignored
python train.py
#PBS -N too-late
"""


def test_directives_scanning() -> None:
    assert parse_directives(SCRIPT) == [
        (3, ["-N", "train", "-q", "gpu"]),
        (5, ["-l", "gpu=25%,gpumem=4GiB"]),
        (7, ["-J", "1-10%2"]),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("python x.py\n#PBS -N x\n", []),
        ("#PBS -N a\n#PBS -N b\n", [(1, ["-N", "a"]), (2, ["-N", "b"])]),
        ("\n\n#EBB -h\n", [(3, ["-h"])]),
        ("#!/bin/sh\n#!/bin/sh\n#PBS -h\n", [(3, ["-h"])]),
        ("#PBS\n#PBS -h\n", [(2, ["-h"])]),
        ("#PBS -v 'MSG=a b'\n", [(1, ["-v", "MSG=a b"])]),
        ("#PBS -v MSG=a#b\n", [(1, ["-v", "MSG=a#b"])]),
        ("#PBS -v 'MSG=a #b' # note\n", [(1, ["-v", "MSG=a #b"])]),
        ("  #PBS -N indented\n", [(1, ["-N", "indented"])]),
        ("#!/bin/sh\r\n#PBS -N crlf\r\necho hi\r\n", [(2, ["-N", "crlf"])]),
    ],
)
def test_directives_cases(text: str, expected: list) -> None:
    assert parse_directives(text) == expected


def test_directives_bad_quote_names_line() -> None:
    with pytest.raises(SpecError, match=r"^job\.sh line 2: cannot split"):
        parse_directives("#!/bin/sh\n#PBS -N 'oops\n", source="job.sh")


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["-N", "train", "-q", "gpu"], QsubOptions(name="train", queue="gpu")),
        (["-Ntrain"], QsubOptions(name="train")),
        (["-p", "5", "-h"], QsubOptions(priority="5", hold=True)),
        (["-l", "gpu=1", "-l", "walltime=1h"], QsubOptions(resources=["gpu=1", "walltime=1h"])),
        (
            ["-J", "1-4", "-W", "depend=afterok:3"],
            QsubOptions(array="1-4", depend=["depend=afterok:3"]),
        ),
        (["-v", "A=1", "-d", "/tmp"], QsubOptions(env=["A=1"], cwd="/tmp")),
        (["--kind", "training", "--deadline=10s"], QsubOptions(kind="training", deadline="10s")),
        (["--signal", "USR1"], QsubOptions(signal="USR1")),
        (
            ["--checkpoint-dir", "/ck", "--max-attempts", "3"],
            QsubOptions(checkpoint_dir="/ck", max_attempts="3"),
        ),
        (["--cwd", "/w"], QsubOptions(cwd="/w")),
    ],
)
def test_directive_tokens(tokens: list[str], expected: QsubOptions) -> None:
    opts = parse_directive_tokens(tokens, "job.sh line 4")
    opts.origin = {}
    assert opts == expected


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["-X"], "job.sh line 4: unknown directive option -X"),
        (["-Y", "out.log"], "job.sh line 4: unknown directive option -Y"),
        (["--bogus=1"], "job.sh line 4: unknown directive option --bogus"),
        (["-N"], "job.sh line 4: -N needs a value"),
        (["-hx"], "job.sh line 4: -h takes no value"),
        (["train"], "job.sh line 4: unexpected argument 'train'"),
    ],
)
def test_directive_tokens_bad(tokens: list[str], message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_directive_tokens(tokens, "job.sh line 4")
    assert str(info.value).startswith(message)


def test_script_directives_accumulate() -> None:
    opts = parse_script_directives(
        "#PBS -N a -l gpu=1\n#PBS -N b -l gpumem=2GiB -v X=1\n#PBS -v Y=2\n", source="j.sh"
    )
    assert opts.name == "b"
    assert opts.resources == ["gpu=1", "gpumem=2GiB"]
    assert opts.env == ["X=1", "Y=2"]
    assert opts.origin == {
        "name": "j.sh line 2",
        "resources.0": "j.sh line 1",
        "resources.1": "j.sh line 2",
        "env.0": "j.sh line 2",
        "env.1": "j.sh line 3",
    }


# ---------------------------------------------------------------- merging and JobSpec


def _directives(text: str, source: str = "train.sh") -> QsubOptions:
    return parse_script_directives(text, source=source)


def test_build_full_spec() -> None:
    script = (
        "#!/bin/bash\n"
        "#PBS -N train -q gpu -p 10\n"
        "#PBS -l gpu=25%,gpumem=4GiB,walltime=02:00:00\n"
        "#PBS -J 1-100:2%4\n"
        "#PBS -W depend=afterok:12.server:13,afterany:14[]\n"
        "#EBB --kind training --deadline 45s --signal USR1 -h\n"
        "#EBB -v DATA=/data,HOME --checkpoint-dir /ck --max-attempts 3 -d /work\n"
        "python train.py\n"
    )
    cli = QsubOptions(script=script, args=["--epochs", "3"])
    kwargs = build_spec_kwargs(cli, _directives(script), {"HOME": "/home/me"})
    spec = JobSpec(**kwargs)
    assert spec.name == "train"
    assert spec.queue == "gpu"
    assert spec.priority == 10
    assert (spec.compute_pct, spec.gpus, spec.memory_mib) == (25.0, 0, 4096)
    assert spec.walltime_s == 7200.0
    assert spec.deadline_s == 45.0
    assert spec.signal == int(signal.SIGUSR1)
    assert spec.kind == "training"
    assert spec.hold is True
    assert spec.env == {"DATA": "/data", "HOME": "/home/me"}
    assert spec.checkpoint_dir == "/ck"
    assert spec.max_attempts == 3
    assert spec.cwd == "/work"
    assert spec.array is not None
    assert (spec.array.start, spec.array.end, spec.array.step, spec.array.limit) == (1, 100, 2, 4)
    assert [(d.kind, d.job_id) for d in spec.depends] == [
        ("afterok", 12),
        ("afterok", 13),
        ("afterany", 14),
    ]
    assert spec.script == script
    assert spec.args == ["--epochs", "3"]


def test_build_command_only_defaults() -> None:
    kwargs = build_spec_kwargs(QsubOptions(command=["python", "x.py"]), None, {})
    assert kwargs == {"command": ["python", "x.py"]}
    spec = JobSpec(**kwargs)
    assert (spec.compute_pct, spec.gpus, spec.memory_mib, spec.array) == (10.0, 0, 1024, None)


@pytest.mark.parametrize(
    ("directive", "cli", "expected"),
    [
        # scalar fields: the command line wins
        ("#PBS -N fromscript", QsubOptions(name="fromcli"), {"name": "fromcli"}),
        ("#PBS -N fromscript", QsubOptions(), {"name": "fromscript"}),
        ("#PBS -q gpu -p 5", QsubOptions(priority="7"), {"queue": "gpu", "priority": 7}),
        ("#PBS -J 1-10", QsubOptions(array="1-3%1"), {"array": {"start": 1, "end": 3, "limit": 1}}),
        ("#EBB --signal USR1", QsubOptions(signal="INT"), {"signal": "INT"}),
        # -l merges key by key, the command line winning
        (
            "#PBS -l gpu=25%,gpumem=4GiB",
            QsubOptions(resources=["gpu=50%", "walltime=1h"]),
            {"gpu": "50%", "gpumem": "4GiB", "walltime": "1h"},
        ),
        ("#PBS -l ngpus=2", QsubOptions(resources=["gpu=25%"]), {"gpu": "25%"}),
        # --deadline and -l deadline agree within a source; the command line beats the script
        ("#EBB --deadline 20s -l deadline=20", QsubOptions(), {"deadline": "20s"}),
        ("#EBB --deadline 20s", QsubOptions(resources=["deadline=5s"]), {"deadline": "5s"}),
        ("#PBS -l deadline=20s", QsubOptions(deadline="7s"), {"deadline": "7s"}),
        # -v and -W lists: the command line's replace the script's
        ("#PBS -v A=1", QsubOptions(env=["B=2"]), {"env": {"B": "2"}}),
        ("#PBS -v A=1\n#PBS -v B=2", QsubOptions(), {"env": {"A": "1", "B": "2"}}),
        (
            "#PBS -W depend=afterok:1",
            QsubOptions(depend=["depend=afterany:2"]),
            {"depends": [{"kind": "afterany", "job_id": 2}]},
        ),
        # -h from either source holds
        ("#PBS -h", QsubOptions(), {"hold": True}),
        ("", QsubOptions(hold=True), {"hold": True}),
    ],
)
def test_precedence(directive: str, cli: QsubOptions, expected: dict) -> None:
    cli.command = ["true"]
    kwargs = build_spec_kwargs(cli, _directives(directive + "\n"), {})
    kwargs.pop("command")
    assert kwargs == expected
    JobSpec(command=["true"], **kwargs)


@pytest.mark.parametrize(
    ("directive", "cli", "message"),
    [
        ("#PBS -N x\n#PBS -J 5-1", QsubOptions(), "train.sh line 2: -J: the range ends"),
        ("#PBS -l gpumem=lots", QsubOptions(), "train.sh line 1: -l gpumem: expected a size"),
        ("#PBS -l gpu=1\n#PBS -l gpumen=1", QsubOptions(), "train.sh line 2: -l: unknown resource"),
        ("#PBS -W depend=before:1", QsubOptions(), "train.sh line 1: -W: unknown dependency"),
        ("#PBS -v A=1\n#PBS -v NOPE", QsubOptions(), "train.sh line 2: -v: NOPE is not set"),
        ("#PBS -p high", QsubOptions(), "train.sh line 1: -p: expected a whole number"),
        (
            "#PBS -p 5000",
            QsubOptions(),
            "train.sh line 1: -p: expected a whole number from -1024 to 1023",
        ),
        ("#PBS -N 'two words'", QsubOptions(), "train.sh line 1: -N: use 1-128 letters"),
        ("#PBS -q 'bad queue'", QsubOptions(), "train.sh line 1: -q: use 1-64 letters"),
        ("#EBB --kind nap", QsubOptions(), "train.sh line 1: --kind: expected one of training"),
        ("#EBB --deadline soon", QsubOptions(), "train.sh line 1: --deadline: expected a duration"),
        ("#EBB --deadline 2h", QsubOptions(), "train.sh line 1: --deadline: must be at most"),
        (
            "#EBB --deadline 20s -l deadline=10s",
            QsubOptions(),
            "train.sh line 1: --deadline: gives the deadline as '20s' and -l deadline= as '10s'",
        ),
        ("#EBB --signal NOPE", QsubOptions(), "train.sh line 1: --signal: unknown signal"),
        (
            "#EBB --max-attempts 0",
            QsubOptions(),
            "train.sh line 1: --max-attempts: expected a whole number from 1 to 100",
        ),
        # the same mistakes on the command line name the flag alone
        ("", QsubOptions(array="1-x"), "-J: expected a range"),
        ("", QsubOptions(resources=["gpu=3.5"]), "-l gpu: more than one GPU"),
        ("", QsubOptions(priority="x"), "-p: expected a whole number"),
        ("", QsubOptions(env=["NOPE"]), "-v: NOPE is not set"),
        ("", QsubOptions(depend=["hold=1"]), "-W: only depend="),
        ("", QsubOptions(kind="nap"), "--kind: expected one of"),
    ],
)
def test_build_errors_name_where(directive: str, cli: QsubOptions, message: str) -> None:
    with pytest.raises(SpecError) as info:
        build_spec_kwargs(cli, _directives(directive + "\n"), {})
    assert str(info.value).startswith(message)


def test_bad_directive_overridden_by_cli_is_not_an_error() -> None:
    kwargs = build_spec_kwargs(QsubOptions(array="1-2"), _directives("#PBS -J 5-1\n"), {})
    assert kwargs["array"] == {"start": 1, "end": 2}


# ---------------------------------------------------------------- load_script


def test_load_script(tmp_path) -> None:
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/sh\n#PBS -N t -l gpu=1\necho hi\n")
    text, directives = load_script(path)
    assert text.endswith("echo hi\n")
    assert directives.name == "t"
    assert directives.resources == ["gpu=1"]
    assert directives.origin["name"] == f"{path} line 2"


def test_load_script_error_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/sh\n\n#PBS -X\necho hi\n")
    with pytest.raises(
        SpecError, match=rf"^{re.escape(str(path))} line 3: unknown directive option -X"
    ):
        load_script(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "SCRIPT: cannot read"),
        (b"\x7fELF\x00\x01", "SCRIPT: .* is not a text file"),
        (b"\xff\xfe\xfa", "SCRIPT: .* is not a text file"),
        (b"  \n", "SCRIPT: .* is empty"),
    ],
)
def test_load_script_bad(tmp_path, content: bytes | None, message: str) -> None:
    path = tmp_path / "job.sh"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SpecError, match=f"^{message}") as info:
        load_script(path)
    assert info.value.field == "SCRIPT"


def test_load_script_directory(tmp_path) -> None:
    with pytest.raises(SpecError, match=r"^SCRIPT: .* is a directory"):
        load_script(tmp_path)


def test_a_resource_given_again_by_a_later_l_is_taken_with_a_note() -> None:
    """A trial's trap: ``-l gpu=25% -l gpu=50%`` took 50% and said nothing; in one ``-l``
    it is refused (above).  The command line over a script's ``#PBS -l`` stays silent:
    that is what the command line is for."""
    notes: list[str] = []
    opts = {"resources": ("gpu=25%,gpumem=1GiB", "gpu=50%", "gpumem=1GiB")}
    spec = qsub_spec(opts, ["true"], script=None, notes=notes)
    assert spec.compute_pct == 50
    assert notes == ["-l gpu=50%: replaces the 25% an earlier -l gave: the last one counts"]
    script = "#!/bin/sh\n#PBS -l walltime=1:00:00\n#PBS -l walltime=2:00:00\ntrue\n"
    notes.clear()
    spec = qsub_spec(
        {"resources": ("walltime=3:00:00",)}, [], script=("job.sh", script), notes=notes
    )
    assert spec.walltime_s == 3 * 3600
    assert notes == [
        "job.sh line 3: -l walltime=2:00:00: replaces the 1:00:00 an earlier -l gave: "
        "the last one counts"
    ]
