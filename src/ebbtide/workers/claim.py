"""One node agent per node name.

Two agents under one name would both heartbeat for it and both be sent its work: each
would take the other's attempts for lost ones, and jobs would run twice.  So an agent
claims its name before it touches anything (its journal, the command bus):

- on this host, with an ``flock`` on ``run/NAME/agent.lock`` under its home, taken when
  the agent is made: a second agent here is refused at once, and the lock of one that
  crashed is gone with it (the kernel lets it go), so a restart after a crash waits for
  nothing;
- in the store, for an agent elsewhere under the same name, when the agent starts: a
  heartbeat from an incarnation other than this host's last one is watched until it
  moves (another agent is alive: refused, saying where to look) or stays still for the
  heartbeat timeout (its agent died: the name is free).  Liveness is judged by movement,
  not by comparing this host's clock with the other's; only a heartbeat older than the
  timeout plus :data:`CLOCK_SKEW_S` is taken for dead at first sight.  An agent that says
  it is stopping still holds the name while its attempts are being evicted.

A ``$EBBTIDE_HOME`` on NFS turns the ``flock`` into an NFS lock, which a crashed host may
keep for the server's lease (about 90 s on NFSv4): the refusal then names the host that
holds it.
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

from ebbtide.errors import ConfigError, first_line
from ebbtide.messaging.liveness import heartbeat_slack_s
from ebbtide.queue.models import NodeRow
from ebbtide.queue.store import Store

log = logging.getLogger("ebbtide.agent")

#: How often a heartbeat under our name is looked at while waiting, in seconds.
POLL_S = 0.25
#: Clocks of two hosts may differ by this much, in seconds: a heartbeat older than the
#: timeout plus this is dead at first sight (younger ones are watched for movement).
CLOCK_SKEW_S = 60.0
#: The longest wait for an agent that is stopping to finish evicting its attempts, in s.
MAX_DRAIN_WAIT_S = 900.0


class NodeTaken(ConfigError):
    """Another agent runs under this node name."""


class NodeClaim:
    """This agent's claim on its name: the lock here from construction, the store's
    word at :meth:`acquire`, until :meth:`release`."""

    def __init__(self, run_dir: Path, name: str) -> None:
        self.run_dir = run_dir
        self.name = name
        self._fd: int | None = None
        self.acquired = False
        self._lock_here()

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
        """Claim the name in the store for an agent that started at ``started_at`` (Unix
        seconds), or raise :class:`NodeTaken` saying which agent has it (then the lock
        here is let go too)."""
        if self.acquired:
            return
        if self._fd is None:
            self._lock_here()
        try:
            self._wait_for_others(store, heartbeat_timeout_s, sleep)
            self._last.write_text(
                json.dumps({"host": socket.gethostname(), "started_at": started_at})
            )
        except BaseException:
            self.release()
            raise
        self.acquired = True

    def release(self) -> None:
        """Let the name go (what the kernel does when the agent's process dies)."""
        self.acquired = False
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # an agent dropped without a shutdown (tests)
        self.release()

    def _lock_here(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 128).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise NodeTaken(
                f"node {self.name}: an agent already runs under this name ({holder}, lock "
                f"{self._lock}); stop it first, or give this one another --node"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
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

    def _read(self, store: Store) -> tuple[NodeRow | None, int] | None:
        """The name's row and how many attempts it holds; None when the store cannot
        say (logged: the agent goes on, as it does when its first heartbeat fails)."""
        try:
            row = next((n for n in store.nodes() if n.name == self.name), None)
            held = len(store.active_attempts(node=self.name)) if row is not None else 0
        except Exception as exc:
            log.warning(
                "node %s: cannot read the store to see whether another agent has this name (%s)",
                self.name,
                first_line(exc),
            )
            return None
        return row, held

    def _wait_for_others(
        self, store: Store, timeout_s: float, sleep: Callable[[float], None]
    ) -> None:
        seen = self._read(store)
        if seen is None:
            return
        first, held = seen
        if first is None:
            return
        if first.started_at == self._previous_incarnation():
            return  # our own predecessor here, dead: its lock was free
        if first.stopping and not held:
            return  # stopped cleanly, nothing left to evict
        if store.clock.time() - first.heartbeat_at > timeout_s + CLOCK_SKEW_S:
            return  # silent for long, whatever the clocks say
        log.info(
            "node %s: another agent heartbeats under this name (%s); waiting up to %gs to "
            "see whether it is alive",
            self.name,
            "stopping, its attempts still being evicted" if first.stopping else "running",
            MAX_DRAIN_WAIT_S if first.stopping else timeout_s,
        )
        last_beat, still_since = first.heartbeat_at, time.monotonic()
        give_up = time.monotonic() + max(timeout_s, MAX_DRAIN_WAIT_S)
        polls = 0
        while time.monotonic() < give_up:
            sleep(POLL_S)
            polls += 1
            seen = self._read(store)
            if seen is None:
                return
            row, held = seen
            if row is None or (row.stopping and not held):
                return
            if row.heartbeat_at != last_beat:
                if not row.stopping:
                    raise NodeTaken(self._taken(row))
                last_beat, still_since = row.heartbeat_at, time.monotonic()
                polls = 0
            else:
                # still for the whole timeout (counted in polls too, so that a sleep that
                # does not sleep, in tests, cannot keep us here); longer while this store
                # cannot see the nodes' liveness in Redis, where a live agent's heartbeat
                # may stand still in the store for a while
                still_s = timeout_s + heartbeat_slack_s(store)
                if time.monotonic() - still_since > still_s or polls * POLL_S > still_s + POLL_S:
                    return
        raise NodeTaken(self._taken(first, draining=True))

    def _taken(self, row: NodeRow, draining: bool = False) -> str:
        started = datetime.fromtimestamp(row.started_at, UTC).isoformat(timespec="seconds")
        doing = "is still evicting its attempts" if draining else "heartbeats still"
        return (
            f"node {self.name}: another agent runs under this name (it started at "
            f"{started} and {doing}; `ebb nodes` shows it); stop it first, or give this "
            "one another --node"
        )
