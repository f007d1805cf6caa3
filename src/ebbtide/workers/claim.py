"""One node agent per node name.

Two agents under one name would both heartbeat for it and both be sent its work: each
would take the other's attempts for lost ones, and jobs would run twice.  So an agent
claims its name before it touches anything:

- on this host, with an ``flock`` on ``run/NAME/agent.lock`` under its home: a second
  agent here is refused at once, and the lock of one that crashed is gone with it (the
  kernel lets it go), so a restart after a crash waits for nothing;
- in the store, for an agent elsewhere under the same name: a heartbeat younger than the
  heartbeat timeout from an incarnation other than this host's last one is watched until
  it either moves on (another agent is alive: refused, saying where to look) or goes
  stale (its agent died: the name is free).  A clean shutdown says ``stopping`` and frees
  the name at once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ebbtide.errors import ConfigError
from ebbtide.queue.models import Node
from ebbtide.queue.store import Store

log = logging.getLogger("ebbtide.agent")

#: How often a heartbeat under our name is looked at while waiting, in seconds.
POLL_S = 0.25


class NodeTaken(ConfigError):
    """Another agent runs under this node name."""


class NodeClaim:
    """This agent's claim on its node name, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, run_dir: Path, name: str) -> None:
        self.run_dir = run_dir
        self.name = name
        self._fd: int | None = None

    @property
    def _lock(self) -> Path:
        return self.run_dir / "agent.lock"

    @property
    def _last(self) -> Path:
        return self.run_dir / "agent.incarnation"  # not *.json: those are shim records

    def acquire(
        self,
        store: Store,
        *,
        started_at: float,
        heartbeat_timeout_s: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Claim the name for an agent that started at ``started_at`` (Unix seconds), or
        raise :class:`NodeTaken` saying which agent has it."""
        self._lock_here()
        try:
            self._wait_for_others(store, heartbeat_timeout_s, sleep)
            self._last.write_text(
                json.dumps({"host": socket.gethostname(), "started_at": started_at})
            )
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let the name go (what the kernel does when the agent's process dies)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _lock_here(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise NodeTaken(
                f"node {self.name}: an agent already runs under this name on this host "
                f"(pid {holder}, lock {self._lock}); stop it first, or give this one "
                "another --node"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def _previous_incarnation(self) -> float | None:
        """When this host's last agent under this name started, if it was this host's."""
        try:
            last = json.loads(self._last.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(last, dict) or last.get("host") != socket.gethostname():
            return None  # a home shared between hosts: another host's record
        started = last.get("started_at")
        return float(started) if isinstance(started, int | float) else None

    def _wait_for_others(
        self, store: Store, timeout_s: float, sleep: Callable[[float], None]
    ) -> None:
        try:
            first = _row(store, self.name)
        except Exception as exc:  # the store thread waits it out; the lock here still holds
            log.warning(
                "node %s: cannot read the store to see whether another agent has this name (%s)",
                self.name,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            return
        if first is None or first.stopping:
            return
        if first.started_at == self._previous_incarnation():
            return  # our own predecessor here, dead: its lock was free
        if store.clock.time() - first.heartbeat_at > timeout_s:
            return
        log.info(
            "node %s: another agent heartbeated under this name %.1fs ago; waiting up to "
            "%gs to see whether it is alive",
            self.name,
            store.clock.time() - first.heartbeat_at,
            timeout_s,
        )
        # a heartbeat that does not move for the whole timeout is a dead agent's (counted
        # in polls, so that a clock that stands still cannot keep us here)
        for _ in range(int(timeout_s / POLL_S) + 2):
            sleep(POLL_S)
            row = _row(store, self.name)
            if row is None or row.stopping or store.clock.time() - row.heartbeat_at > timeout_s:
                return
            if row.heartbeat_at != first.heartbeat_at or row.started_at != first.started_at:
                started = datetime.fromtimestamp(row.started_at, UTC).isoformat(timespec="seconds")
                raise NodeTaken(
                    f"node {self.name}: another agent runs under this name (it started at "
                    f"{started} and heartbeats still; `ebb nodes` shows it); stop it "
                    "first, or give this one another --node"
                )


def _row(store: Store, name: str) -> Node | None:
    return next((n for n in store.nodes() if n.name == name), None)
