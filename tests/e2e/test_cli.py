"""The CLI as users script against it: ids, --json shapes, directives, owners, bad input."""

from __future__ import annotations

import os

import pytest

from ebbtide.client import NO_AGENT_NOTE
from ebbtide.identity import user_name
from tests.e2e.helpers import ebb, ebb_env, ebb_json

pytestmark = pytest.mark.e2e

JOB_KEYS = {
    "id",
    "name",
    "state",
    "queue",
    "priority",
    "owner",
    "attempts",
    "device",
    "slice",
    "submitted_at",
    "started_at",
    "finished_at",
    "exit_code",
    "stdout_path",
    "stderr_path",
    "checkpoint",
}


def test_qsub_prints_only_the_id_and_qstat_json_has_the_documented_fields(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path)
    out = ebb(env, "qsub", "-N", "hello", "-l", "gpu=25%,gpumem=4GiB", "--", "echo", "hi")
    assert out.stdout.strip() == "1"
    assert ebb_json(env, "qsub", "--", "echo", "again") == {"id": 2, "notes": [NO_AGENT_NOTE]}
    jobs = ebb_json(env, "qstat")
    assert [j["id"] for j in jobs] == [1, 2]
    assert set(jobs[0]) >= JOB_KEYS
    one = ebb_json(env, "qstat", "-f", "1")
    assert one["state"] == "queued" and one["owner"] == user_name(os.geteuid())
    assert one["slice"] == {"compute_pct": 25.0, "gpus": 0, "memory_mib": 4096}
    [ev] = ebb_json(env, "events", "1")
    assert ev["type"] == "submitted" and isinstance(ev["time"], float) and ev["attempt"] is None


def test_script_directives_and_command_line_precedence(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home")
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n#PBS -N from-script -q default\n#EBB -l gpu=50%,gpumem=8GiB -p 5\n"
        "echo training\n"
    )
    job_id = ebb_json(env, "qsub", "-l", "gpumem=2GiB", str(script), "--lr", "0.1")["id"]
    job = ebb_json(env, "qstat", "-f", str(job_id))
    assert job["name"] == "from-script"
    assert job["priority"] == 5
    assert job["slice"]["compute_pct"] == 50.0
    assert job["slice"]["memory_mib"] == 2048  # the command line wins, key by key


def test_arrays_and_dependencies(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path)
    assert ebb(env, "qsub", "-J", "1-3%2", "--", "echo").stdout.strip() == "1[]"
    dep = ebb_json(env, "qsub", "-W", "depend=afterok:1:2", "--", "echo", "after")
    assert ebb_json(env, "qstat", "-f", str(dep["id"]))["state"] == "waiting"
    results = ebb_json(env, "qdel", "1[]")
    assert [r["state"] for r in results] == ["cancelled"] * 3


def test_the_owner_is_the_os_user_and_an_admin_acting_for_another_is_recorded(tmp_path):  # type: ignore[no-untyped-def]
    """Identity is not typed in: the owner is the caller's OS user.  ``EBBTIDE_USER`` lets
    an admin (root here, or the policy's ``admins``) act for someone, recorded as such;
    a non-admin setting it is refused (tests/e2e/test_multiuser.py, with real users)."""
    me = user_name(os.geteuid())
    env = ebb_env(tmp_path)
    job_id = ebb_json(env, "qsub", "--", "echo")["id"]
    assert ebb_json(env, "qstat", "-f", str(job_id))["owner"] == me
    if os.geteuid() != 0:
        refused = ebb({**env, "EBBTIDE_USER": "alice"}, "qsub", "--", "echo", check=False)
        assert refused.returncode == 1 and "only admins may act for another user" in (
            refused.stderr
        )
        return
    alice = {**env, "EBBTIDE_USER": "alice"}
    for_alice = ebb_json(alice, "qsub", "--", "echo")["id"]
    assert ebb_json(env, "qstat", "-f", str(for_alice))["owner"] == "alice"
    submitted = ebb_json(env, "events", str(for_alice))[0]
    assert submitted["by"] == "root" and submitted["for"] == "alice"
    assert submitted["via"].startswith("uid 0 on ")
    assert ebb_json(alice, "qhold", str(for_alice))[0]["reason"] == "held by root"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["qsub", "-l", "gpu=abc", "--", "echo"], "-l gpu:"),
        (["qsub", "-l", "gpumem=lots", "--", "echo"], "-l gpumem:"),
        (["qsub", "-J", "5-1", "--", "echo"], "-J"),
        (["qsub", "-W", "depend=afterok:999", "--", "echo"], "no job with id 999"),
        (["qsub", "-q", "nope", "--", "echo"], "unknown queue 'nope'"),
        (["qsub", "/no/such/script.sh"], "SCRIPT"),
        (["qsub"], "needs a SCRIPT"),
        (["qstat", "-f", "42"], "there is no ebbtide store at"),  # nothing submitted yet
        (["qdel", "x1"], "not a job id"),
        (["up", "--devices", "2xlots"], "--devices"),
    ],
)
def test_bad_input_is_one_clear_line_and_changes_nothing(tmp_path, args, message):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path)
    proc = ebb(env, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ebb_json(env, "qstat") == []
