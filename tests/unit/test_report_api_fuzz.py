"""Fuzzing ``GET /v1/report`` (``ebb report`` through ``ebb server``): whatever window and
filters a client sends — absurd numbers, text, years past 9999 — the answer is a report,
or a 4xx whose ``detail`` says what was wrong; never a 500.  And
:func:`ebbtide.report.build_report` on random histories: never more harvested than the
slices held, never a negative figure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.api.app import create_app
from ebbtide.clock import FakeClock
from ebbtide.config.settings import Settings
from ebbtide.queue.store import Store
from ebbtide.report import AttemptRow, EventRow, build_report, stamp
from tests.report_fleet import make_history
from tests.serving import serving
from tests.unit.fuzz_support import fuzz

TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)
T0 = 1_700_000_000.0
SECONDS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1e400", "-1e400", "1e15", "-1e15", "253402300800", "0", "-62135596800"]),
    st.floats(T0 - 7200, T0 + 7200).map(repr),
    TEXT,
)


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    root: Path = tmp_path_factory.mktemp("report-fuzz")
    url = f"sqlite:///{root / 'ebbtide.db'}"
    clock = FakeClock(T0)
    store = Store(url, clock=clock)
    make_history(store, clock)
    token = store.tokens.create("alice", by="root")[1]
    settings = Settings.from_env({"EBBTIDE_HOME": str(root), "EBBTIDE_DB_URL": url})
    try:
        with (
            serving(create_app(settings, store=store), root) as served,
            httpx.Client(base_url=served.url + "/v1", timeout=30) as client,
        ):
            yield client, token
    finally:
        store.close()


@fuzz(150)
@given(
    params=st.dictionaries(
        st.sampled_from(["since", "until", "queue", "user", "x"]), SECONDS, max_size=5
    )
)
def test_any_window_and_filters(http: Any, params: dict[str, str]) -> None:
    client, token = http
    response = client.get("/report", params=params, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        detail = response.json()["detail"]
        assert isinstance(detail, str) and detail.strip(), response.text
    else:
        assert response.json()["overall"]["gpu_hours"] >= 0


@pytest.mark.parametrize("t", [1e15, -1e15, 253402300800.0, -62135596800.0, 0.0])
def test_a_stamp_of_any_finite_time_is_text(t: float) -> None:
    assert str(int(t)) in stamp(t) or "T" in stamp(t)


SPAN = st.tuples(st.floats(0, 1000), st.floats(0, 1000)).map(sorted)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[AttemptRow], list[EventRow]]:
    attempts, events, next_id = [], [], 0
    for job in range(draw(st.integers(0, 4))):
        dispatched, ended = draw(SPAN)
        started = draw(st.none() | st.floats(dispatched, ended))
        running = draw(st.booleans())
        attempts.append(
            AttemptRow(
                job_id=job,
                number=1,
                queue=draw(st.sampled_from(["a", "b"])),
                owner="u",
                node="n",
                devices=(0,) * draw(st.integers(1, 2)),
                compute_pct=draw(st.floats(0, 100)),
                memory_mib=1024,
                dispatched_at=dispatched,
                started_at=started,
                ended_at=None if running else ended,
                outcome=None,
            )
        )
        for t in sorted(draw(st.lists(st.floats(0, 1000), max_size=4))):
            next_id += 1
            kind = draw(st.sampled_from(["paused", "thawed"]))
            data = {"kind": draw(st.sampled_from(["pause", "suspend"]))}
            events.append(EventRow(next_id, job, 1, kind, t, "a", "u", data))
    return attempts, events


@fuzz(200)
@given(history=histories(), window=SPAN.filter(lambda s: s[1] - s[0] > 1))
def test_the_harvest_is_never_more_than_the_slices_held(
    history: tuple[list[AttemptRow], list[EventRow]], window: list[float]
) -> None:
    attempts, events = history
    r = build_report(attempts, events, [], since=window[0], until=window[1], now=1000.0)
    held_s = sum(
        a.gpus * max(0.0, min(a.ended_at or 1000.0, window[1]) - max(a.started_at, window[0]))
        for a in attempts
        if a.started_at is not None
    )
    # (GPU-hours are rounded to 6 decimals: 1.8 ms)
    assert 0 <= r["overall"]["gpu_hours"] * 3600 <= held_s + 2e-3
    assert r["overall"]["pauses"]["paused_s"] >= 0
    binned = sum(sum(line) for line in r["timeline"]["gpu_hours"].values())
    assert binned == pytest.approx(r["overall"]["gpu_hours"], abs=1e-4)
