"""``ebb k8s render`` as a new user met it (a trial's traps): a node name Kubernetes
would refuse, and ``-l`` resources it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ebbtide.cli.main import cli


def _render(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {"EBBTIDE_HOME": str(tmp_path / "home"), "EBBTIDE_POLICY": ""}
    result = CliRunner().invoke(cli, ["k8s", "render", *args, "--", "python", "t.py"], env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("node", ["no de", "GPU-A", "-gpu", "gpu_a", "a" * 254, "gpu..a"])
def test_an_invalid_node_name_is_refused_naming_the_flag(tmp_path: Path, node: str) -> None:
    code, out, err = _render(tmp_path, "--node", node)
    assert code == 2 and out == ""
    assert err.startswith(f"ebb: error: --node: {node!r} is not a Kubernetes node name")
    assert "Traceback" not in err


@pytest.mark.parametrize("node", ["gpu-a-7", "ip-10-0-0-1.ec2.internal", "NODE"])
def test_a_valid_node_name_and_the_placeholder_render(tmp_path: Path, node: str) -> None:
    code, out, _ = _render(tmp_path, "--node", node)
    assert code == 0 and f"- {node}\n" in out


def test_an_unknown_resource_is_noted_and_a_typo_refused_as_qsub_does(tmp_path: Path) -> None:
    code, out, err = _render(tmp_path, "-l", "foo=bar")
    assert code == 0 and out
    assert "ebb: note: -l foo=bar: accepted, without effect" in err
    code, out, err = _render(tmp_path, "-l", "gpumen=8GiB")
    assert code == 2 and out == ""
    assert "unknown resource 'gpumen'; did you mean 'gpumem'?" in err
    code, _, err = _render(tmp_path, "-l", "gpu=25%,gpumem=8GiB")
    assert code == 0 and "-l" not in err


def test_cpus_and_host_memory_asked_for_are_the_pods_requests(tmp_path: Path) -> None:
    """A trial's trap: ``-l ncpus=8,mem=32gb`` were dropped from the pod, a BestEffort pod
    with unbounded host memory beside inference, refused where a quota wants requests."""
    import json

    code, out, err = _render(
        tmp_path, "--json", "-l", "gpu=25%,gpumem=4GiB,ncpus=8,mem=32gb", "--node", "gpu-a"
    )
    assert code == 0, err
    [container] = json.loads(out)["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"]["cpu"] == "8" and resources["requests"]["memory"] == "32768Mi"
    assert "cpu" not in resources["limits"] and "memory" not in resources["limits"]
    code, out, err = _render(tmp_path, "--json", "-l", "gpu=25%,gpumem=4GiB", "--node", "gpu-a")
    [container] = json.loads(out)["spec"]["containers"]
    assert "cpu" not in container["resources"]["requests"]
