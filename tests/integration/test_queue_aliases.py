"""A queue named by an alias at submission, through the SDK and the API: the job is
recorded under the queue's own name, with that queue's settings, and the API says so."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ebbtide.api.app import create_app
from ebbtide.client import Client
from ebbtide.clock import FakeClock
from ebbtide.config.policy import parse_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import SpecError
from ebbtide.identity import Caller
from ebbtide.queue.store import Store
from tests.serving import serving

POLICY = """
queues:
  default: {}
  batch:
    priority: 7
    aliases: [gpu, workq]
"""


def test_the_sdk_and_the_api_record_the_queue_an_alias_names(
    tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    settings = Settings.from_env(
        {
            "EBBTIDE_HOME": str(tmp_path),
            "EBBTIDE_DB_URL": sqlite_url,
            "EBBTIDE_POLICY": str(tmp_path / "policy.yaml"),
        }
    )
    store = Store(sqlite_url, clock=FakeClock())
    try:
        policy = parse_policy(POLICY, "policy.yaml")
        with Client(settings, store=store, policy=policy, caller=Caller("alice")) as client:
            job = client.submit(command=["true"], queue="workq")
            assert (client.get(job).queue, client.get(job).priority) == ("batch", 7)
            assert job.state == "queued"
            with pytest.raises(SpecError) as err:
                client.submit(command=["true"], queue="long")
            assert "known queues: batch (aliases: gpu, workq), default" in str(err.value)
        token = store.tokens.create("alice", by="root")[1]
        with (
            serving(create_app(settings, store=store), tmp_path) as served,
            httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"}) as http,
        ):
            body = {"command": ["true"], "queue": "gpu", "compat": "slurm"}
            out = http.post("/v1/jobs", json=body, params={"workdir": "/tmp"}).json()
            assert out["notes"][0] == "partition 'gpu' is queue 'batch' here"
            assert http.get(f"/v1/jobs/{out['id']}").json()["queue"] == "batch"
            # the SDK through the server has the server's notes (ebb sbatch prints them)
            remote_env = {"EBBTIDE_URL": served.url, "EBBTIDE_TOKEN": token}
            with Client(Settings.from_env(remote_env)) as remote:
                remote.submit_many(command=["true"], queue="gpu", compat="slurm")
                assert remote.last_notes[0] == "partition 'gpu' is queue 'batch' here"
    finally:
        store.close()
