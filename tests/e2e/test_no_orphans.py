"""End to end: `ebb up` killed with -9 takes every process of its jobs with it — the
Python child of a bash job script and a daemon that left its session — so nothing runs
beside the twin a restarted `ebb up` starts (a fault run found 4 such orphans)."""

from __future__ import annotations

import signal
import sys
import textwrap
import time

import psutil
import pytest

from tests.e2e.helpers import ebb_env, ebb_json, jobs_by_id, start, stop, wait_for

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """\
    #!/bin/bash
    setsid {python} -c "import time; time.sleep(300)  # orphan-daemon" &
    {python} -c "import time; time.sleep(300)  # orphan-child"
    """
)


def _ours() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "# orphan-" in cmd and " -I " not in cmd and not cmd.startswith("bash"):
            found.append(p)
    return found


def test_kill_9_of_ebb_up_leaves_no_process_of_its_jobs(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT.format(python=sys.executable))
    job_id = ebb_json(env, "qsub", "-l", "gpu=10%,gpumem=1GiB", str(script))["id"]
    up = start(env, "up", "--node", "box", "--devices", "1x80GiB", log=tmp_path / "up.log")
    try:
        wait_for(lambda: len(_ours()) == 2, 20, "the job's child and daemon")
        assert jobs_by_id(env)[job_id]["state"] == "running"
        up.send_signal(signal.SIGKILL)
        up.wait()
        give_up = time.monotonic() + 5
        while _ours() and time.monotonic() < give_up:
            time.sleep(0.05)
        assert _ours() == [], "processes of the job outlived its agent"
    finally:
        stop(up)
        for p in _ours():
            p.kill()
