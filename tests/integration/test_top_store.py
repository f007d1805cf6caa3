"""What ``ebb top`` reads: the fleet's latest evictions from the store (SQLite and
PostgreSQL), through the SDK, and through ``ebb server``, and a whole snapshot both ways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.api.app import create_app
from ebbtide.client import Client
from ebbtide.config.settings import Settings
from ebbtide.errors import SpecError
from ebbtide.queue.store import Store
from ebbtide.top.fetch import fetch_snapshot
from tests.serving import serving
from tests.top_fleet import make_fleet


@pytest.fixture
def fleet_store(any_store: Store) -> Iterator[Store]:
    make_fleet(any_store)
    yield any_store


def test_recent_evictions_are_the_newest_first_with_where_and_whose(fleet_store: Store) -> None:
    erin, carol = fleet_store.recent_evictions(10)
    assert (erin["owner"], erin["queue"], erin["node"], erin["devices"]) == (
        "erin",
        "batch",
        "gpu-b",
        [0],
    )
    assert erin["deadline_missed"] is True and erin["killed"] is True
    assert erin["latency_s"] == 31.5 and erin["deadline_s"] == 30.0
    assert carol["deadline_missed"] is False and carol["reason_code"] == "online_compute"
    assert carol["attempt"] == 1 and carol["time"] <= erin["time"]
    assert [e["job_id"] for e in fleet_store.recent_evictions(1)] == [erin["job_id"]]
    assert fleet_store.recent_evictions(0) == []


def test_recent_evictions_look_only_at_the_latest_events(fleet_store: Store) -> None:
    # the two evictions are followed by frank's submission, dispatch, start and dave's
    # submission: four events
    assert fleet_store.recent_evictions(10, scan_events=4) == []
    assert len(fleet_store.recent_evictions(10, scan_events=6)) == 1
    assert len(fleet_store.recent_evictions(10, scan_events=1000)) == 2


def test_the_sdk_bounds_how_many_it_asks_for(fleet_store: Store, tmp_path: Path) -> None:
    client = Client(Settings.from_env({"EBBTIDE_HOME": str(tmp_path)}), store=fleet_store)
    assert len(client.recent_evictions()) == 2
    for bad in (-1, 1001, "3", 2.5):
        with pytest.raises(SpecError, match="limit"):
            client.recent_evictions(bad)  # type: ignore[arg-type]


def test_a_snapshot_through_the_server_is_the_one_from_the_store(
    tmp_path: Path, sqlite_url: str
) -> None:
    store = Store(sqlite_url)
    ids = make_fleet(store)
    token = store.tokens.create("bob", by="root")[1]
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path), "EBBTIDE_DB_URL": sqlite_url})
    try:
        with serving(create_app(settings, store=store), tmp_path) as served:
            env = {"EBBTIDE_URL": served.url, "EBBTIDE_TOKEN": token}
            with Client(Settings.from_env(env)) as remote:
                assert remote.recent_evictions(1) == store.recent_evictions(1)
                with pytest.raises(SpecError, match="limit"):
                    remote.recent_evictions(5000)
                far = fetch_snapshot(remote, now=lambda: 1.0)
            near = fetch_snapshot(Client(settings, store=store), now=lambda: 1.0)
    finally:
        store.close()
    assert [g.name for g in far.gpus] == [g.name for g in near.gpus]
    assert [[a.job_id for a in g.attempts] for g in far.gpus] == [
        [a.job_id for a in g.attempts] for g in near.gpus
    ]
    assert far.totals == near.totals and far.queues == near.queues
    assert far.evictions == near.evictions
    assert [e.job_id for e in far.evictions] == [ids["erin"], ids["carol"]]
    bob = next(a for g in far.gpus for a in g.attempts if a.owner == "bob")
    assert bob.paused and far.notes == ()
