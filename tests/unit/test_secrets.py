"""No secret of the agent's reaches a job, and none is printed in an error."""

from __future__ import annotations

import pytest

from ebbtide.config.settings import redacted
from ebbtide.messaging.bus import BrokerUnavailable, Bus
from ebbtide.queue.spec import JobSpec
from ebbtide.workers.launch import env_for
from tests.unit.builders import JobRow


def test_the_agents_credentials_and_settings_never_reach_a_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EBBTIDE_DB_URL", "postgresql://ebb:s3cret@db/ebbtide")
    monkeypatch.setenv("EBBTIDE_REDIS_URL", "redis://:s3cret@redis:6379/0")
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    monkeypatch.setenv("EBBTIDE_ADMINS", "root")
    monkeypatch.setenv("HOME_OF_THE_JOB", "kept")
    env = env_for(
        JobSpec(command=["true"], env={"MINE": "1"}),
        JobRow(),
        1,
        node="n1",
        devices=[],
        ckpt_dir=tmp_path,
        status_path=tmp_path / "status.jsonl",
    )
    assert not any("s3cret" in v for v in env.values())
    assert "EBBTIDE_ADMINS" not in env
    assert env["HOME_OF_THE_JOB"] == "kept" and env["MINE"] == "1"
    assert env["EBBTIDE_JOB_ID"] == "7"  # the job's contract is there


def test_what_the_user_sets_in_the_jobs_own_environment_is_kept(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    # what a user puts in -v is the user's own: it stays (it is not the agent's secret)
    env = env_for(
        JobSpec(command=["true"], env={"EBBTIDE_DB_URL": "sqlite:///mine.db"}),
        JobRow(),
        1,
        node="n1",
        devices=[],
        ckpt_dir=tmp_path,
        status_path=tmp_path / "status.jsonl",
    )
    assert env["EBBTIDE_DB_URL"] == "sqlite:///mine.db"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@redis.example.com:6379/0", "redis://:***@redis.example.com:6379/0"),
        ("postgresql://ebb:s3cret@db/ebbtide", "postgresql://ebb:***@db/ebbtide"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_the_cannot_reach_redis_error_does_not_print_the_password() -> None:
    with pytest.raises(BrokerUnavailable) as caught:
        Bus.redis("redis://:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_new_sqlite_store_and_its_directory_are_private(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ebbtide.queue.store import Store

    home = tmp_path / "home"
    store = Store(f"sqlite:///{home / 'ebbtide.db'}")
    try:
        store.submit(JobSpec(command=["true"], env={"TOKEN": "s3cret"}), "alice",
                     defaults_deadline_s=30)  # fmt: skip
        assert (home / "ebbtide.db").stat().st_mode & 0o777 == 0o600
        assert home.stat().st_mode & 0o777 == 0o700
        for side in home.glob("ebbtide.db-*"):  # WAL and shared memory: as private
            assert side.stat().st_mode & 0o077 == 0, side
    finally:
        store.close()
