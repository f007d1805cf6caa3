"""The admin's part of :class:`~ebbtide.client.Client`: nodes and their drains, purging
finished jobs, ``ebb server``'s tokens.  ``nodes`` is anyone's to read; the rest is for
admins only.
"""

from __future__ import annotations

import builtins
import json
import logging
import time
from typing import Any

from ebbtide.args import flag, text, whole
from ebbtide.client_base import ClientBase
from ebbtide.config.policy import Policy
from ebbtide.errors import PermissionDenied, SpecError, UserError
from ebbtide.messaging.liveness import heartbeat_lag, lag_in_words
from ebbtide.queue.drains import WHOLE_NODE
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, MAX_BATCH_JOBS, check_age
from ebbtide.queue.store import Store
from ebbtide.queue.tokens import TokenInfo
from ebbtide.units import shown

log = logging.getLogger("ebbtide.client")

#: Longest reason for a drain, in characters.
MAX_REASON_CHARS = 1000


class ClientAdmin(ClientBase):
    """Nodes, retention and tokens, over the store and the policy of a
    :class:`~ebbtide.client.Client`."""

    store: Store
    policy: Policy

    # -- nodes --------------------------------------------------------------------------

    def nodes(self) -> builtins.list[dict[str, Any]]:
        """Node agents as ``ebb nodes --json`` shows them: heartbeat age, whether the agent
        is ``silent`` (no heartbeat within the policy's timeout), drains, and per
        device the latest online (and offline) usage, the reserve its agent keeps back,
        health, the last fault, cooldown, ``drained`` (the drain in force: its own or its
        node's) and ``device_drain`` (its own: by, reason, at; it outlasts the node's)."""
        now = time.time()
        cooldown_s = self.policy.defaults.eviction_cooldown_s
        drains = {(d.node, d.device): d for d in self.store.drains.drained()}
        # the nodes before their attempts: a node that says it stops refuses new starts,
        # so what it holds as of this read is in the attempts read after it (and "agent
        # stopped", stopping with nothing held, is never said of one still evicting)
        nodes = self.store.nodes()
        held: dict[tuple[str, int], list[Any]] = {}
        for a in self.store.active_attempts():
            for index in a.devices:
                held.setdefault((a.node, index), []).append(a)
        out = []
        # where this store cannot see liveness in Redis (as of the read just made), a live
        # node's heartbeat here may be up to this much older than its last: silent and
        # quiet allow for it
        lag_s, lag_why = heartbeat_lag(self.store)
        timeout_s = self.policy.defaults.heartbeat_timeout_s
        for n in nodes:
            node_drain = drains.get((n.name, WHOLE_NODE))
            devices = json.loads(n.devices_json)
            for d in devices:
                evicted = d.get("last_eviction_at")
                d["cooldown_until"] = evicted + cooldown_s if evicted else None
                own = drains.get((n.name, int(d["index"])))
                drain = own or node_drain
                d["drained"] = drain.describe() if drain else None
                # the device's own drain, which outlasts the node's (undrained apart)
                d["device_drain"] = (
                    {"by": own.by, "reason": own.reason, "at": own.at} if own else None
                )
                d.setdefault("health", "healthy")
                slices = held.get((n.name, int(d["index"])), [])
                d["slices"] = {
                    "jobs": [a.job_id for a in slices],
                    "compute_pct": sum(100.0 if a.gpus else a.compute_pct for a in slices),
                    "memory_mib": sum(a.memory_mib for a in slices),
                }
            out.append(
                {
                    "name": n.name,
                    # never below 0: a heartbeat stamped by a clock a little ahead
                    "heartbeat_age_s": max(0.0, round(now - n.heartbeat_at, 3)),
                    # silent past the policy's heartbeat timeout: the scheduler treats
                    # its attempts as lost and plans nothing there
                    "silent": now - n.heartbeat_at > timeout_s + lag_s,
                    # past half of it: a live agent writes at least every quarter
                    "quiet": now - n.heartbeat_at > timeout_s / 2 + lag_s,
                    # how much older than its last the heartbeat here may be: 0, or 30
                    # where its liveness in Redis was not read (EBBTIDE_REDIS_URL unset)
                    "heartbeat_may_lag_s": lag_s,
                    # why: "redis_unset" (no EBBTIDE_REDIS_URL), "redis_unreachable", None
                    "heartbeat_lag_why": lag_why,
                    "stopping": n.stopping,
                    # whose jobs its agent runs (any, users: all but root's, user:NAME);
                    # None: an older agent did not say
                    "runs_jobs_of": n.runs_jobs_of,
                    "drained": node_drain.describe() if node_drain else None,
                    "devices": devices,
                }
            )
        return out

    def drain(self, node: str, device: int | None = None, *, reason: str = "") -> None:
        """Keep new work off ``node`` (or one device of it); what runs there goes on.
        Admins only."""
        self._device_admin("drain", node, device)
        reason = text(reason, "reason", max_chars=MAX_REASON_CHARS, empty=True)
        if not reason.isprintable():  # a trial's trap: a newline made a row of `ebb nodes`
            raise SpecError(
                "reason", f"must be one line of printable text, got {shown(reason, 60)}"
            )
        target = WHOLE_NODE if device is None else device
        if not reason:  # drained again with no reason: the reason given before stands
            before = (
                d for d in self.store.drains.drained() if (d.node, d.device) == (node, target)
            )
            reason = next((d.reason for d in before), "")
        self.store.drains.drain(node, target, by=self.caller.actor, reason=reason)

    def undrain(self, node: str, device: int | None = None) -> None:
        """Return ``node`` (or one device) to service: lifts its drain, and clears a fault
        the node agent holds against it (it takes work again within 2 s).  A node's undrain
        lifts the node's drain only: a device drained on its own stays drained (``ebb
        node undrain NODE/DEVICE`` lifts that); it clears held faults on every device.
        Admins only."""
        self._device_admin("undrain", node, device)
        self.store.drains.undrain(
            node, WHOLE_NODE if device is None else device, by=self.caller.actor
        )

    def forget_node(self, node: str) -> None:
        """Remove a node whose agent is gone for good from ``ebb nodes`` and the metrics
        (what it ran is requeued, as for any silent node).  A node that still heartbeats
        is refused: stop its agent first.  Admins only."""
        self._device_admin("forget", node, None)
        row = next((n for n in self.store.nodes() if n.name == node), None)
        if row is None:
            raise UserError(f"no node named {node!r}")
        age = self.store.clock.time() - row.heartbeat_at
        base = self.policy.defaults.heartbeat_timeout_s
        # without a view of the nodes' liveness in Redis, a live node's store heartbeat
        # may be that much older than its last
        lag_s, lag_why = heartbeat_lag(self.store)
        timeout = base + lag_s
        running = self.store.active_attempts(node=node)
        if age <= timeout and (not row.stopping or running):
            doing = f"is evicting {len(running)} attempt(s)" if row.stopping else "is alive"
            after = f"{base:g}s of silence"
            if lag_s:
                after += f"; {timeout:g}s here, as {lag_in_words(lag_why)}"
            raise UserError(
                f"node {node!r} heartbeated {age:.0f}s ago: its agent {doing}; stop it "
                f"first (a node is forgotten once it stopped, or after {after})"
            )
        self.store.forget_node(node)

    # -- retention ----------------------------------------------------------------------

    def purge(
        self, older_than_s: float, *, batch: int = DEFAULT_BATCH_JOBS, dry_run: bool = False
    ) -> dict[str, Any]:
        """Remove the jobs that finished more than ``older_than_s`` seconds ago (1 hour
        at least), with their attempts and events, ``batch`` jobs per transaction;
        ``dry_run``: count them, remove nothing.  Never a job not yet finished, one that
        a job not yet finished depends on, or part of an array not all finished that
        long ago.  Admins only.  What went (``ebb admin purge --json``): ``jobs``,
        ``attempts``, ``events``, ``kept``, ``oldest_kept_finished_at``, ``elapsed_s``..."""
        if not self.is_admin:
            raise PermissionDenied(f"only admins may purge finished jobs; {self.user} is not one")
        age = check_age(older_than_s)
        batch = whole(batch, "batch", 1, MAX_BATCH_JOBS)
        result = self.store.purge(age, batch=batch, dry_run=flag(dry_run, "dry_run"))
        log.info(
            "%s %s %s finished jobs, %s attempts, %s events (finished over %gs ago)",
            self.caller.actor,
            "would purge" if dry_run else "purged",
            result.jobs,
            result.attempts,
            result.events,
            age,
        )
        return result.as_dict()

    # -- tokens -------------------------------------------------------------------------

    def create_token(
        self, user: str, *, note: str = "", expires_s: float | None = None
    ) -> tuple[int, str]:
        """Issue a bearer token of ``ebb server`` to ``user``: its id and the token, given
        this once (only its hash is kept).  Admins only, on the store itself."""
        self._token_admin()
        return self.store.tokens.create(user, by=self.caller.actor, note=note, expires_s=expires_s)

    def tokens(self) -> builtins.list[TokenInfo]:
        """Every token issued, oldest first (never the token itself).  Admins only."""
        self._token_admin()
        return self.store.tokens.all()

    def revoke_token(self, token_id: int) -> TokenInfo:
        """Refuse the token ``token_id`` from now on (one already revoked stays as it
        was).  Admins only."""
        self._token_admin()
        return self.store.tokens.revoke(token_id, by=self.caller.actor)

    def _token_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"only admins may manage tokens; {self.user} is not one")

    def _device_admin(self, what: str, node: str, device: int | None) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"only admins may {what} nodes; {self.user} is not one")
        known = {n.name: n for n in self.store.nodes()}
        if node not in known:
            names = ", ".join(sorted(known)) or "none yet"
            raise UserError(f"no node named {node!r} (known: {names})")
        if device is not None:
            indices = sorted(int(d["index"]) for d in json.loads(known[node].devices_json))
            if device not in indices:
                raise UserError(
                    f"node {node!r} has no device {device} (devices: "
                    f"{', '.join(map(str, indices)) or 'none'})"
                )
