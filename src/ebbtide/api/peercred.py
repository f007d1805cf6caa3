"""Who is at the other end of the server's Unix socket, as the kernel says.

On a Unix socket the kernel records the connecting process's pid, uid and gid when it
connects (``SO_PEERCRED``); no one can claim another's.  uvicorn hands the application
no socket, so :class:`PeerCredProtocol` (uvicorn's h11 protocol, one instance per
connection) reads them when the connection is made and puts them in the ASGI scope's
``state`` of every request on it, under :data:`PEER_STATE`.  It sets that key on every
connection — None for TCP — so nothing a client sends can fill it in.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: The key of the scope's ``state`` that holds the caller's :class:`Peer` (or None).
PEER_STATE = "ebbtide_peer"

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    """A Unix-socket caller, per the kernel."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        return f"socket uid {self.uid} pid {self.pid}"


def peer_of(sock: Any) -> Peer | None:
    """The peer credentials of a connected Unix socket; None for any other socket."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


class PeerCredProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with the peer's credentials in each request's state."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = peer_of(transport.get_extra_info("socket"))
        # a copy per connection: the shared state of the server is left alone
        self.app_state = {**self.app_state, PEER_STATE: peer}
