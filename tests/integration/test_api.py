"""``ebb server``'s API, served in process (:mod:`tests.serving`): who may do what, what
the job's events record about it, and the same through the Unix socket and the SDK."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from ebbtide.api.app import create_app
from ebbtide.client import NO_AGENT_NOTE
from ebbtide.clock import FakeClock
from ebbtide.config.settings import Settings
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from tests.serving import Served, serving

POLICY = """
queues:
  default: {}
  team:
    users: [alice]
admins: [carol]
"""
USERS = ("alice", "bob", "carol")


@dataclass
class Api:
    http: httpx.Client
    served: Served
    settings: Settings
    store: Store
    clock: FakeClock
    tokens: dict[str, str]
    policy: Path
    home: Path

    def call(
        self, method: str, path: str, user: str | None = "alice", **kwargs: Any
    ) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if user is not None:
            headers["Authorization"] = f"Bearer {self.tokens[user]}"
        return self.http.request(method, "/v1" + path, headers=headers, **kwargs)

    def submit(self, user: str = "alice", **spec: Any) -> int:
        body = {"command": ["train"], "env": {"SECRET": "hunter2"}, **spec}
        response = self.call("POST", "/jobs", user, json=body, params={"workdir": "/work"})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def start(self, job_id: int) -> int:
        """Play the scheduler and the agent: the job's first attempt runs, with output."""
        attempt = self.store.dispatch(
            job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
        )
        self.store.mark_started(job_id, attempt, pid=42, stdout_path="o", stderr_path="e")
        logs = self.home / "logs" / str(job_id) / str(attempt)
        logs.mkdir(parents=True)
        (logs / "stdout.log").write_text("step 1\nstep 2\n")
        (logs / "stderr.log").write_text("warning\n")
        return attempt


@pytest.fixture
def api(tmp_path: Path, sqlite_url: str) -> Iterator[Api]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    home = tmp_path / "home"
    settings = Settings.from_env(
        {"EBBTIDE_HOME": str(home), "EBBTIDE_DB_URL": sqlite_url, "EBBTIDE_POLICY": str(policy)}
    )
    clock = FakeClock()
    store = Store(sqlite_url, clock=clock)
    tokens = {user: store.tokens.create(user, by="root")[1] for user in USERS}
    try:
        with (
            serving(create_app(settings, store=store), tmp_path) as served,
            httpx.Client(base_url=served.url) as http,
        ):
            yield Api(http, served, settings, store, clock, tokens, policy, home)
    finally:
        store.close()


# -- credentials ------------------------------------------------------------------------


def _refused(response: httpx.Response, says: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert says in response.json()["detail"]


def test_no_token_is_401_with_a_bearer_challenge(api: Api) -> None:
    _refused(api.call("GET", "/jobs", user=None), "no credentials")
    _refused(api.call("POST", "/jobs", user=None, json={"command": ["x"]}), "no credentials")
    assert api.store.list_jobs() == []


def test_the_probes_ask_for_no_token_and_readiness_asks_the_store(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (api.http.get("/healthz").status_code, api.http.get("/healthz").text) == (200, "ok\n")
    assert api.http.get("/readyz").text == "ok\n"

    def down() -> None:
        raise sa.exc.OperationalError("SELECT", {}, Exception("connection refused"))

    monkeypatch.setattr(api.store, "published_policy", down)
    ready = api.http.get("/readyz")
    assert ready.status_code == 503
    assert ready.text.startswith("not ready: the store does not answer (")
    assert api.http.get("/healthz").status_code == 200  # a restart brings no store back
    assert "/healthz" not in api.http.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    "header",
    ["Bearer ebt_not-a-token-we-made", "Bearer nonsense", "Basic YWxpY2U6cHc=", "Bearer"],
)
def test_bad_credentials_are_401(api: Api, header: str) -> None:
    response = api.call("GET", "/whoami", user=None, headers={"Authorization": header})
    assert response.status_code == 401
    assert "ebt_not-a-token" not in response.text  # the token is never repeated


def test_revoked_token_is_401(api: Api) -> None:
    assert api.call("GET", "/whoami", "bob").json()["user"] == "bob"
    [bob] = [t for t in api.store.tokens.all() if t.user == "bob"]
    api.store.tokens.revoke(bob.id, by="carol")
    _refused(api.call("GET", "/whoami", "bob"), "revoked")


def test_expired_token_is_401(api: Api) -> None:
    _, token = api.store.tokens.create("bob", by="root", expires_s=60)
    api.tokens["bob"] = token
    assert api.call("GET", "/whoami", "bob").status_code == 200
    api.clock.advance(61)
    _refused(api.call("GET", "/whoami", "bob"), "expired")


def test_whoami_says_user_admin_and_where_from(api: Api) -> None:
    me = api.call("GET", "/whoami", "carol").json()
    assert me["user"] == "carol" and me["admin"] is True and me["by"] is None
    assert me["via"].startswith("token 3 from ")
    assert api.call("GET", "/whoami", "alice").json()["admin"] is False


# -- owners, others, admins -------------------------------------------------------------


@pytest.mark.parametrize("action", ["cancel", "hold", "release"])
def test_other_users_may_not_act_on_a_job(api: Api, action: str) -> None:
    job_id = api.submit("alice", hold=action == "release")
    response = api.call("POST", f"/jobs/{job_id}/{action}", "bob")
    assert response.status_code == 403
    assert "belongs to alice" in response.json()["detail"]
    assert api.store.get(job_id).state == ("held" if action == "release" else "queued")


@pytest.mark.parametrize("user", ["alice", "carol"])
def test_owner_and_admin_may_hold_release_cancel(api: Api, user: str) -> None:
    job_id = api.submit("alice")
    for action, state in [("hold", "held"), ("release", "queued"), ("cancel", "cancelled")]:
        response = api.call("POST", f"/jobs/{job_id}/{action}", user)
        assert response.status_code == 200, response.text
        assert response.json()["state"] == state


def test_others_see_the_environment_as_stars(api: Api) -> None:
    job_id = api.submit("alice")
    for user, shown in [("alice", "hunter2"), ("carol", "hunter2"), ("bob", "***")]:
        one = api.call("GET", f"/jobs/{job_id}", user).json()
        assert one["spec"]["env"] == {"SECRET": shown}
        [listed] = api.call("GET", "/jobs", user).json()
        assert listed["spec"]["env"] == {"SECRET": shown}
        assert "hunter2" not in api.call("GET", "/jobs", "bob").text


def test_others_see_the_program_but_not_its_arguments_or_script(api: Api) -> None:
    command = api.submit("alice", command=["python", "-c", "x", "--api-key=s3cret"])
    script = api.submit("alice", command=None, script="#!/bin/sh\nexport K=s3cret\n", args=["a"])
    for user in ("alice", "carol"):
        spec = api.call("GET", f"/jobs/{command}", user).json()["spec"]
        assert spec["command"][-1] == "--api-key=s3cret"
    spec = api.call("GET", f"/jobs/{command}", "bob").json()["spec"]
    assert spec["command"] == ["python", "***", "***", "***"]
    spec = api.call("GET", f"/jobs/{script}", "bob").json()["spec"]
    assert (spec["script"], spec["args"]) == ("***", ["***"])
    assert "s3cret" not in api.call("GET", "/jobs", "bob").text


def test_logs_are_for_the_owner_and_admins(api: Api) -> None:
    job_id = api.submit("alice")
    refused = api.call("GET", f"/jobs/{job_id}/logs", "alice")
    assert refused.status_code == 400 and "not started" in refused.json()["detail"]
    api.start(job_id)
    for user in ("alice", "carol"):
        out = api.call("GET", f"/jobs/{job_id}/logs", user).json()
        assert out == {
            "job_id": job_id,
            "attempt": 1,
            "stream": "stdout",
            "text": "step 1\nstep 2\n",
            "size": 14,
            "truncated": False,
            "path": None,  # the attempt's own log, not a file the job named
        }
    err = api.call("GET", f"/jobs/{job_id}/logs", params={"stream": "stderr", "tail_bytes": 3})
    assert err.json()["text"] == "ng\n" and err.json()["truncated"] is True
    response = api.call("GET", f"/jobs/{job_id}/logs", "bob")
    assert response.status_code == 403 and "read its logs" in response.json()["detail"]
    assert "step" not in response.text
    assert api.call("GET", f"/jobs/{job_id}/logs", params={"attempt": 2}).status_code == 422


def test_a_log_that_is_a_link_is_not_followed(api: Api, tmp_path: Path) -> None:
    job_id = api.submit("alice")
    api.start(job_id)
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    log = api.home / "logs" / str(job_id) / "1" / "stdout.log"
    log.unlink()
    log.symlink_to(secret)
    response = api.call("GET", f"/jobs/{job_id}/logs")
    assert response.status_code == 400 and "not a plain file" in response.json()["detail"]
    attempt_dir = log.parent
    for f in attempt_dir.iterdir():
        f.unlink()
    attempt_dir.rmdir()
    attempt_dir.symlink_to(tmp_path)  # the directory itself, pointed elsewhere
    (tmp_path / "stdout.log").write_text("elsewhere\n")
    response = api.call("GET", f"/jobs/{job_id}/logs")
    assert response.status_code == 400 and "elsewhere" not in response.text


def test_unknown_job_is_404(api: Api) -> None:
    for method, path in [
        ("GET", "/jobs/99"),
        ("POST", "/jobs/99/cancel"),
        ("GET", "/jobs/99/logs"),
    ]:
        response = api.call(method, path)
        assert response.status_code == 404
        assert response.json() == {
            "detail": "no job with id 99",
            "error": "JobNotFound",
            "job_id": 99,
        }


# -- acting for others, queues, attribution ---------------------------------------------


def test_act_as_is_refused_for_non_admins(api: Api) -> None:
    response = api.call(
        "POST", "/jobs", "bob", json={"command": ["x"]}, headers={"X-Ebbtide-Act-As": "alice"}
    )
    assert response.status_code == 403
    assert "only admins may act for another user" in response.json()["detail"]
    assert api.store.list_jobs() == []
    same = api.call("GET", "/whoami", "bob", headers={"X-Ebbtide-Act-As": "bob"})
    assert same.json()["user"] == "bob"  # acting for oneself is just acting


def test_an_admin_acting_for_a_user_is_recorded(api: Api) -> None:
    as_alice = {"X-Ebbtide-Act-As": "alice"}
    response = api.call("POST", "/jobs", "carol", json={"command": ["x"]}, headers=as_alice)
    job_id = response.json()["id"]
    assert api.store.get(job_id).owner == "alice"
    api.call("POST", f"/jobs/{job_id}/hold", "carol", headers=as_alice)
    events = api.call("GET", f"/jobs/{job_id}/events", "bob").json()
    for event in events:
        assert event["by"] == "carol" and event["for"] == "alice"
        assert event["via"].startswith("token 3 from ")
    assert api.store.get(job_id).reason == "held by carol"


def test_queue_users_restrict_who_submits(api: Api) -> None:
    refused = api.call("POST", "/jobs", "bob", json={"command": ["x"], "queue": "team"})
    assert refused.status_code == 403
    assert "takes jobs from alice only" in refused.json()["detail"]
    assert api.submit("alice", queue="team") > 0
    assert api.submit("carol", queue="team") > 0  # admins always may


def test_every_action_is_attributed(api: Api) -> None:
    job_id = api.submit("alice")
    api.call("POST", f"/jobs/{job_id}/hold")
    api.call("POST", f"/jobs/{job_id}/release", "carol")
    api.call("POST", f"/jobs/{job_id}/cancel")
    events = api.call("GET", f"/jobs/{job_id}/events").json()
    assert [(e["type"], e["by"]) for e in events] == [
        ("submitted", "alice"),
        ("held", "alice"),
        ("released", "carol"),
        ("cancelled", "alice"),
    ]
    assert all(e["via"].startswith("token ") and " from " in e["via"] for e in events)


# -- submitting -------------------------------------------------------------------------


def test_submit_resolves_paths_against_the_workdir(api: Api) -> None:
    body = {"command": ["x"], "cwd": "sub", "checkpoint_dir": "../ckpt"}
    response = api.call("POST", "/jobs", json=body, params={"workdir": "/home/alice/proj"})
    spec = api.store.spec(response.json()["id"])
    assert (spec.cwd, spec.checkpoint_dir) == ("/home/alice/proj/sub", "/home/alice/ckpt")
    bare = api.call("POST", "/jobs", json={"command": ["x"]}, params={"workdir": "/srv"})
    assert api.store.spec(bare.json()["id"]).cwd == "/srv"
    nowhere = api.call("POST", "/jobs", json={"command": ["x"]})
    assert api.store.spec(nowhere.json()["id"]).cwd is None  # the server's cwd means nothing
    relative = api.call("POST", "/jobs", json={"command": ["x"], "cwd": "sub"})
    assert relative.status_code == 422 and relative.json()["field"] == "cwd"
    bad = api.call("POST", "/jobs", json={"command": ["x"]}, params={"workdir": "rel"})
    assert bad.status_code == 422 and bad.json()["field"] == "workdir"


def test_submit_an_array_returns_every_id(api: Api) -> None:
    body = {"command": ["x"], "array": {"start": 1, "end": 3}}
    out = api.call("POST", "/jobs", json=body).json()
    waits = [NO_AGENT_NOTE]  # no node has reported here
    assert out == {"id": out["ids"][0], "ids": out["ids"], "array": True, "notes": waits}
    assert len(out["ids"]) == 3
    tasks = api.call("GET", "/jobs", params={"array_id": out["id"]}).json()
    assert [t["id"] for t in tasks] == out["ids"]


def test_a_bad_spec_is_422_naming_the_field(api: Api) -> None:
    response = api.call("POST", "/jobs", json={"command": ["x"], "gpu": "lots"})
    assert response.status_code == 422
    assert response.json()["field"] == "gpu" and "GPU" in response.json()["detail"]
    typo = api.call("POST", "/jobs", json={"comand": ["x"]}).json()
    assert "did you mean 'command'" in typo["detail"]


def test_list_filters_and_queue_stats(api: Api) -> None:
    first = api.submit("alice")
    api.submit("bob", hold=True)
    assert [j["id"] for j in api.call("GET", "/jobs", params={"owner": "alice"}).json()] == [first]
    held = api.call("GET", "/jobs", params={"state": ["held", "running"]}).json()
    assert [j["owner"] for j in held] == ["bob"]
    assert len(api.call("GET", "/jobs", params={"limit": 1}).json()) == 1
    # every queue the policy defines, those with no job too
    assert api.call("GET", "/queues").json() == {"default": {"queued": 1, "held": 1}, "team": {}}
    bad = api.call("GET", "/jobs", params={"state": "sleeping"})
    assert bad.status_code == 422 and "expected one of" in bad.json()["detail"]


def test_describe_is_the_qstat_f_shape_with_the_spec(api: Api) -> None:
    job_id = api.submit("alice", gpu="25%")
    one = api.call("GET", f"/jobs/{job_id}").json()
    assert one["slice_asked"] == {"compute_pct": 25.0, "gpus": 0, "memory_mib": 1024}
    assert one["spec"]["command"] == ["train"] and one["spec"]["cwd"] == "/work"


# -- nodes, the policy ------------------------------------------------------------------


def test_drain_is_for_admins(api: Api) -> None:
    api.store.heartbeat("gpu-a", started_at=0.0, devices=[{"index": 0, "memory_mib": 81920}])
    refused = api.call("POST", "/nodes/gpu-a/drain", "alice", json={"device": 0})
    assert refused.status_code == 403
    done = api.call("POST", "/nodes/gpu-a/drain", "carol", json={"device": 0, "reason": "fan"})
    assert done.status_code == 200
    [node] = api.call("GET", "/nodes", "bob").json()
    assert node["devices"][0]["drained"] == "gpu-a/0 drained by carol: fan"
    assert api.call("POST", "/nodes/gpu-a/undrain", "carol", json={}).status_code == 200
    nul = api.call("POST", "/nodes/gpu-a/drain", "carol", json={"reason": "a\u0000b"})
    assert nul.status_code == 422


def test_a_node_is_forgotten_by_an_admin_once_its_agent_is_gone(api: Api) -> None:
    api.store.heartbeat("gpu-z", started_at=0.0, devices=[{"index": 0, "memory_mib": 81920}])
    assert api.call("DELETE", "/nodes/gpu-z", "alice").status_code == 403
    alive = api.call("DELETE", "/nodes/gpu-z", "carol")
    assert alive.status_code == 400
    assert "its agent is alive; stop it first" in alive.json()["detail"]
    api.clock.advance(11)  # silent past the heartbeat timeout
    assert api.call("DELETE", "/nodes/gpu-z", "carol").json() == {
        "node": "gpu-z",
        "forgotten": True,
    }
    assert api.call("GET", "/nodes", "bob").json() == []
    unknown = api.call("DELETE", "/nodes/gpu-z", "carol")
    assert unknown.status_code == 400 and "no node named 'gpu-z'" in unknown.json()["detail"]
    # one that said it stopped goes at once
    api.store.heartbeat("gpu-y", started_at=0.0, devices=[], stopping=True)
    assert api.call("DELETE", "/nodes/gpu-y", "carol").status_code == 200


def test_the_policy_is_reloaded_when_its_file_changes(api: Api) -> None:
    assert api.call("GET", "/whoami", "bob").json()["admin"] is False
    api.policy.write_text(POLICY.replace("admins: [carol]", "admins: [carol, bob]"))
    _touch_later(api.policy)
    assert api.call("GET", "/whoami", "bob").json()["admin"] is True
    api.policy.write_text("queues: [not, a, mapping]\n")
    _touch_later(api.policy)
    # a broken file leaves the last good policy in force
    assert api.call("GET", "/whoami", "bob").json()["admin"] is True


def _touch_later(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def test_openapi_names_every_path_with_a_summary(api: Api) -> None:
    schema = api.http.get("/openapi.json").json()
    assert schema["components"]["schemas"]["JobSpec"]["properties"]["command"]
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/JobSpec"
    for path, operations in schema["paths"].items():
        assert path.startswith("/v1/")
        for operation in operations.values():
            assert operation["summary"], path


def test_the_spec_travels_back_as_the_job_row(api: Api) -> None:
    from ebbtide.api.wire import job_in

    job_id = api.submit("alice", depends=[], name="t")
    data = api.call("GET", f"/jobs/{job_id}").json()
    row, stored = job_in(data).model_dump(), api.store.get(job_id).model_dump()
    assert json.loads(row.pop("spec_json")) == json.loads(stored.pop("spec_json"))
    assert row == stored
    row = job_in(data)
    assert JobSpec.model_validate_json(row.spec_json).env == {"SECRET": "hunter2"}


# -- the Unix socket and the SDK --------------------------------------------------------


def test_the_socket_knows_the_caller_without_a_token(api: Api) -> None:
    transport = httpx.HTTPTransport(uds=str(api.served.socket))
    with httpx.Client(transport=transport, base_url="http://ebbtide/v1") as local:
        me = local.get("/whoami").json()
        assert me["via"] == f"socket uid {os.geteuid()} pid {os.getpid()}"
        job_id = local.post("/jobs", json={"command": ["x"]}).json()["id"]
        # a token on the socket is taken too, and wins
        as_bob = {"Authorization": f"Bearer {api.tokens['bob']}"}
        assert local.get("/whoami", headers=as_bob).json()["via"].startswith("token 2 on socket")
        assert local.post(f"/jobs/{job_id}/cancel", headers=as_bob).status_code == 403
        bad = local.get("/whoami", headers={"Authorization": "Bearer ebt_nope"})
        assert bad.status_code == 401  # a bad token is not passed over for the socket's word
    assert api.store.get(job_id).owner == me["user"]


def test_the_sdk_through_the_server_raises_what_the_store_would(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ebbtide.api.remote import RemoteClient
    from ebbtide.client import Client
    from ebbtide.errors import (
        JobNotFound,
        PermissionDenied,
        SpecError,
        Unauthenticated,
    )

    monkeypatch.chdir(tmp_path)
    env = {"EBBTIDE_URL": api.served.url, "EBBTIDE_TOKEN": api.tokens["alice"]}
    with Client(Settings.from_env(env)) as alice:
        assert isinstance(alice, RemoteClient) and alice.user == "alice"
        job_id = alice.submit(command=["x"], env={"K": "v"}, cwd="out")
        job = alice.get(job_id)
        assert JobSpec.model_validate_json(job.spec_json).cwd == str(tmp_path / "out")
        assert alice.hold(job_id).state == "held"
        [listed] = alice.list(state="held")
        full = alice.describe(job_id)
        shape = alice.as_dict(listed)
        assert shape == {k: full[k] for k in shape} and "slice_asked" not in shape
        assert alice.as_dict(alice.get(job_id)) == shape  # the qstat --json shape, as local
        local = Client(api.settings, store=api.store)
        assert set(shape) == set(local.as_dict(api.store.get(job_id)))
        with pytest.raises(JobNotFound):
            alice.get(999)
        with pytest.raises(SpecError, match="unknown queue 'nope'"):  # as the store's
            alice.submit(command=["x"], queue="nope")
        with pytest.raises(SpecError) as bad:
            alice.submit(command=["x"], gpu="lots")
        assert bad.value.field == "gpu"
    bob_env = {**env, "EBBTIDE_TOKEN": api.tokens["bob"]}
    with Client(Settings.from_env(bob_env)) as bob:
        with pytest.raises(PermissionDenied, match="belongs to alice"):
            bob.release(job_id)
        assert JobSpec.model_validate_json(bob.get(job_id).spec_json).env == {"K": "***"}
        with pytest.raises(PermissionDenied):
            bob.logs(job_id)
    with (
        pytest.raises(Unauthenticated),
        Client(Settings.from_env({**env, "EBBTIDE_TOKEN": "x"})) as c,
    ):
        c.list()


# -- qalter -------------------------------------------------------------------------------


def test_alter_changes_a_waiting_job_for_its_owner_and_admins_only(api: Api) -> None:
    job_id = api.submit("alice", gpu="10%", walltime="1:00:00")
    body = {"gpu": "50%", "walltime": "2:00:00", "priority": 5}
    assert api.call("POST", f"/jobs/{job_id}/alter", "bob", json=body).status_code == 403
    response = api.call("POST", f"/jobs/{job_id}/alter", "carol", json=body)
    assert response.status_code == 200, response.text
    job = api.store.get(job_id)
    assert (job.compute_pct, job.priority) == (50.0, 5)
    assert api.store.spec(job_id).walltime_s == 7200
    altered = [e for e in api.store.events(job_id) if e["type"] == "altered"]
    assert altered[0]["changes"]["gpu"] == "50%" and altered[0]["by"] == "carol"
    bad = api.call("POST", f"/jobs/{job_id}/alter", "alice", json={"gpu": "lots"})
    assert bad.status_code == 422 and "gpu" in bad.text
    # dependencies, as -W depend= writes them: the job waits for them
    other = api.submit("alice")
    waits = api.call(
        "POST", f"/jobs/{job_id}/alter", "alice", json={"depends": [f"afterok:{other}"]}
    )
    assert waits.status_code == 200, waits.text
    assert api.store.get(job_id).state == "waiting"
    ring = api.call(
        "POST", f"/jobs/{other}/alter", "alice", json={"depends": [f"afterok:{job_id}"]}
    )
    assert ring.status_code == 422 and "none of them could ever run" in ring.text
    assert (
        api.call("POST", f"/jobs/{job_id}/alter", "alice", json={"depends": []}).status_code == 200
    )
    bad = api.call("POST", f"/jobs/{job_id}/alter", "alice", json={"command": ["rm"]})
    assert bad.status_code == 422 and "cannot be altered" in bad.text
    api.start(job_id)
    late = api.call("POST", f"/jobs/{job_id}/alter", "alice", json={"gpu": "20%"})
    assert late.status_code in (400, 409) and "only held, waiting or queued" in late.text
    assert api.store.get(job_id).compute_pct == 50.0  # nothing changed


# -- metrics ----------------------------------------------------------------------------


def test_requests_are_counted_by_route_template_and_code(tmp_path: Path, sqlite_url: str) -> None:
    """Labels stay bounded: the route's template, never the job id in the path."""
    from prometheus_client import CollectorRegistry, generate_latest

    from ebbtide.metrics import Metrics

    metrics = Metrics(CollectorRegistry())
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path), "EBBTIDE_DB_URL": sqlite_url})
    store = Store(sqlite_url)
    token = store.tokens.create("alice", by="root")[1]
    try:
        with (
            serving(create_app(settings, store=store, metrics=metrics), tmp_path) as served,
            httpx.Client(base_url=served.url) as http,
        ):
            auth = {"Authorization": f"Bearer {token}"}
            assert http.get("/v1/jobs", headers=auth).status_code == 200
            assert http.get("/v1/jobs/4242", headers=auth).status_code == 404
            assert http.get("/v1/jobs/4343", headers=auth).status_code == 404
            assert http.get("/v1/jobs").status_code == 401
            assert http.get("/nowhere").status_code == 404
    finally:
        store.close()
    text = generate_latest(metrics.registry).decode()
    assert 'ebbtide_api_requests_total{code="200",method="GET",route="/v1/jobs"} 1.0' in text
    assert 'ebbtide_api_requests_total{code="401",method="GET",route="/v1/jobs"} 1.0' in text
    assert (
        'ebbtide_api_requests_total{code="404",method="GET",route="/v1/jobs/{job_id}"} 2.0' in text
    )
    assert 'ebbtide_api_requests_total{code="404",method="GET",route="unmatched"} 1.0' in text
    # no job id in any metric's name or labels (a sample's value, a float, may hold the
    # digits by chance: 0.008424282999840216 did)
    names_and_labels = [line.rsplit(" ", 1)[0] for line in text.splitlines()]
    assert not [n for n in names_and_labels if "4242" in n]
    assert 'ebbtide_api_request_duration_seconds_count{route="/v1/jobs/{job_id}"} 2.0' in text


# -- right-sizing -----------------------------------------------------------------------


def test_recommendations_through_the_server_are_the_sdks(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ebbtide.client import Client
    from ebbtide.errors import SpecError

    job_id = api.submit("alice", gpu="50%", gpumem="16GiB", name="train")
    attempt = api.start(job_id)
    measured = {
        "usage_samples": 120,
        "used_compute_p95_pct": 18.0,
        "used_compute_peak_pct": 30.0,
        "used_memory_p95_mib": 5000.0,
        "used_memory_peak_mib": 6144.0,
    }
    api.store.finish_attempt(job_id, attempt, exit_code=0, usage=measured)
    local = Client(api.settings, store=api.store)
    # anyone may read it, as qstat
    response = api.call("GET", "/recommendations", "bob", params={"job_id": job_id})
    assert response.status_code == 200, response.text
    assert response.json() == local.recommend(job_id)
    [r] = response.json()["recommendations"]
    assert r["used"]["samples"] == 120 and r["recommended"]["memory_mib"] == 8 * 1024
    by_user = api.call("GET", "/recommendations", params={"user": "alice", "last": 5}).json()
    assert by_user == local.recommend(user="alice", last=5)
    assert api.call("GET", "/recommendations").status_code == 422  # nothing named

    monkeypatch.chdir(tmp_path)
    env = {"EBBTIDE_URL": api.served.url, "EBBTIDE_TOKEN": api.tokens["alice"]}
    with Client(Settings.from_env(env)) as alice:
        assert alice.recommend(job_id) == local.recommend(job_id)
        assert alice.recommend(queue="default") == local.recommend(queue="default")
        with pytest.raises(SpecError, match="not both"):
            alice.recommend(job_id, user="alice")
        full = alice.describe(job_id)
        assert full["usage"]["memory_peak_mib"] == 6144.0
        assert full["hint"] == local.describe(job_id)["hint"]


# -- the thin CLI's paths -----------------------------------------------------------------


def test_the_table_is_the_listing_s_fields_and_nothing_of_the_spec(api: Api) -> None:
    from ebbtide.api.remote import RemoteClient
    from ebbtide.client import TABLE_COLUMNS, Client
    from ebbtide.errors import SpecError

    first = api.submit("alice")
    api.submit("bob", hold=True)
    answer = api.call("GET", "/qstat", "bob").json()
    assert answer["fields"] == list(TABLE_COLUMNS)
    rows = [dict(zip(answer["fields"], row, strict=True)) for row in answer["rows"]]
    assert [(r["id"], r["owner"], r["state"]) for r in rows] == [
        (first, "alice", "queued"),
        (first + 1, "bob", "held"),
    ]
    assert "hunter2" not in json.dumps(answer) and "spec_json" not in answer["fields"]
    # a job queued with no reason yet, and no scheduler: said, for qstat's note (a trial's
    # trap: through the server nothing said so); not asked when no such job is listed
    assert answer["scheduler_running"] is False
    held = api.call("GET", "/qstat", params={"state": "held", "owner": "bob"}).json()
    assert [row[0] for row in held["rows"]] == [first + 1]
    assert held["scheduler_running"] is None
    bad = api.call("GET", "/qstat", params={"state": "sleeping"})
    assert bad.status_code == 422 and "expected one of" in bad.json()["detail"]
    env = {"EBBTIDE_URL": api.served.url, "EBBTIDE_TOKEN": api.tokens["alice"]}
    local = Client(api.settings, store=api.store)
    with Client(Settings.from_env(env)) as remote:
        assert isinstance(remote, RemoteClient)
        columns = ("id", "owner", "state", "memory_mib")
        assert remote.table(columns) == local.table(columns)
        assert remote.scheduler_running() is False
        assert remote.table(columns, state="held") == local.table(columns, state="held")
        with pytest.raises(SpecError, match="not a column"):
            remote.table(["spec_json"])  # refused as the store's client refuses it
    with pytest.raises(SpecError, match="not a column"):
        local.table(["spec_json"])


def test_qsub_from_a_command_line_uses_the_callers_environment_and_directory(api: Api) -> None:
    body = {
        "options": {"name": "thin", "env": ["FROM_CLIENT"], "resources": ["gpu=25%"]},
        "args": ["a1"],
        "script": {"name": "job.sh", "text": "#!/bin/sh\n#PBS -l walltime=1:00\necho $1\n"},
        "workdir": "/home/alice/proj",
        "host": "laptop",
        "environ": {"FROM_CLIENT": "yes"},
    }
    out = api.call("POST", "/qsub", json=body).json()
    assert out["array"] is False
    assert out["notes"] == [NO_AGENT_NOTE]
    spec = api.store.spec(out["id"])
    assert (spec.name, spec.env, spec.args, spec.cwd) == (
        "thin",
        {"FROM_CLIENT": "yes"},
        ["a1"],
        "/home/alice/proj",
    )
    assert (spec.submit_host, spec.walltime_s) == ("laptop", 60.0)
    assert api.store.get(out["id"]).owner == "alice"
    # a bare -v VAR the caller did not send is refused: the server's own never stands in
    refused = api.call("POST", "/qsub", json={**body, "environ": {"PATH": "/bin"}})
    assert refused.status_code == 422 and "FROM_CLIENT is not set" in refused.json()["detail"]
    for bad in (
        {**body, "options": {"nosuch": "1"}},
        {**body, "options": {"name": 5}},
        {**body, "options": {"hold": "yes"}},
        {**body, "workdir": "relative"},
        {**body, "script": {"name": "job.sh", "text": "  \n"}},
    ):
        response = api.call("POST", "/qsub", json=bad)
        assert response.status_code == 422, (bad, response.text)
    assert len(api.store.list_jobs()) == 1  # nothing else was submitted


def test_the_frameworks_own_answers_are_shaped_as_every_error(api: Api) -> None:
    """A trial's trap: a route that does not exist answered ``{"detail": "Not Found"}``
    with no ``error``, as the README says every error carries."""
    missing = api.call("GET", "/no-such-thing")
    assert missing.status_code == 404
    assert missing.json() == {
        "detail": "no such route: GET /v1/no-such-thing (the API: /openapi.json)",
        "error": "UserError",
    }
    wrong = api.call("DELETE", "/queues")
    assert wrong.status_code == 405 and wrong.json()["error"] == "UserError"
    assert "does not take DELETE" in wrong.json()["detail"]
    # an unknown job is still the store's answer
    assert api.call("GET", "/jobs/999").json()["error"] == "JobNotFound"
