"""``ebb admin purge`` on a store, and ``POST /v1/admin/purge`` through ``ebb server``:
admins only, a dry run removes nothing, bad ages are refused with one clear line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from ebbtide.api.app import create_app
from ebbtide.clock import FakeClock
from ebbtide.config.settings import Settings
from ebbtide.errors import PermissionDenied, SpecError
from ebbtide.identity import Caller
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from tests.serving import serving

DAY_S = 86400.0


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store in ``EBBTIDE_HOME`` whose clock started in 2023: what finishes on it is
    long finished by the real clock the command uses."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EBBTIDE_HOME", str(home))
    for name in ("EBBTIDE_URL", "EBBTIDE_DB_URL", "EBBTIDE_POLICY", "EBBTIDE_USER"):
        monkeypatch.delenv(name, raising=False)
    s = Store(f"sqlite:///{home / 'ebbtide.db'}", clock=FakeClock())
    yield s
    s.close()


def ran(store: Store) -> int:
    """A job whose one attempt ran to success: four events and an attempt."""
    [job_id] = store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)
    attempt = store.dispatch(
        job_id, expected_attempts=0, node="n1", devices=(0,), compute_pct=10, memory_mib=1
    )
    store.mark_started(job_id, attempt, pid=1, stdout_path="o", stderr_path="e")
    store.finish_attempt(job_id, attempt, exit_code=0, max_attempts=1)
    return job_id


def ebb(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli(), list(args))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def cli() -> Any:
    from ebbtide.cli.main import cli

    return cli


def fleet(store: Store) -> tuple[list[int], int]:
    """Two old finished jobs, and one queued as old."""
    old = [ran(store), ran(store)]
    [queued] = store.submit(JobSpec(command=["y"]), "bob", defaults_deadline_s=30)
    return old, queued


def test_purge_prints_what_went_and_what_is_left(store: Store) -> None:
    old, queued = fleet(store)
    events = sum(len(store.events(i)) for i in old)

    out = ebb("admin", "purge", "--older-than", "30d").output.splitlines()

    assert out[0].startswith(f"purged 2 jobs, 2 attempts and {events} events: finished before ")
    assert "(over 30d ago); 1 batch, " in out[0]
    assert out[1:] == ["no finished job is left in the store"]
    assert [j.id for j in store.list_jobs()] == [queued]


def test_a_dry_run_counts_and_removes_nothing(store: Store) -> None:
    old, queued = fleet(store)
    store.clock.advance(DAY_S)  # type: ignore[attr-defined]
    young = ran(store)
    text = ebb("admin", "purge", "--older-than", "1h", "--dry-run", "--batch", "1").output
    lines = text.splitlines()
    assert lines[0].startswith("would purge 3 jobs, 3 attempts and ")
    assert "3 batches" in lines[0]
    assert lines[1].startswith("oldest finished job now: finished 2023-")
    assert [j.id for j in store.list_jobs()] == [*old, queued, young]


def test_json_output(store: Store) -> None:
    old, _ = fleet(store)
    [needed] = old[:1]
    store.submit(
        JobSpec(command=["z"], hold=True, depends=[{"kind": "afterok", "job_id": needed}]),
        "alice",
        defaults_deadline_s=30,
    )
    data = json.loads(ebb("admin", "purge", "--older-than", "30d", "--json").output)
    assert set(data) == {
        "cutoff",
        "dry_run",
        "jobs",
        "attempts",
        "events",
        "batches",
        "kept",
        "oldest_kept_finished_at",
        "elapsed_s",
    }
    assert (data["jobs"], data["attempts"], data["kept"], data["dry_run"]) == (1, 1, 1, False)
    assert data["oldest_kept_finished_at"] == store.get(needed).finished_at


def test_someone_not_an_admin_is_refused(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet(store)
    monkeypatch.setattr("ebbtide.client.local_caller", lambda *a, **k: Caller("nobody"))
    result = ebb("admin", "purge", "--older-than", "30d", code=1)
    assert result.output == "ebb: error: only admins may purge finished jobs; nobody is not one\n"
    assert len(store.list_jobs()) == 3


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--older-than", "soon"], "ebb: error: --older-than: expected an age like 30d, 12h"),
        (["--older-than", "10m"], "ebb: error: --older-than: must be from 1h to 366d, got 10m"),
        # a trial's trap: the bare number was seconds, and nothing said so
        (["--older-than", "90"], "ebb: error: --older-than: must be from 1h to 366d, got 90 (90 "),
        (["--older-than", "400d"], "ebb: error: --older-than: "),
        (["--older-than", "-1d"], "ebb: error: --older-than: "),
    ],
)
def test_a_bad_age_is_refused_in_one_line(store: Store, args: list[str], says: str) -> None:
    fleet(store)
    result = ebb("admin", "purge", *args, code=1)
    assert result.output.startswith(says) and result.output.count("\n") == 1, result.output
    assert len(store.list_jobs()) == 3


@pytest.mark.parametrize(
    "args",
    [["--older-than", "30d", "--batch", "0"], ["--older-than", "30d", "--batch", "x"], []],
)
def test_bad_flags_are_usage_errors(store: Store, args: list[str]) -> None:
    result = ebb("admin", "purge", *args, code=2)
    assert result.output.startswith("ebb: error: ") and result.output.count("\n") == 1
    assert ("--batch" if args else "--older-than") in result.output
    assert len(store.list_jobs()) == 0


def test_no_store_there_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EBBTIDE_HOME", str(tmp_path / "nowhere"))
    for name in ("EBBTIDE_URL", "EBBTIDE_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    result = ebb("admin", "purge", "--older-than", "30d", code=1)
    assert result.output.startswith("ebb: error: there is no ebbtide store at ")


# ------------------------------------------------------------------ through ebb server


def test_through_the_server_admins_only(tmp_path: Path, sqlite_url: str) -> None:
    from ebbtide.client import Client

    policy = tmp_path / "policy.yaml"
    policy.write_text("admins: [carol]\n")
    settings = Settings.from_env(
        {
            "EBBTIDE_HOME": str(tmp_path / "home"),
            "EBBTIDE_DB_URL": sqlite_url,
            "EBBTIDE_POLICY": str(policy),
        }
    )
    clock = FakeClock()
    store = Store(sqlite_url, clock=clock)
    tokens = {user: store.tokens.create(user, by="root")[1] for user in ("alice", "carol")}
    _, queued = fleet(store)
    clock.advance(40 * DAY_S)
    try:
        with (
            serving(create_app(settings, store=store), tmp_path) as served,
            httpx.Client(base_url=served.url + "/v1") as http,
        ):

            def call(user: str, body: dict[str, Any]) -> httpx.Response:
                auth = {"Authorization": f"Bearer {tokens[user]}"}
                return http.post("/admin/purge", json=body, headers=auth)

            refused = call("alice", {"older_than_s": 30 * DAY_S})
            assert refused.status_code == 403, refused.text
            assert "only admins may purge" in refused.json()["detail"]
            bad = call("carol", {"older_than_s": 60})
            assert bad.status_code == 422 and bad.json()["field"] == "older_than_s", bad.text
            unknown = call("carol", {"older_than_s": 30 * DAY_S, "everything": True})
            assert unknown.status_code == 422
            dry = call("carol", {"older_than_s": 30 * DAY_S, "dry_run": True})
            assert dry.status_code == 200 and dry.json()["jobs"] == 2
            assert len(store.list_jobs()) == 3

            env = {"EBBTIDE_URL": served.url, "EBBTIDE_TOKEN": tokens["alice"]}
            with Client(Settings.from_env(env)) as alice, pytest.raises(PermissionDenied):
                alice.purge(30 * DAY_S)
            env["EBBTIDE_TOKEN"] = tokens["carol"]
            with Client(Settings.from_env(env)) as carol:
                with pytest.raises(SpecError) as info:
                    carol.purge(30 * DAY_S, batch=0)
                assert info.value.field == "batch"
                done = carol.purge(30 * DAY_S, batch=1)
            assert (done["jobs"], done["batches"], done["dry_run"]) == (2, 2, False)
            assert [j.id for j in store.list_jobs()] == [queued]
    finally:
        store.close()
