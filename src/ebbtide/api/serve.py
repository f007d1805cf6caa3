"""Serving the API: on TCP (TLS optional) and on a Unix socket, in one process.

The sockets are bound here, before anything is served, so a port in use or a socket path
that cannot be used is one clear :class:`UserError`; and they listen at once, so a
client that connects while the server is still starting waits instead of failing.  Each
socket gets a uvicorn server of its own (TLS is for TCP only; the socket's callers are
known by the kernel), with :class:`~ebbtide.api.peercred.PeerCredProtocol`; SIGINT and
SIGTERM stop them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from ebbtide.api.peercred import PeerCredProtocol
from ebbtide.errors import UserError

log = logging.getLogger("ebbtide.api")

#: Where ``ebb server`` listens on TCP when it is not told.
DEFAULT_LISTEN = "127.0.0.1:8786"
#: How long a stopping server lets requests in progress finish, in seconds.
GRACEFUL_STOP_S = 5.0
#: The longest path of a Unix socket, in bytes (``sun_path`` less its NUL).
MAX_SOCKET_PATH_BYTES = 107


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` (port 0: any free one)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--listen: expected HOST:PORT (like {DEFAULT_LISTEN}), got {text!r}")
    return host, int(port)


def bind_tcp(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--listen: cannot resolve {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "the address is in use (another server?)" if exc.errno == errno.EADDRINUSE else None
        raise UserError(f"cannot listen on {host}:{port}: {why or exc.strerror}") from None
    return sock


def is_loopback(sock: socket.socket) -> bool:
    try:
        return ipaddress.ip_address(sock.getsockname()[0]).is_loopback
    except ValueError:
        return False


def bind_unix(path: Path, mode: int) -> socket.socket:
    """A listening socket at ``path`` with ``mode``; a stale socket file left there by a
    server that died is replaced, anything else there is refused."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise UserError(
            f"--socket: {path} is longer than a Unix socket path may be "
            f"({MAX_SOCKET_PATH_BYTES} bytes); choose a shorter one"
        )
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, mode)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UserError(f"--socket: cannot listen at {path}: {exc.strerror}") from None
    return sock


def _clear_stale(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserError(f"--socket: cannot use {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise UserError(f"--socket: {path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        os.unlink(path)  # nobody answers: left by a server that is gone
        return
    finally:
        probe.close()
    raise UserError(f"--socket: a server already listens at {path}")


def check_tls(tls: Tls) -> None:
    """Load the certificate and key once, to refuse bad ones in one line."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise UserError(
            f"--tls-cert/--tls-key: cannot load {tls.cert} and {tls.key}: {why}"
        ) from None


#: uvicorn's lines about the process, which each of its servers (one per socket) writes
_PROCESS_LINES = frozenset(
    {"Started server process [%d]", "Shutting down", "Finished server process [%d]"}
)


class _OncePerProcess(logging.Filter):
    """Lets each of uvicorn's :data:`_PROCESS_LINES` through once, not once per socket."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in _PROCESS_LINES:
            return True
        if record.msg in self.said:
            return False
        self.said.add(str(record.msg))
        return True


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to :class:`ApiServer` (it runs several)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """The app on already bound sockets: TCP (with ``tls``, if given) and Unix."""

    def __init__(
        self,
        app: object,
        *,
        tcp: socket.socket | None = None,
        unix: socket.socket | None = None,
        tls: Tls | None = None,
    ) -> None:
        self.servers: list[tuple[_Server, socket.socket]] = []
        for sock, secure in ((tcp, tls), (unix, None)):
            if sock is None:
                continue
            config = uvicorn.Config(
                app,  # type: ignore[arg-type]
                http=PeerCredProtocol,
                lifespan="off",
                log_config=None,
                # the caller's address is the socket's: an X-Forwarded-For header from
                # a local client would otherwise be recorded as where an action came from
                proxy_headers=False,
                timeout_graceful_shutdown=int(GRACEFUL_STOP_S),
                ssl_certfile=secure.cert if secure else None,
                ssl_keyfile=secure.key if secure else None,
            )
            self.servers.append((_Server(config), sock))

    async def serve(self) -> None:
        once = _OncePerProcess()
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(once)
        try:
            await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in self.servers))
        finally:
            uvicorn_log.removeFilter(once)

    def stop(self) -> None:
        for server, _ in self.servers:
            server.should_exit = True

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
            await self.serve()

        asyncio.run(main())


def socket_inode(path: Path) -> int:
    """The inode of the socket file just bound (to remove only that one at the end)."""
    return os.stat(path).st_ino


def remove_socket(path: Path, inode: int) -> None:
    """Remove the socket file, unless another server has replaced it meanwhile."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass
