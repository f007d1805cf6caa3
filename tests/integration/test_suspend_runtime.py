"""Suspend to host, switched on in a deployment: the policy's ``suspend_to_host``, the
agent's ``--cuda-checkpoint`` and ``--host-copy-bandwidth``, and policy reloads."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli
from ebbtide.config.policy import parse_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import ConfigError
from ebbtide.runtime import Runtime, build
from ebbtide.workers.devices import parse_devices
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.suspend import DEFAULT_HOST_COPY_MIB_S

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "cuda-checkpoint"
AUTO = "defaults:\n  suspend_to_host: auto\n  suspend_host_memory_pct: 30\n"
NEVER = "defaults:\n  suspend_to_host: never\n"


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.stop()


def node(tmp_path: Path, runtimes: list[Runtime], policy: str, **options: object) -> Runtime:
    """``ebb up`` as built (not started) under ``policy``."""
    path = tmp_path / "ebbtide.yaml"
    path.write_text(policy)
    settings = Settings(home=tmp_path / "home", db_url=f"sqlite:///{tmp_path / 'e.db'}")
    source = StaticSource(parse_devices("1x80GiB"))
    rt = build(
        settings,
        scheduler=True,
        agent_name="n1",
        source=source,
        policy_path=path,
        **options,  # type: ignore[arg-type]
    )
    runtimes.append(rt)
    return rt


def test_auto_gives_the_agent_the_utility_and_the_rules(
    tmp_path: Path, runtimes: list[Runtime]
) -> None:
    rt = node(tmp_path, runtimes, AUTO, cuda_checkpoint=str(FAKE), host_copy_mib_s=20480.0)
    assert rt.agent is not None
    cc = rt.agent.cuda_checkpoint
    assert cc is not None and cc.path == str(FAKE) and cc.bandwidth_mib_s == 20480.0
    rules = rt.agent.pause_rules
    assert rules.suspend is True and rules.host_memory_pct == 30.0


def test_the_utility_is_found_on_path_and_the_bandwidth_defaults(
    tmp_path: Path, runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(FAKE.parent))
    rt = node(tmp_path, runtimes, AUTO)
    assert rt.agent is not None and rt.agent.cuda_checkpoint is not None
    assert rt.agent.cuda_checkpoint.path == str(FAKE)
    assert rt.agent.cuda_checkpoint.bandwidth_mib_s == DEFAULT_HOST_COPY_MIB_S


def test_never_gives_the_agent_no_utility(tmp_path: Path, runtimes: list[Runtime]) -> None:
    rt = node(tmp_path, runtimes, NEVER, cuda_checkpoint=str(FAKE))
    assert rt.agent is not None
    assert rt.agent.cuda_checkpoint is None and rt.agent.pause_rules.suspend is False


def test_auto_without_the_utility_evicts_and_says_so(
    tmp_path: Path,
    runtimes: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cuda-checkpoint there
    caplog.set_level(logging.WARNING, logger="ebbtide")
    rt = node(tmp_path, runtimes, AUTO)
    assert rt.agent is not None and rt.agent.cuda_checkpoint is None
    assert "cuda-checkpoint is not on PATH" in caplog.text


def test_a_cuda_checkpoint_that_cannot_run_is_an_error(
    tmp_path: Path, runtimes: list[Runtime]
) -> None:
    with pytest.raises(ConfigError, match="--cuda-checkpoint /nonexistent/cuda-checkpoint"):
        node(tmp_path, runtimes, NEVER, cuda_checkpoint="/nonexistent/cuda-checkpoint")


def test_a_reload_turns_suspension_on_and_off(tmp_path: Path, runtimes: list[Runtime]) -> None:
    rt = node(tmp_path, runtimes, NEVER, cuda_checkpoint=str(FAKE))
    assert rt.agent is not None and rt.agent.cuda_checkpoint is None
    rt.apply_policy(parse_policy(AUTO, "ebbtide.yaml"))
    cc = rt.agent.cuda_checkpoint
    assert cc is not None and cc.path == str(FAKE) and rt.agent.pause_rules.suspend
    # back to never: nothing new is suspended; the utility stays to restore what is
    rt.apply_policy(parse_policy(NEVER, "ebbtide.yaml"))
    assert rt.agent.pause_rules.suspend is False and rt.agent.cuda_checkpoint is cc


@pytest.mark.parametrize("command", ["up", "worker"])
def test_the_agent_commands_take_the_options(command: str) -> None:
    text = CliRunner().invoke(cli, [command, "--help"]).output
    assert "--cuda-checkpoint PATH" in text and "--host-copy-bandwidth SIZE" in text
    assert f"{DEFAULT_HOST_COPY_MIB_S:.0f}MiB" in text


@pytest.mark.parametrize("value", ["fast", "0GiB", "10"])
def test_a_bad_bandwidth_is_refused_before_anything_runs(value: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "--host-copy-bandwidth", value])
    assert result.exit_code == 2
    assert "--host-copy-bandwidth" in result.output


def test_the_bandwidth_takes_a_size_per_second() -> None:
    from ebbtide.cli.run_cmd import _bandwidth_mib_s

    for text in ("10GiB", "10GiB/s", " 10 GiB/s "):
        assert _bandwidth_mib_s(None, None, text) == 10240.0  # type: ignore[arg-type]
