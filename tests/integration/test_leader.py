"""One active scheduler: the leader lock on SQLite (flock) and PostgreSQL (advisory lock)."""

from __future__ import annotations

from ebbtide.queue.store import Store
from ebbtide.scheduling.leader import LeaderLock


def test_only_one_holder_and_a_standby_takes_over(db_url, tmp_path):  # type: ignore[no-untyped-def]
    a_store, b_store = Store(db_url), Store(db_url)
    a = LeaderLock(a_store.engine, tmp_path)
    b = LeaderLock(b_store.engine, tmp_path)
    try:
        assert a.try_acquire() is True
        assert a.try_acquire() is True  # re-entrant for its holder
        assert b.try_acquire() is False
        a.release()
        assert a.held is False
        assert b.try_acquire() is True
        assert a.try_acquire() is False
    finally:
        a.release()
        b.release()
        a_store.close()
        b_store.close()
