"""An ``ebb server`` in the test's own process: the app on real sockets (TCP on a free
port, and a Unix socket), served by a thread, so tests go through uvicorn, the peer
credentials protocol and HTTP as a caller does, while they reach into the store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from ebbtide.api.serve import ApiServer, bind_tcp, bind_unix


@dataclass(frozen=True)
class Served:
    #: ``http://127.0.0.1:PORT``
    url: str
    #: the Unix socket's path
    socket: Path


@contextmanager
def serving(app: FastAPI, socket_dir: Path) -> Iterator[Served]:
    tcp = bind_tcp("127.0.0.1", 0)
    path = socket_dir / "api.sock"
    unix = bind_unix(path, 0o666)
    server = ApiServer(app, tcp=tcp, unix=unix)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{tcp.getsockname()[1]}", path)
    finally:
        server.stop()
        thread.join(timeout=15)
        for sock in (tcp, unix):
            sock.close()
