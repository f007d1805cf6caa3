"""The thin client: ``ebb qsub`` and ``ebb qstat`` through an ``ebb server`` on this host's
Unix socket, with the standard library alone.

The SDK costs a new process most of a second in imports (SQLAlchemy, pydantic, the
store's models) before it does anything, about five times what submitting should take.
When ``EBBTIDE_URL`` is ``unix:///PATH`` (an ``ebb server --socket PATH`` on this host),
these two commands do not load it: ``qsub`` reads the script and sends its command line
and text, which the server turns into a job with the same functions the CLI uses
(:func:`ebbtide.queue.qsub.qsub_spec`), and ``qstat`` asks for the rows of its table.  The
kernel tells the server who calls, as for every request on the socket; ``EBBTIDE_TOKEN``
and ``EBBTIDE_USER`` are sent as the SDK sends them.

Any other ``EBBTIDE_URL`` (HTTP, HTTPS) goes through the SDK's remote client, and no
``EBBTIDE_URL`` opens the store.  A server too old to offer these paths is answered by
the SDK's remote client as well.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode, urlsplit

from ebbtide.api.wire import ACT_AS_HEADER, PREFIX, error_in
from ebbtide.errors import ConfigError, ServerUnavailable, UserError

#: How long one request may take, in seconds (the SDK's remote client waits as long).
REQUEST_TIMEOUT_S = 60.0

#: A script whose directives may read the submitting environment (``-V``, ``-v VAR``,
#: Slurm's ``--export``, which is ``ALL`` unless it says otherwise).
_DIRECTIVE = re.compile(r"^#(PBS|EBB|SBATCH)\b", re.MULTILINE)


class NotOffered(Exception):
    """The server has no such path (it is older than this client)."""


def socket_url() -> str | None:
    """The socket path of ``EBBTIDE_URL`` when it is ``unix:///PATH``, else None."""
    url = os.environ.get("EBBTIDE_URL") or ""
    parts = urlsplit(url)
    if parts.scheme == "unix" and parts.path and not parts.netloc:
        return parts.path
    return None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("ebbtide", timeout=REQUEST_TIMEOUT_S)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _headers() -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    # on the socket the kernel says who calls: only an explicit EBBTIDE_TOKEN is sent
    token = os.environ.get("EBBTIDE_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    act_as = os.environ.get("EBBTIDE_USER")
    if act_as:
        if not act_as.isascii():
            raise ConfigError(f"EBBTIDE_USER={act_as!r}: only ASCII names go to a server")
        headers[ACT_AS_HEADER] = act_as
    return headers


def call(
    method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None
) -> Any:
    """The JSON answer of the server on ``EBBTIDE_URL``'s socket to one request; its
    error raised as the SDK raises it (:func:`ebbtide.api.wire.error_in`);
    :class:`NotOffered` when the server does not know ``path``."""
    sock_path = socket_url()
    if sock_path is None:
        raise ConfigError("EBBTIDE_URL is not a unix:/// socket")
    where = f"the ebb server at unix://{sock_path}"
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
    target = PREFIX + path + (f"?{query}" if query else "")
    connection = _UnixConnection(sock_path)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, target, body=data, headers=_headers())
        response = connection.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ServerUnavailable(f"cannot reach {where}: {reason}") from None
    finally:
        connection.close()
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:
        answer = None
    if 200 <= response.status < 300:
        return answer
    if response.status in (404, 405) and not (isinstance(answer, dict) and "error" in answer):
        raise NotOffered(path)  # the framework's own "Not Found": no such route
    raise error_in(response.status, answer, where)


def workdir() -> str:
    """The directory a job submitted from here runs in (the current one)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UserError(
            "the current directory no longer exists; cd to where the job should run, or "
            "give it a cwd"
        ) from None


def qsub(
    opts: Mapping[str, Any],
    args: list[str],
    *,
    script: tuple[str, str] | None,
    allow_future: bool,
) -> dict[str, Any] | None:
    """Submit as ``ebb qsub`` does (see :func:`ebbtide.queue.qsub.qsub_spec` for ``opts``,
    ``args`` and ``script``): the server's answer (``ids``, ``array``, ``notes``), or
    None when the server does not offer it."""
    text = script[1] if script is not None else ""
    # the environment travels only where something may read it, as sbatch's does
    wants_environ = bool(opts.get("export_all") or opts.get("env") or _DIRECTIVE.search(text))
    body = {
        "options": dict(opts),
        "args": args,
        "script": None if script is None else {"name": script[0], "text": script[1]},
        "workdir": workdir(),
        "host": socket.gethostname(),
        "environ": dict(os.environ) if wants_environ else {},
        "allow_future": allow_future,
    }
    try:
        answer: dict[str, Any] = call("POST", "/qsub", body=body)
    except NotOffered:
        return None
    return answer


def qstat_rows(states: list[str], owner: str | None) -> tuple[list[Any], bool | None] | None:
    """The jobs of ``ebb qstat``'s table (in ``states``, all if empty; ``owner``'s, if
    given), each with the fields the server sends (those the table shows among them) as
    attributes, and whether a scheduler leads the server's store (None: not said); None
    when the server does not offer them."""
    try:
        answer = call("GET", "/qstat", params={"state": states, "owner": owner})
    except NotOffered:
        return None
    fields = answer["fields"]
    rows = [SimpleNamespace(**dict(zip(fields, row, strict=True))) for row in answer["rows"]]
    return rows, answer.get("scheduler_running")
