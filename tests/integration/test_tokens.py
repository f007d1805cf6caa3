"""``ebb server``'s bearer tokens in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from ebbtide.errors import Unauthenticated, UserError
from ebbtide.queue.store import Store
from ebbtide.queue.tokens import TOKEN_PREFIX


def test_a_token_is_random_prefixed_and_kept_only_as_its_hash(store: Store) -> None:
    first_id, first = store.tokens.create("alice", by="root", note="laptop")
    second_id, second = store.tokens.create("alice", by="root")
    assert first.startswith(TOKEN_PREFIX) and len(first) == len(TOKEN_PREFIX) + 43
    assert first != second and second_id == first_id + 1
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM tokens")).mappings().all()
    dumped = repr([dict(r) for r in rows])
    assert first not in dumped and first[len(TOKEN_PREFIX) :] not in dumped
    assert rows[0]["digest"] == hashlib.sha256(first.encode()).hexdigest()
    info = store.tokens.check(first)
    assert (info.id, info.user, info.note, info.created_by, info.state) == (
        first_id,
        "alice",
        "laptop",
        "root",
        "active",
    )


def test_revoked_and_expired_tokens_are_refused(store: Store) -> None:
    _, kept = store.tokens.create("bob", by="root", expires_s=60)
    revoked_id, revoked = store.tokens.create("bob", by="root")
    assert store.tokens.revoke(revoked_id, by="carol").revoked_by == "carol"
    assert store.tokens.revoke(revoked_id, by="dave").revoked_by == "carol"  # stays as it was
    with pytest.raises(Unauthenticated, match=f"token {revoked_id} was revoked"):
        store.tokens.check(revoked)
    assert store.tokens.check(kept).state == "active"
    store.clock.advance(60)  # type: ignore[attr-defined]
    with pytest.raises(Unauthenticated, match="expired") as info:
        store.tokens.check(kept)
    assert kept not in str(info.value)
    assert [t.state for t in store.tokens.all()] == ["expired", "revoked"]


@pytest.mark.parametrize(
    "token, says",
    [("ebt_" + "x" * 43, "unknown token"), ("hunter2", "not an ebbtide token"), ("", "not an")],
)
def test_unknown_tokens_are_refused(store: Store, token: str, says: str) -> None:
    with pytest.raises(Unauthenticated, match=says):
        store.tokens.check(token)


def test_revoking_an_unknown_token_and_bad_notes(store: Store) -> None:
    with pytest.raises(UserError, match="no token with id 7"):
        store.tokens.revoke(7, by="root")
    with pytest.raises(UserError, match="--note"):
        store.tokens.create("alice", by="root", note="a\x00b")
