"""End to end: ``examples/sdk.py`` against ``ebb up`` — job handles, waiting, logs and a
result given with ``ebbtide.job.result`` through a real node agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.helpers import EXAMPLES, REPO, ebb_env, start, stop

pytestmark = pytest.mark.e2e


def test_the_sdk_example_gets_its_jobs_results(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    up = start(env, "up", "--node", "box", "--devices", "1x80GiB", log=tmp_path / "up.log")
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "sdk.py")],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        stop(up)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "submitted job 1 (queued) and array tasks [2, 3, 4]" in out
    assert "result: {'count': 50, 'attempts': 1}" in out
    assert "counted to 50" in out  # job.logs()
    for task in (2, 3, 4):
        assert f"task {task}: succeeded, result {{'count': 20, 'attempts': 1}}" in out
