"""End to end: ``ebb nodes`` and ``ebb node drain | undrain`` against a running ``ebb up``."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ebbtide.identity import user_name
from tests.e2e.helpers import ebb, ebb_env, ebb_json, jobs_by_id, start, stop, wait_for

pytestmark = pytest.mark.e2e


def test_drain_keeps_new_work_off_and_undrain_brings_it_back(tmp_path):  # type: ignore[no-untyped-def]
    me = user_name(os.geteuid())
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"admins: [{me}]\n")  # root always is; anyone else by the policy
    env = ebb_env(tmp_path / "home")
    admin = {**env, "EBBTIDE_POLICY": str(policy)}
    up = start(env, "up", "--node", "box", "--devices", "1x80GiB", log=tmp_path / "up.log")
    try:
        wait_for(lambda: ebb_json(env, "nodes"), 15, "the node's first heartbeat")

        if os.geteuid() != 0:  # a real non-admin: tests/e2e/test_multiuser.py too
            refused = ebb(env, "node", "drain", "box/0", check=False)
            assert refused.returncode == 1
            assert "only admins may drain nodes" in refused.stderr
        for bad, says in [
            ("nope/0", "no node named 'nope'"),
            ("box/7", "has no device 7"),
            ("box/x", "must be a number"),
        ]:
            proc = ebb(admin, "node", "drain", bad, check=False)
            assert proc.returncode == 1 and says in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr

        assert ebb(admin, "node", "drain", "box/0", "--reason", "fan").stdout == "box/0 drained\n"
        [node] = ebb_json(env, "nodes")
        [device] = node["devices"]
        assert device["drained"] == f"box/0 drained by {me}: fan"
        assert device["health"] == "healthy"
        assert f"drained by {me}: fan" in ebb(env, "nodes").stdout

        job_id = ebb_json(env, "qsub", "--", sys.executable, "-c", "print('hi')")["id"]
        reason = wait_for(lambda: jobs_by_id(env)[job_id]["reason"], 10, "a reason to wait")
        assert reason == f"waiting: no device takes work (box/0 drained by {me}: fan)"
        assert jobs_by_id(env)[job_id]["state"] == "queued"

        undrained = json.loads(ebb(admin, "node", "undrain", "box/0", "--json").stdout)
        assert undrained == {"node": "box", "device": 0, "drained": False}
        wait_for(lambda: jobs_by_id(env)[job_id]["state"] == "succeeded", 20, "the job to run")
        assert ebb_json(env, "nodes")[0]["devices"][0]["drained"] is None

        alive = ebb(admin, "node", "forget", "box", check=False)
        assert alive.returncode == 1 and "its agent is alive; stop it first" in alive.stderr
    finally:
        stop(up)
    # stopped cleanly: it may be forgotten at once
    forgotten = json.loads(ebb(admin, "node", "forget", "box", "--json").stdout)
    assert forgotten == {"node": "box", "forgotten": True}
    assert ebb_json(env, "nodes") == []
