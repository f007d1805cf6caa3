"""The client side of ``ebb server``: where it connects, the token it sends, and errors
raised again as the classes the store raises."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from ebbtide.api.remote import RemoteClient, read_token
from ebbtide.api.wire import error_in, error_out
from ebbtide.client import Client
from ebbtide.config.settings import Settings
from ebbtide.errors import (
    ConfigError,
    EbbtideError,
    JobNotFound,
    PermissionDenied,
    ServerUnavailable,
    SpecError,
    StaleState,
    Unauthenticated,
    UserError,
)


def _settings(**env: str) -> Settings:
    return Settings.from_env({"EBBTIDE_HOME": "/nonexistent", **env})


def test_a_url_makes_client_the_remote_one() -> None:
    with Client(_settings(EBBTIDE_URL="unix:///run/x.sock")) as client:
        assert isinstance(client, RemoteClient)
    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        Client(_settings(EBBTIDE_URL="ftp://host"))


def test_a_store_handed_in_wins_over_the_url(tmp_path: Path) -> None:
    from ebbtide.identity import Caller
    from ebbtide.queue.store import Store

    store = Store(f"sqlite:///{tmp_path / 'db'}")
    try:
        settings = _settings(EBBTIDE_URL="http://server:8786")
        client = Client(settings, store=store, caller=Caller("alice"))
        assert type(client) is Client
    finally:
        store.close()


def test_an_unreachable_server_is_one_line_naming_the_url_not_the_token(tmp_path: Path) -> None:
    env = {"EBBTIDE_URL": "http://user:pw@127.0.0.1:1", "EBBTIDE_TOKEN": "ebt_secret"}
    with Client(_settings(**env)) as client, pytest.raises(ServerUnavailable) as info:
        client.list()
    message = str(info.value)
    assert "http://user:***@127.0.0.1:1" in message and "\n" not in message
    assert "ebt_secret" not in message and "pw" not in message


# httpcore leaves the socket of a failed Unix-socket connect for the collector to close
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_absent_socket_is_one_line_naming_it(tmp_path: Path) -> None:
    gone = f"unix://{tmp_path / 'no.sock'}"
    with Client(_settings(EBBTIDE_URL=gone)) as client, pytest.raises(ServerUnavailable) as info:
        client.get(1)
    assert gone in str(info.value)
    del info
    gc.collect()


def test_the_token_file_must_be_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = _settings(EBBTIDE_URL="http://h:1")
    assert read_token(settings) is None
    path = tmp_path / ".config" / "ebbtide" / "token"
    path.parent.mkdir(parents=True)
    path.write_text("ebt_abc\n")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {path}"):
        read_token(settings)
    os.chmod(path, 0o600)
    assert read_token(settings) == "ebt_abc"
    assert read_token(_settings(EBBTIDE_TOKEN="ebt_env")) == "ebt_env"  # the variable wins
    with pytest.raises(ConfigError) as info:
        read_token(_settings(EBBTIDE_TOKEN="ebt_a b"))
    assert "ebt_a" not in str(info.value)
    # on the Unix socket the kernel says who calls: a token file is not even read there
    os.chmod(path, 0o644)
    RemoteClient(_settings(EBBTIDE_URL=f"unix://{tmp_path}/api.sock")).close()


@pytest.mark.parametrize(
    "error",
    [
        Unauthenticated("no credentials"),
        PermissionDenied("job 1 belongs to alice"),
        JobNotFound(12),
        SpecError("gpu", "expected a share"),
        ConfigError("queue: unknown queue 'x'"),
        UserError("job 3 is running"),
        StaleState("job 3 kept changing"),
    ],
)
def test_errors_cross_the_wire_as_their_own_class(error: EbbtideError) -> None:
    status, body = error_out(error)
    again = error_in(status, body, "the server")
    assert type(again) is type(error) and str(again) == str(error)
    if isinstance(error, SpecError):
        assert isinstance(again, SpecError) and again.field == "gpu"


def test_answers_that_are_not_the_servers_say_so() -> None:
    assert isinstance(error_in(404, {"detail": "Not Found"}, "s"), UserError)
    assert "not as an ebb server does" in str(error_in(502, None, "the ebb server at X"))
    assert "HTTP 503" in str(error_in(503, {"detail": "the store is unavailable"}, "s"))


def test_a_url_with_a_path_is_named_not_sent_to_a_wrong_route() -> None:
    """A trial's trap: ``EBBTIDE_URL=https://h:8786/v1`` called ``/v1/v1/qstat``: "Not
    Found"."""
    for url in ("https://h:8786/v1", "http://h:8786/ebb?x=1"):
        with pytest.raises(ConfigError, match=r"no path \(ebbtide adds /v1\): http"):
            Client(_settings(EBBTIDE_URL=url))
    Client(_settings(EBBTIDE_URL="https://h:8786/")).close()  # a trailing slash is no path


def test_a_token_in_the_environment_is_taken_without_its_newline_as_the_files() -> None:
    token = "ebt_" + "a" * 40
    assert read_token(_settings(EBBTIDE_TOKEN=f"{token} \n")) == token


def test_a_failed_connection_hints_at_the_likely_fix() -> None:
    """A trial's traps: an http:// URL to a TLS server, and a self-signed certificate,
    said nothing of https:// or SSL_CERT_FILE."""
    import httpx

    from ebbtide.api.remote import _reason

    dropped = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    assert _reason(dropped, "http://h:1").endswith("(a server with TLS takes https://)")
    assert "TLS" not in _reason(dropped, "https://h:1")
    unverified = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] self-signed certificate")
    assert "SSL_CERT_FILE=its PEM" in _reason(unverified, "https://h:1")
