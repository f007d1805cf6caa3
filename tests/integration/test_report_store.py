"""What ``ebb report`` reads and computes on a real store (SQLite and PostgreSQL), through
the SDK and through ``ebb server``, on the history of :mod:`tests.report_fleet`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ebbtide.api.app import create_app
from ebbtide.client import Client
from ebbtide.clock import FakeClock
from ebbtide.config.settings import Settings
from ebbtide.errors import SpecError
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import REPORT_PROBE_EVENTS, Store
from tests.report_fleet import GPU_SECONDS, WINDOW, make_history
from tests.serving import serving

History = tuple[Store, float, dict[str, int]]


@pytest.fixture
def store(any_store: Store) -> Store:
    """The store's behaviour on every backend: SQLite, PostgreSQL and in memory."""
    return any_store


@pytest.fixture
def history(store: Store) -> Iterator[History]:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    t0 = clock.time()
    yield store, t0, make_history(store, clock)


def _client(store: Store, tmp_path: Path) -> Client:
    return Client(Settings.from_env({"EBBTIDE_HOME": str(tmp_path)}), store=store)


def test_report_rows_are_the_jobs_concerned_with_their_attempts(history: History) -> None:
    store, t0, ids = history
    rows = store.report_rows(t0 + WINDOW[0], t0 + WINDOW[1])
    assert {e["job_id"] for e in rows["events"]} == set(ids.values()) - {ids["old"]}
    assert {(a["job_id"], a["number"]) for a in rows["attempts"]} == {
        (ids["train"], 1),
        (ids["train"], 2),
        (ids["batch"], 1),
        (ids["whole"], 1),
        (ids["broken"], 1),
    }
    whole = next(a for a in rows["attempts"] if a["job_id"] == ids["whole"])
    assert whole["devices"] == [0, 1] and whole["compute_pct"] == 100
    assert whole["queue"] == "batch" and whole["owner"] == "bob" and whole["ended_at"] is None
    evicted = [e for e in rows["events"] if e["type"] == "evicted"]
    assert [e["data"]["reason_code"] for e in evicted] == ["online_compute", "online_memory"]
    assert rows["nodes"] == [
        {"name": "gpu-a", "started_at": t0, "heartbeat_at": t0 + 3600, "devices": 2}
    ]


def test_the_report_of_the_hour(history: History, tmp_path: Path) -> None:
    store, t0, _ = history
    r = _client(store, tmp_path).report(t0 + WINDOW[0], t0 + WINDOW[1])
    overall = r["overall"]
    assert overall["jobs"] == {"submitted": 5, "succeeded": 1, "failed": 1, "cancelled": 1}
    assert overall["attempts"] == 5
    assert overall["gpu_hours"] == pytest.approx(GPU_SECONDS / 3600, abs=1e-5)
    evictions = overall["evictions"]
    assert (evictions["count"], evictions["deadline_misses"], evictions["killed"]) == (2, 1, 1)
    assert evictions["latency_max_s"] == 31.5 and evictions["lost_work_s"] == 400.0
    assert sorted(evictions["by_reason"]) == ["online_compute", "online_memory"]
    assert overall["pauses"] == {"count": 1, "suspended": 0, "paused_s": 120.0}
    # train 60 s then 30 s after its eviction, batch 200 s, whole and broken 0 s
    assert overall["queue_wait"]["count"] == 5 and overall["queue_wait"]["max_s"] == 200.0
    assert sorted(r["queues"]) == ["batch", "default"] and sorted(r["users"]) == ["alice", "bob"]
    assert r["fleet"]["device_hours"] == pytest.approx(2 * 2600 / 3600, abs=1e-5)
    bob = _client(store, tmp_path).report(t0 + WINDOW[0], t0 + WINDOW[1], user="bob")
    assert list(bob["users"]) == ["bob"] and bob["overall"]["evictions"]["count"] == 1


def test_attempts_across_the_whole_window_count_their_part(
    history: History, tmp_path: Path
) -> None:
    store, t0, _ = history
    # nothing happens in [2200, 2300): train (50 %), batch (25 %) and whole (2 GPUs) run
    r = _client(store, tmp_path).report(t0 + 2200, t0 + 2300)
    assert r["overall"]["gpu_hours"] == pytest.approx(100 * (0.5 + 0.25 + 2) / 3600, abs=1e-6)
    assert r["overall"]["attempts"] == 3 and r["overall"]["jobs"]["submitted"] == 0


def test_a_window_before_anything_is_empty(history: History, tmp_path: Path) -> None:
    store, t0, _ = history
    r = _client(store, tmp_path).report(t0 - 86400, t0 - 3600)
    assert r["overall"]["gpu_hours"] == 0 and r["queues"] == {}
    assert r["fleet"]["device_hours"] == 0


def test_a_bad_window_or_filter_is_a_spec_error(history: History, tmp_path: Path) -> None:
    store, t0, _ = history
    client = _client(store, tmp_path)
    with pytest.raises(SpecError, match="before its end"):
        client.report(t0, t0)
    with pytest.raises(SpecError, match="366 days"):
        client.report(t0 - 400 * 86400, t0)
    with pytest.raises(SpecError, match="finite"):
        client.report(float("nan"), t0)
    with pytest.raises(SpecError, match="queue"):
        client.report(t0, t0 + 1, queue="")


@pytest.mark.sql_only(reason="bisects the events table through a connection of the engine")
def test_the_bisection_starts_at_the_window_not_the_history(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FakeClock)
    with store.engine.connect() as conn:
        assert Store._first_event_id(conn, 0.0) == 0  # no events yet
    times = []
    for n in range(60):
        store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)  # one event
        times.append(clock.time())
        if n == 45:  # an event reported an hour late: an old time, a new id
            clock.advance(-3600)
            store.submit(JobSpec(command=["x"]), "alice", defaults_deadline_s=30)
            clock.advance(3600)
        clock.advance(60)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, time FROM events ORDER BY id").all()
        for n in (0, 10, 30, 46, 59):
            boundary = next(i for i, t in rows if t >= times[n])
            first = Store._first_event_id(conn, times[n])
            assert boundary - REPORT_PROBE_EVENTS < first <= boundary
        assert Store._first_event_id(conn, times[-1] + 1) == rows[-1][0] + 1


def test_the_report_through_the_server_is_the_sdks(tmp_path: Path, sqlite_url: str) -> None:
    clock = FakeClock()
    store = Store(sqlite_url, clock=clock)
    t0 = clock.time()
    make_history(store, clock)
    token = store.tokens.create("bob", by="root")[1]  # no admin: anyone may read a report
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path), "EBBTIDE_DB_URL": sqlite_url})
    since, until = t0 + WINDOW[0], t0 + WINDOW[1]
    try:
        with serving(create_app(settings, store=store), tmp_path) as served:
            env = {"EBBTIDE_URL": served.url, "EBBTIDE_TOKEN": token}
            local = Client(settings, store=store)
            with Client(Settings.from_env(env)) as remote:
                assert remote.report(since, until) == local.report(since, until)
                assert remote.report(since, until, queue="batch", user="bob") == local.report(
                    since, until, queue="batch", user="bob"
                )
                with pytest.raises(SpecError, match="before its end"):
                    remote.report(until, since)
            auth = {"Authorization": f"Bearer {token}"}
            missing = httpx.get(f"{served.url}/v1/report", params={"since": since}, headers=auth)
            assert missing.status_code == 422 and "until" in missing.text
    finally:
        store.close()
