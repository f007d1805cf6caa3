"""Regression tests for bad job input: each is a clear error naming the flag or field and
the bound, never a crash and never accepted (ids past 64 bits, inf/nan shares, signals a
job cannot catch, scripts that are devices or pipes, NUL bytes, bad variable names)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ebbtide import units
from ebbtide.client import Client
from ebbtide.config.policy import Policy
from ebbtide.config.settings import Settings
from ebbtide.errors import SpecError
from ebbtide.identity import Caller
from ebbtide.queue.qsub import (
    QsubOptions,
    build_spec_kwargs,
    load_script,
    parse_array,
    parse_depend,
    parse_env,
    parse_resources,
    parse_script_directives,
)
from ebbtide.queue.spec import MAX_SCRIPT_BYTES, JobSpec

HUGE = "99999999999999999999"  # past 2**63 - 1
CMD = {"command": ["true"]}
ROOT = Path(__file__).resolve().parents[2]


def _message(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SpecError) as info:
        call(*args, **kwargs)
    return str(info.value)


# ------------------------------------------------------------------ -l gpu and sizes


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gpu=inf", ["-l gpu:", "'inf'"]),
        ("gpu=-inf", ["-l gpu:", "'-inf'"]),
        ("gpu=nan", ["-l gpu:", "'nan'"]),
        ("gpu=1e-300", ["-l gpu:", "'1e-300'"]),
        ("gpu=1e2", ["-l gpu:", "'1e2'"]),
        ("gpu=infinity%", ["-l gpu:"]),
        ("gpu=1_0", ["-l gpu:"]),
        ("gpu=0.001%", ["-l gpu:", "two decimals"]),
        ("gpu=33.333%", ["-l gpu:", "two decimals"]),
        ("gpu=0.12345", ["-l gpu:", "two decimals"]),
        ("gpu=65", ["-l gpu:", "at most 64"]),
        (f"gpu={HUGE}", ["-l gpu:", "at most 64"]),
        ("ngpus=65", ["-l ngpus:", "1 to 64"]),
        (f"ngpus={HUGE}", ["-l ngpus:", "1 to 64"]),
        ("ngpus=²", ["-l ngpus:"]),
        ("gpumem=2TiB", ["-l gpumem:", "1TiB"]),
        (f"gpumem={HUGE}TiB", ["-l gpumem:", "1TiB"]),
        ("gpumem=1" + "0" * 400, ["-l gpumem:"]),
        ("walltime=367d", ["-l walltime:", "366 days"]),
        (f"walltime={HUGE}", ["-l walltime:", "366 days"]),
        ("walltime=0.01s", ["-l walltime:", "0.1"]),
        ("walltime=inf", ["-l walltime:"]),
        ("checkpoint_interval=1ms", ["-l checkpoint_interval:", "0.1"]),
        ("deadline=0.5s", ["-l deadline:", "at least 1s"]),
        ("deadline=1ms", ["-l deadline:", "at least 1s"]),
    ],
)
def test_resources_out_of_bounds(text: str, words: list[str]) -> None:
    message = _message(parse_resources, text)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("text", "pct", "gpus"),
    [
        ("gpu=0.01%", 0.01, 0),
        ("gpu=33.33%", 33.33, 0),
        ("gpu=0.0001", 0.01, 0),
        ("gpu=0.29", 29.0, 0),
        ("gpu=.5", 50.0, 0),
        ("gpu=64", 100.0, 64),
        ("gpu=2.0", 100.0, 2),
    ],
)
def test_sane_gpu_shares_still_work(text: str, pct: float, gpus: int) -> None:
    spec = JobSpec(**CMD, **parse_resources(text))
    assert (spec.compute_pct, spec.gpus) == (pct, gpus)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (float("inf"), ["gpu", "finite"]),
        (float("nan"), ["gpu", "finite"]),
        (1e-300, ["gpu", "two decimals"]),
        (10**30, ["gpu", "64"]),
        (True, ["gpu"]),
        ([1], ["gpu"]),
    ],
)
def test_sdk_gpu_out_of_bounds(value: Any, words: list[str]) -> None:
    message = _message(JobSpec, **CMD, gpu=value)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"compute_pct": 1e-300}, "compute_pct"),
        ({"compute_pct": 12.345}, "compute_pct"),
        ({"compute_pct": float("nan")}, "compute_pct"),
        ({"gpus": 65}, "gpus"),
        ({"memory_mib": 2**63}, "memory_mib"),
        ({"walltime_s": float("inf")}, "walltime_s"),
        ({"walltime": float("inf")}, "walltime"),
        ({"walltime": 10**400}, "walltime"),
        ({"deadline_s": 0.001}, "deadline_s"),
        ({"checkpoint_interval_s": 1e-9}, "checkpoint_interval_s"),
        ({"gpumem": float("inf")}, "gpumem"),
        ({"gpumem": ["4GiB"]}, "gpumem"),
        ({"walltime": {"h": 1}}, "walltime"),
        ({"depends": [{"kind": "afterok", "job_id": 2**63}]}, "depends.0.job_id"),
        ({"depends": [{"kind": "afterok", "job_id": i} for i in range(1, 1002)]}, "depends"),
        ({"array": {"start": 0, "end": 2**70}}, "array.end"),
        ({"array": {"start": 0, "end": 10, "step": 2**40}}, "array.step"),
        ({"array": {"start": 0, "end": 10, "limit": 10**6}}, "array.limit"),
    ],
)
def test_sdk_numbers_out_of_bounds(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(**CMD, **fields)
    assert info.value.field == field, info.value


# ------------------------------------------------------------------ ids, arrays, counts


@pytest.mark.parametrize(
    ("call", "text", "words"),
    [
        (parse_array, f"0-{HUGE}", ["-J:", "2147483647"]),
        (parse_array, f"{HUGE}", ["-J:", "2147483647"]),
        (parse_array, f"1-10:{HUGE}", ["-J:", "step", "2147483647"]),
        (parse_array, "1-10%100001", ["-J:", "limit", "100000"]),
        (parse_array, "1" * 5000, ["-J:", "expected a range"]),
        (parse_array, "1-٣", ["-J:", "expected a range"]),
        (parse_depend, f"depend=afterok:{HUGE}", ["-W:", "9223372036854775807"]),
        (parse_depend, f"depend=afterok:{2**63}", ["-W:", "9223372036854775807"]),
        (parse_depend, "depend=afterok:" + "9" * 5000, ["-W:", "expected a job id"]),
        (
            parse_depend,
            "depend=afterok:" + ":".join(str(i) for i in range(1, 1002)),
            ["-W:", "at most 1000"],
        ),
    ],
)
def test_ids_and_counts_out_of_bounds(call: Any, text: str, words: list[str]) -> None:
    message = _message(call, text)
    for word in words:
        assert word in message, message


def test_largest_id_is_accepted() -> None:
    [dep] = parse_depend(f"depend=afterok:{2**63 - 1}")
    assert dep["job_id"] == 2**63 - 1
    assert parse_array("2147483647") == {"start": 2147483647, "end": 2147483647}


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        (QsubOptions(priority=HUGE), "-p: expected a whole number from -1024 to 1023"),
        (QsubOptions(priority="1" * 5000), "-p: expected a whole number from -1024 to 1023"),
        (QsubOptions(priority="٣"), "-p: expected a whole number from -1024 to 1023"),
        (QsubOptions(max_attempts=HUGE), "--max-attempts: expected a whole number from 1 to 100"),
        (QsubOptions(max_attempts="1e3"), "--max-attempts: expected a whole number from 1 to 100"),
        (QsubOptions(deadline="inf"), "--deadline: expected a duration"),
        (QsubOptions(deadline=HUGE), "--deadline: must be at most"),
    ],
)
def test_flags_out_of_bounds(cli: QsubOptions, message: str) -> None:
    cli.command = ["true"]
    assert _message(build_spec_kwargs, cli, None, {}).startswith(message)


# ------------------------------------------------------------------ warning signals


@pytest.mark.parametrize(
    "value", ["KILL", "SIGKILL", "9", "STOP", "19", "SEGV", "CHLD", "TSTP", "CONT", "NOPE", "0"]
)
def test_signals_that_cannot_warn_are_refused(value: str) -> None:
    message = _message(build_spec_kwargs, QsubOptions(command=["true"], signal=value), None, {})
    assert message.startswith("--signal: ")
    if value not in ("NOPE", "0"):
        assert "TERM, INT, HUP, USR1, USR2, QUIT, ALRM, XCPU" in message, message
    with pytest.raises(SpecError) as info:
        JobSpec(**CMD, signal=value)
    assert info.value.field == "signal"


@pytest.mark.parametrize("value", [*units.WARNING_SIGNALS, "usr1", "SIGTERM", 10, "10"])
def test_catchable_warning_signals_are_accepted(value: str | int) -> None:
    assert units.signal_name(JobSpec(**CMD, signal=value).signal) in units.WARNING_SIGNALS


def test_warning_signals_are_the_ones_the_shim_forwards() -> None:
    from ebbtide.workers import shim

    assert {units.signal_name(s) for s in shim.FORWARDED} == set(units.WARNING_SIGNALS)


def test_job_api_names_the_allowed_signals_for_an_uncatchable_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ebbtide.job as job

    monkeypatch.setenv("EBBTIDE_WARNING_SIGNAL", "KILL")
    with pytest.raises(ValueError, match=r"EBBTIDE_WARNING_SIGNAL: KILL .* TERM, INT"):
        job.warning_signal()
    monkeypatch.setenv("EBBTIDE_WARNING_SIGNAL", "USR2")
    assert job.warning_signal() == signal.SIGUSR2


# ------------------------------------------------------------------ scripts


def test_script_that_is_a_character_device_is_refused_without_reading() -> None:
    with pytest.raises(SpecError, match=r"^SCRIPT: '/dev/zero' is a character device"):
        load_script("/dev/zero")


def test_script_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "job.sh"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match=r"^SCRIPT: .* is a named pipe"):
        load_script(fifo)


def test_script_over_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.sh"
    path.write_bytes(b"#!/bin/sh\n" + b"#" * MAX_SCRIPT_BYTES)
    with pytest.raises(SpecError, match=r"^SCRIPT: .* a script may be at most 1048576"):
        load_script(path)
    path.write_bytes(b"#!/bin/sh\n" + b"#" * (MAX_SCRIPT_BYTES - 20) + b"\necho\n")
    text, _ = load_script(path)  # just under the cap is fine
    assert len(text) <= MAX_SCRIPT_BYTES


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"#!/bin/sh\necho \x00 hi\n", ["NUL byte"]),
        (b"#!/bin/sh\necho \xff\n", ["not UTF-8"]),
    ],
)
def test_script_content_refused(tmp_path: Path, content: bytes, words: list[str]) -> None:
    path = tmp_path / "job.sh"
    path.write_bytes(content)
    message = _message(load_script, path)
    for word in words:
        assert word in message, message


def test_directive_errors_count_lines_as_the_shell_does() -> None:
    text = "#!/bin/sh\n# page\x0cbreak \u2028 here\n#PBS -l gpu=inf\necho\n"
    with pytest.raises(SpecError, match=r"^job\.sh line 3: -l gpu: "):
        build_spec_kwargs(
            QsubOptions(script=text), parse_script_directives(text, source="job.sh"), {}
        )


def test_script_path_with_a_nul_byte() -> None:
    assert "NUL byte" in _message(load_script, "job\0.sh")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"script": "echo \0"}, "script", ["NUL"]),
        ({"script": "#" * (MAX_SCRIPT_BYTES + 1)}, "script", ["1048576"]),
        ({"script": "  \n"}, "script", ["empty"]),
    ],
)
def test_sdk_script_refused(fields: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec(**fields)
    assert info.value.field == field
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------ env, args, paths


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"env": {"A=B": "x"}}, "env"),
        ({"env": {"": "x"}}, "env"),
        ({"env": {"A\0": "x"}}, "env"),
        ({"env": {"1A": "x"}}, "env"),
        ({"env": {"A\n": "x"}}, "env"),
        ({"env": {"A": "x\0y"}}, "env"),
        ({"env": {"A": "x" * (128 * 1024)}}, "env"),
        ({"command": ["echo", "a\0b"]}, "command"),
        ({"command": ["echo", "\udcff"]}, "command"),
        ({"command": ["echo", "x" * (128 * 1024)]}, "command"),
        ({"command": ["echo", *["x" * 100_000] * 11]}, "command"),
        ({"args": ["a\0b"]}, "args"),
        ({"cwd": "/tmp/\0"}, "cwd"),
        ({"cwd": ""}, "cwd"),
        ({"cwd": "/" + "d" * 5000}, "cwd"),
        ({"checkpoint_dir": "/ck\0"}, "checkpoint_dir"),
        ({"name": "job\n"}, "name"),
    ],
)
def test_text_the_os_cannot_take_is_refused(fields: dict[str, Any], field: str) -> None:
    base = {} if "command" in fields else dict(CMD)
    with pytest.raises(SpecError) as info:
        JobSpec(**base, **fields)
    assert info.value.field == field, info.value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("A\0=1", ["-v:", "variable name"]),
        ("A=1\0", ["-v:", "NUL"]),
        ("A B=1", ["-v:", "variable name"]),
    ],
)
def test_env_flag_refused(text: str, words: list[str]) -> None:
    message = _message(parse_env, text, {})
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("cli", "prefix"),
    [
        (QsubOptions(cwd="/w\0"), "-d: "),
        (QsubOptions(checkpoint_dir="/c\0"), "--checkpoint-dir: "),
    ],
)
def test_path_flags_with_nul_refused(cli: QsubOptions, prefix: str) -> None:
    cli.command = ["true"]
    message = _message(build_spec_kwargs, cli, None, {})
    assert message.startswith(prefix) and "NUL" in message, message


# ------------------------------------------------------------------ the SDK client


class _NoStore:
    """A store that must not be reached: arguments are checked before it is."""

    def __getattr__(self, name: str) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"the store was asked to {name}{args}")

        return called


@pytest.fixture
def client(tmp_path: Path) -> Client:
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path)})
    return Client(settings, store=_NoStore(), policy=Policy(), caller=Caller("alice"))  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["get", "cancel", "hold", "release", "events", "wait"])
@pytest.mark.parametrize("job_id", [2**63, 10**20, 0, -1, "12", 1.5, True, None])
def test_client_ids_are_bounded(client: Client, method: str, job_id: Any) -> None:
    with pytest.raises(SpecError) as info:
        getattr(client, method)(job_id)
    assert info.value.field == "job_id"
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        assert "9223372036854775807" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"array_id": 2**64}, "array_id"),
        ({"limit": -1}, "limit"),
        ({"state": "nope"}, "state"),
    ],
)
def test_client_list_arguments(client: Client, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        client.list(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, "10"])
def test_client_wait_timeout(client: Client, timeout: Any) -> None:
    with pytest.raises(SpecError) as info:
        client.wait(1, timeout=timeout)
    assert info.value.field == "timeout"


def test_client_submit_refuses_before_the_store(client: Client) -> None:
    with pytest.raises(SpecError) as info:
        client.submit(command=["true"], signal="KILL")
    assert info.value.field == "signal"


def test_job_api_import_with_an_uncatchable_signal_says_why(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EBBTIDE_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["EBBTIDE_WARNING_SIGNAL"] = "STOP"
    proc = subprocess.run(
        [sys.executable, "-c", "import ebbtide.job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "EBBTIDE_WARNING_SIGNAL: STOP cannot be a warning signal" in proc.stderr
