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
