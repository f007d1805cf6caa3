"""``ebb server``'s uvicorn servers, one per socket, in one process."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from fastapi import FastAPI

from ebbtide.api.serve import ApiServer, bind_tcp, bind_unix


def test_the_process_lines_are_logged_once_however_many_sockets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server on TCP and a Unix socket said "Started server process", "Shutting down"
    and "Finished server process" twice each: one uvicorn server per socket."""
    tcp = bind_tcp("127.0.0.1", 0)
    unix = bind_unix(tmp_path / "api.sock", 0o600)
    server = ApiServer(FastAPI(), tcp=tcp, unix=unix)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not all(s.started for s, _ in server.servers):
            await asyncio.sleep(0.01)
        server.stop()
        await task

    caplog.set_level(logging.INFO, logger="uvicorn.error")
    try:
        asyncio.run(main())
    finally:
        tcp.close()
        unix.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    for said in ("Started server process", "Shutting down", "Finished server process"):
        assert sum(line.startswith(said) for line in lines) == 1, lines
    assert not logging.getLogger("uvicorn.error").filters  # nothing left behind
