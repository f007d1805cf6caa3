"""The SDK through ``ebb server``: what ``Client()`` is when ``EBBTIDE_URL`` is set.

Same methods, results and exceptions as :class:`ebbtide.client.Client`; the server
decides who the caller is: the token's user (``EBBTIDE_TOKEN``, else the file
``~/.config/ebbtide/token``, which must be readable by its owner alone), or on a Unix
socket (``unix:///run/ebbtide/api.sock``) the connecting user as the kernel says.
``EBBTIDE_USER`` asks, as an admin, to act for another user.

Messages name the server's URL, never the token.
"""

from __future__ import annotations

import builtins
import copy
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from ebbtide.api.wire import ACT_AS_HEADER, PREFIX, error_in, job_in
from ebbtide.args import flag, whole
from ebbtide.attempt_logs import DEFAULT_TAIL_BYTES, LogTail
from ebbtide.client_base import ClientBase, spec_from
from ebbtide.config.settings import Settings, redacted
from ebbtide.errors import ConfigError, ServerUnavailable, SpecError
from ebbtide.identity import Caller
from ebbtide.queue.models import Job
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS
from ebbtide.queue.rightsizing import RECENT_JOBS
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import job_to_dict
from ebbtide.units import shown
from ebbtide.workdir import base_directory, with_submit_host

#: How long one request may take, in seconds (a large array's submission is the longest).
REQUEST_TIMEOUT_S = 60.0
#: How long connecting may take, in seconds.
CONNECT_TIMEOUT_S = 10.0
#: Jobs whose server-side shape :meth:`RemoteClient.as_dict` remembers.
MAX_REMEMBERED_JOBS = 100_000


def token_path() -> Path:
    return Path.home() / ".config" / "ebbtide" / "token"


def read_token(settings: Settings) -> str | None:
    """``EBBTIDE_TOKEN``, else the token file (refused if others may read it)."""
    token = settings.token
    if token is not None:  # as the file's: a token pasted with a newline or a space
        token = token.strip()
    if token is None:
        path = token_path()
        try:
            info = path.stat()
        except OSError:
            return None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}); a "
                f"token is a password: chmod 600 {path}"
            )
        try:
            token = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the token in {path}: {exc}") from None
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ConfigError(
            "the token (EBBTIDE_TOKEN or the token file) is not one: it holds "
            "characters no ebbtide token has"
        )
    return token or None


class RemoteClient(ClientBase):
    """Jobs and nodes through ``ebb server`` (see the module doc)."""

    def __init__(self, settings: Settings, *, workdir: str | None = ".") -> None:
        if not settings.url:
            raise ConfigError("EBBTIDE_URL is not set: there is no server to talk to")
        self.settings = settings
        self.workdir = workdir
        self._scheduler_running: bool | None = None
        self.url = settings.url
        self._where = redacted(self.url)
        headers = {}
        # on the Unix socket the kernel says who calls: only an explicit EBBTIDE_TOKEN is
        # sent there, so a token file (perhaps badly kept) does not stand in the way
        unix = self.url.startswith("unix:")
        token = settings.token if unix else read_token(settings)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if settings.act_as:
            if not settings.act_as.isascii():
                raise ConfigError(
                    f"EBBTIDE_USER={settings.act_as!r}: only ASCII names go to a server"
                )
            headers[ACT_AS_HEADER] = settings.act_as
        base, transport = _endpoint(self.url)
        self._http = httpx.Client(
            base_url=base + PREFIX,
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        )
        self._caller: Caller | None = None
        self._shapes: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    # -- the wire -----------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnavailable(
                f"cannot reach the ebb server at {self._where}: {_reason(exc, self.url)}"
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            return body
        raise error_in(response.status_code, body, f"the ebb server at {self._where}")

    def _job(self, data: dict[str, Any]) -> Job:
        """The row of a job's JSON; its ``qstat --json`` shape is kept for :meth:`as_dict`."""
        job = job_in(data)
        if len(self._shapes) >= MAX_REMEMBERED_JOBS:
            self._shapes.clear()
        # the qstat --json keys only (GET /jobs/{id} sends the qstat -f ones too)
        keys = [*job_to_dict(job), "backoff_until"]
        self._shapes[job.id or 0] = (job.model_dump(), {k: data.get(k) for k in keys})
        return job

    # -- the SDK ------------------------------------------------------------------------

    @property
    def caller(self) -> Caller:
        """Who the server takes this client for (asked once)."""
        if self._caller is None:
            me = self._call("GET", "/whoami")
            self._caller = Caller(me["user"], admin=me["admin"], by=me["by"], via=me["via"])
        return self._caller

    def close(self) -> None:
        self._http.close()

    def submit_many(
        self, spec: JobSpec | None = None, *, allow_future: bool = False, **fields: Any
    ) -> builtins.list[int]:
        spec = with_submit_host(spec_from(spec, fields))
        params: dict[str, Any] = {}
        if self.workdir is not None:
            params["workdir"] = base_directory(self.workdir)
        if allow_future:
            params["allow_future"] = "true"
        body = spec.model_dump(mode="json", exclude_unset=True)
        answer = self._call("POST", "/jobs", json=body, params=params)
        self.last_notes = [str(note) for note in answer.get("notes") or []]
        return list(answer["ids"])

    def get(self, job_id: int) -> Job:
        return self._job(self._call("GET", f"/jobs/{whole(job_id, 'job_id')}"))

    def list(
        self,
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        owner: str | None = None,
        queue: str | None = None,
        array_id: int | None = None,
        limit: int | None = None,
    ) -> builtins.list[Job]:
        params: dict[str, Any] = {"owner": owner, "queue": queue, "array_id": array_id}
        params["limit"] = limit
        params["state"] = _state_param(state)
        sent = {k: v for k, v in params.items() if v is not None}
        return [self._job(data) for data in self._call("GET", "/jobs", params=sent)]

    def table(
        self,
        columns: Sequence[str],
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        owner: str | None = None,
    ) -> builtins.list[tuple[Any, ...]]:
        params = {"owner": owner, "state": _state_param(state)}
        sent = {k: v for k, v in params.items() if v is not None}
        answer = self._call("GET", "/qstat", params=sent)
        self._scheduler_running = answer.get("scheduler_running")
        at = {name: i for i, name in enumerate(answer["fields"])}
        for name in columns:  # as the store's client says it
            if name not in at:
                raise SpecError("columns", f"{shown(name, 40)} is not a column of the table")
        return [tuple(row[at[name]] for name in columns) for row in answer["rows"]]

    def scheduler_running(self) -> bool | None:
        """What the server said with the last :meth:`table`: whether a scheduler leads
        its store (it says only when a job listed is queued with no reason yet)."""
        return self._scheduler_running

    def events(self, job_id: int) -> builtins.list[dict[str, Any]]:
        return list(self._call("GET", f"/jobs/{whole(job_id, 'job_id')}/events"))

    def describe(self, job_id: int) -> dict[str, Any]:
        data = self._call("GET", f"/jobs/{whole(job_id, 'job_id')}")
        data.pop("spec", None)
        return dict(data)

    def recommend(
        self,
        job_id: int | None = None,
        *,
        user: str | None = None,
        queue: str | None = None,
        last: int = RECENT_JOBS,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"job_id": job_id, "user": user, "queue": queue}
        params["last"] = whole(last, "last")
        if job_id is not None:
            params["job_id"] = whole(job_id, "job_id")
        sent = {k: v for k, v in params.items() if v is not None}
        return dict(self._call("GET", "/recommendations", params=sent))

    def as_dict(self, job: Job | int) -> dict[str, Any]:
        """The ``qstat --json`` shape of a job this client fetched (or of the job a handle
        or an id names: fetched now), as the server made it (for any other Job, its fields
        with ``backoff_until`` None: that is the server policy's to say)."""
        job = self._job_of(job)
        seen = self._shapes.get(job.id or 0)
        if seen is not None and seen[0] == job.model_dump():
            return copy.deepcopy(seen[1])
        return {**job_to_dict(job), "backoff_until": None}

    def queue_stats(self) -> dict[str, dict[str, int]]:
        return dict(self._call("GET", "/queues"))

    def recent_evictions(self, limit: int = 20) -> builtins.list[dict[str, Any]]:
        params = {"limit": whole(limit, "limit", 0)}
        return list(self._call("GET", "/evictions", params=params))

    def report(
        self,
        since: float,
        until: float,
        *,
        queue: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        params = {"since": since, "until": until, "queue": queue, "user": user}
        sent = {k: v for k, v in params.items() if v is not None}
        return dict(self._call("GET", "/report", params=sent))

    def log_tail(
        self,
        job_id: int,
        *,
        attempt: int | None = None,
        stderr: bool = False,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> LogTail:
        params: dict[str, Any] = {"stream": "stderr" if flag(stderr, "stderr") else "stdout"}
        params["tail_bytes"] = whole(tail_bytes, "tail_bytes")
        if attempt is not None:
            params["attempt"] = whole(attempt, "attempt")
        data = self._call("GET", f"/jobs/{whole(job_id, 'job_id')}/logs", params=params)
        return LogTail.from_dict(data)

    def cancel(self, job_id: int) -> Job:
        return self._act(job_id, "cancel")

    def alter(self, job_id: int, *, allow_future: bool = False, **changes: Any) -> Job:
        path = f"/jobs/{whole(job_id, 'job_id')}/alter"
        params = {"allow_future": "true"} if allow_future else {}
        return self._job(self._call("POST", path, json=changes, params=params))

    def hold(self, job_id: int) -> Job:
        return self._act(job_id, "hold")

    def release(self, job_id: int) -> Job:
        return self._act(job_id, "release")

    def _act(self, job_id: int, action: str) -> Job:
        return self._job(self._call("POST", f"/jobs/{whole(job_id, 'job_id')}/{action}"))

    def nodes(self) -> builtins.list[dict[str, Any]]:
        return list(self._call("GET", "/nodes"))

    def drain(self, node: str, device: int | None = None, *, reason: str = "") -> None:
        body = {"device": device, "reason": reason}
        self._call("POST", f"/nodes/{quote(node, safe='')}/drain", json=body)

    def forget_node(self, node: str) -> None:
        self._call("DELETE", f"/nodes/{quote(node, safe='')}")

    def undrain(self, node: str, device: int | None = None) -> None:
        self._call("POST", f"/nodes/{quote(node, safe='')}/undrain", json={"device": device})

    def purge(
        self, older_than_s: float, *, batch: int = DEFAULT_BATCH_JOBS, dry_run: bool = False
    ) -> dict[str, Any]:
        body = {"older_than_s": older_than_s, "batch": batch, "dry_run": dry_run}
        # a purge takes as long as it takes, a batch at a time: no read timeout
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        return dict(self._call("POST", "/admin/purge", json=body, timeout=timeout))


def _state_param(
    state: JobState | str | Iterable[JobState | str] | None,
) -> builtins.list[str] | None:
    """``state`` as the ``state`` query parameter's values; None for all."""
    if state is None:
        return None
    items = [state] if isinstance(state, str | JobState) else builtins.list(state)
    return [JobState(s).value if isinstance(s, JobState) else s for s in items]


def _endpoint(url: str) -> tuple[str, httpx.HTTPTransport | None]:
    """The base URL and transport of ``EBBTIDE_URL``."""
    parts = urlsplit(url)
    if parts.scheme == "unix" and parts.path and not parts.netloc:
        return "http://ebbtide", httpx.HTTPTransport(uds=parts.path)
    if parts.scheme in ("http", "https") and parts.hostname:
        if parts.path.strip("/") or parts.query:  # a trial's trap: /v1/v1/qstat, Not Found
            raise ConfigError(
                f"EBBTIDE_URL={redacted(url)!r}: give the server's address alone, with no "
                f"path (ebbtide adds {PREFIX}): {parts.scheme}://{parts.netloc}"
            )
        return url.rstrip("/"), None
    raise ConfigError(
        f"EBBTIDE_URL={redacted(url)!r}: expected http://HOST:PORT, https://HOST:PORT or "
        "unix:///PATH/TO.sock"
    )


def _reason(exc: httpx.TransportError, url: str = "") -> str:
    text = str(exc).strip() or str(exc.__cause__ or "").strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    # a trial's traps: what an http:// URL to a TLS server, and a self-signed
    # certificate, say of themselves gives no hint of the fix
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        reason += " (a private CA's or a self-signed certificate: SSL_CERT_FILE=its PEM)"
    elif url.startswith("http://") and "disconnected without sending a response" in reason:
        reason += " (a server with TLS takes https://)"
    return reason
