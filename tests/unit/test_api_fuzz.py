"""Fuzzing ``ebb server``: whatever a client sends — bodies, query parameters, ids in
paths — the answer is a 2xx, or a 4xx whose ``detail`` says what was wrong; never a 500.

Reproducible (derandomized) and a few seconds long; the server runs in process on a
SQLite store (:mod:`tests.serving`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.api.app import create_app
from ebbtide.config.settings import Settings
from ebbtide.queue.spec import CONVENIENCE_INPUTS, JobSpec
from ebbtide.queue.store import Store
from tests.serving import serving
from tests.unit.fuzz_support import fuzz

POLICY = "queues:\n  default: {}\n  team:\n    users: [alice]\nadmins: [carol]\n"

TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
HUGE = st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30)])
#: numbers a JSON client can send (httpx refuses NaN and the infinities: a body that holds
#: them as text is :func:`test_non_json_numbers_as_text`'s)
NUMBER = st.one_of(
    st.integers(-(2**70), 2**70), HUGE, st.floats(allow_nan=False, allow_infinity=False)
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
#: what the spec's fields are given: sane, mistyped and absurd
VALUE = st.one_of(
    JSON,
    st.sampled_from(["25%", "4GiB", "30s", "TERM", "/tmp", "rel/dir", "a\x00b", "", "1-3"]),
    st.lists(TEXT, min_size=1, max_size=3),
    st.fixed_dictionaries({"start": st.integers(0, 3), "end": st.integers(0, 5)}),
)
FIELDS = sorted({*JobSpec.model_fields, *CONVENIENCE_INPUTS, "comand", "gpu_mem"})
SPEC = st.dictionaries(st.sampled_from(FIELDS), VALUE, max_size=6).map(
    lambda d: {"command": ["true"], **d}
)
ID_TEXT = st.one_of(
    HUGE.map(str), st.integers(-5, 20).map(str), TEXT, st.sampled_from(["1e3", "0x10", " 1"])
)
USERS = ("alice", "bob", "carol")


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, dict]]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "policy.yaml").write_text(POLICY)
    url = f"sqlite:///{root / 'ebbtide.db'}"
    policy = str(root / "policy.yaml")
    settings = Settings.from_env(
        {"EBBTIDE_HOME": str(root), "EBBTIDE_DB_URL": url, "EBBTIDE_POLICY": policy}
    )
    store = Store(url)
    tokens = {u: store.tokens.create(u, by="root")[1] for u in USERS}
    try:
        with (
            serving(create_app(settings, store=store), root) as served,
            httpx.Client(base_url=served.url + "/v1", timeout=30) as client,
        ):
            for user in USERS:  # jobs to act on
                client.post("/jobs", json={"command": ["x"]}, headers=_auth(tokens, user))
            yield client, tokens
    finally:
        store.close()


def _auth(tokens: dict[str, str], user: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens[user]}"} if user else {}


def _answered(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        detail = response.json()["detail"]
        assert isinstance(detail, str) and detail.strip(), response.text


@fuzz(150)
@given(spec=st.one_of(SPEC, JSON), user=st.sampled_from(USERS), workdir=st.none() | TEXT)
def test_submitting_anything(http: Any, spec: Any, user: str, workdir: str | None) -> None:
    client, tokens = http
    params = {} if workdir is None else {"workdir": workdir}
    _answered(client.post("/jobs", json=spec, params=params, headers=_auth(tokens, user)))


@fuzz(60)
@given(body=st.binary(max_size=64), user=st.sampled_from(USERS))
def test_submitting_bytes_that_are_not_json(http: Any, body: bytes, user: str) -> None:
    client, tokens = http
    headers = {**_auth(tokens, user), "Content-Type": "application/json"}
    _answered(client.post("/jobs", content=body, headers=headers))


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize(
    "field", ["account", "walltime_s", "priority", "memory_mib", "compute_pct"]
)
def test_non_json_numbers_as_text(http: Any, number: str, field: str) -> None:
    """Python's json module reads these, though JSON has no such numbers: a body holding
    one is answered, never a server error."""
    client, tokens = http
    headers = {**_auth(tokens, "alice"), "Content-Type": "application/json"}
    body = f'{{"command": ["true"], "{field}": {number}}}'.encode()
    _answered(client.post("/jobs", content=body, headers=headers))


@fuzz(150)
@given(
    params=st.dictionaries(
        st.sampled_from(["state", "owner", "queue", "array_id", "limit", "x"]),
        st.one_of(TEXT, HUGE.map(str), st.lists(TEXT, max_size=3)),
        max_size=4,
    ),
    user=st.sampled_from(USERS),
)
def test_listing_with_any_filters(http: Any, params: dict[str, Any], user: str) -> None:
    client, tokens = http
    _answered(client.get("/jobs", params=params, headers=_auth(tokens, user)))


@fuzz(200)
@given(
    job_id=ID_TEXT,
    action=st.sampled_from(["", "/events", "/cancel", "/hold", "/release", "/logs", "/x"]),
    method=st.sampled_from(["GET", "POST", "DELETE"]),
    params=st.dictionaries(
        st.sampled_from(["attempt", "stream", "tail_bytes"]), ID_TEXT, max_size=3
    ),
    user=st.sampled_from([*USERS, None]),
)
def test_any_job_id_and_action(
    http: Any, job_id: str, action: str, method: str, params: dict[str, str], user: str | None
) -> None:
    client, tokens = http
    path = f"/jobs/{quote(job_id, safe='')}{action}"
    _answered(client.request(method, path, params=params, headers=_auth(tokens, user)))


@fuzz(100)
@given(
    node=TEXT.filter(bool),
    action=st.sampled_from(["drain", "undrain"]),
    body=st.one_of(JSON, st.dictionaries(st.sampled_from(["device", "reason"]), JSON)),
    user=st.sampled_from(USERS),
    act_as=st.none() | TEXT.filter(lambda t: t.isascii() and t.isprintable() and t == t.strip()),
)
def test_any_node_action(
    http: Any, node: str, action: str, body: Any, user: str, act_as: str | None
) -> None:
    client, tokens = http
    headers = _auth(tokens, user)
    if act_as:
        headers["X-Ebbtide-Act-As"] = act_as
    path = f"/nodes/{quote(node, safe='')}/{action}"
    _answered(client.post(path, content=json.dumps(body), headers=headers))


def test_the_fuzzed_server_still_answers(http: Any) -> None:
    client, tokens = http
    assert client.get("/whoami", headers=_auth(tokens, "alice")).json()["user"] == "alice"
