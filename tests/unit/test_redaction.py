"""Secrets never reach a log line, whatever library formats them."""

from __future__ import annotations

import io
import logging

import pytest

from ebbtide.redaction import install, passwords_of, scrub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "cannot connect to redis://:s3cret@10.0.0.1:6379/0 (refused)",
            "cannot connect to redis://:***@10.0.0.1:6379/0 (refused)",
        ),
        (
            "postgresql+psycopg://ebb:p%40ss@db:5432/ebbtide",
            "postgresql+psycopg://ebb:***@db:5432/ebbtide",
        ),
        ("token ebt_AbCdEf0123456789-_xyz revoked", "token ebt_*** revoked"),
        # both clients take a password as a query parameter too
        (
            "Redis redis://r:6379/0?password=s3cret&db=1 (namespace x)",
            "Redis redis://r:6379/0?password=***&db=1 (namespace x)",
        ),
        (
            "postgresql://db/x?sslmode=require&Password=pw42",
            "postgresql://db/x?sslmode=require&Password=***",
        ),
        ("no secret here: http://host:8786/v1/jobs", "no secret here: http://host:8786/v1/jobs"),
    ],
)
def test_scrub_masks_url_passwords_and_tokens(text: str, expected: str) -> None:
    assert scrub(text) == expected


def test_passwords_of_the_processs_urls_are_masked_anywhere() -> None:
    secrets = passwords_of(["redis://:hunter22@r:6379/0", "postgresql://u:p%40ss1@db/x", None])
    assert secrets == ["hunter22", "p%40ss1", "p@ss1"]
    assert scrub("AUTH hunter22 failed; p@ss1", secrets) == "AUTH *** failed; ***"
    assert passwords_of(["redis://:ab@r/0"]) == []  # too short to mask safely
    assert passwords_of(["redis://r/0?password=qu%2Fery9"]) == ["qu%2Fery9", "qu/ery9"]


def test_a_redacted_url_hides_a_password_in_its_query_too() -> None:
    """A review's catch: the startup line would print ``?password=`` in plain text."""
    from ebbtide.config.settings import redacted

    assert redacted("redis://h:6379/0?password=hunter22") == "redis://h:6379/0?password=***"
    assert redacted("redis://:a1b2@h/0?password=c3d4") == "redis://:***@h/0?password=***"
    assert redacted("sqlite:////var/ebb.db") == "sqlite:////var/ebb.db"


@pytest.mark.parametrize(
    ("url", "expected", "password"),
    [
        # SQLAlchemy reads everything up to the first "@" as the password, "/" included
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db", "pa/ss"),
        # redis-py reads up to the last "@": none of it may show
        ("redis://:se@cret@h:6379/0", "redis://:***@h:6379/0", "se@cret"),
        ("redis://:sec#ret@h/0", "redis://:***@h/0", "sec#ret"),
        # an IPv6 host keeps its brackets
        ("redis://u:pw42@[::1]:6379/0", "redis://u:***@[::1]:6379/0", "pw42"),
    ],
)
def test_a_password_with_slashes_or_at_signs_is_masked_whole(
    url: str, expected: str, password: str
) -> None:
    """A review's catch: ``u:pa/ss@h`` printed the whole password, ``se@cret`` half of it."""
    from ebbtide.config.settings import redacted

    assert redacted(url) == expected
    assert scrub(f"cannot connect to {url} (refused)") == f"cannot connect to {expected} (refused)"
    assert password in passwords_of([url])


def test_a_url_in_compact_json_is_masked_and_the_rest_kept() -> None:
    text = '{"a":"postgresql://u:pw@h/db","b":"x@y"}'
    assert scrub(text) == '{"a":"postgresql://u:***@h/db","b":"x@y"}'


def test_the_filter_cleans_messages_args_and_tracebacks() -> None:
    logger = logging.getLogger("test_redaction")
    logger.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    try:
        install(["hunter22"], logger)
        logger.warning("broker %s down", "redis://:hunter22@r:6379/0")
        try:
            raise ConnectionError("AUTH hunter22 rejected by redis://:hunter22@r")
        except ConnectionError:
            logger.exception("reconnecting")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "hunter22" not in text
    assert "broker redis://:***@r:6379/0 down" in text
    assert "ConnectionError: AUTH *** rejected" in text


def test_a_client_commands_warnings_are_worded_as_ours_masked_with_tracebacks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where nothing set logging up (a short client command), a library's warning was
    printed bare by Python's last resort; it reads ``ebb: warning: ...``, masked, and
    keeps its traceback."""
    from ebbtide.cli.common import _client_warnings

    monkeypatch.setenv("EBBTIDE_REDIS_URL", "redis://:hunter22@r:6379/0")
    monkeypatch.setattr(logging, "lastResort", logging.lastResort)  # restored afterwards
    _client_warnings()
    logger = logging.getLogger("test_redaction.client")
    logger.propagate = False  # no handler anywhere: the last resort takes it
    try:
        raise RuntimeError("AUTH hunter22 refused")
    except RuntimeError:
        logger.warning("Redis said no (hunter22)", exc_info=True)
    err = capsys.readouterr().err
    assert err.startswith("ebb: warning: Redis said no (***)\nTraceback"), err
    assert "RuntimeError: AUTH *** refused" in err and "hunter22" not in err
