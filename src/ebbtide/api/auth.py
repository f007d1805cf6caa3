"""Who a request comes from, and the policy it is judged by.

A request is from

- the user a bearer token was issued to (``Authorization: Bearer ebt_…``), over TCP or
  the Unix socket; a token that is unknown, revoked or expired is refused (401), never
  passed over for the socket's credentials;
- else, on the Unix socket, the user the kernel says connected (``SO_PEERCRED``);
- else no one: 401, with ``WWW-Authenticate: Bearer``.

Admins (the policy's ``admins``, and root) may act for another user with the
``X-Ebbtide-Act-As`` header; the act is recorded as theirs, for that user.  Whether a
user is an admin is decided per request, by the policy in force then.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from starlette.requests import Request

from ebbtide.api.peercred import PEER_STATE, Peer
from ebbtide.api.wire import ACT_AS_HEADER
from ebbtide.config.policy import Policy, load_policy
from ebbtide.errors import Unauthenticated, UserError
from ebbtide.identity import Caller, acting_for, check_user_name, is_admin, user_name
from ebbtide.queue.store import Store

log = logging.getLogger("ebbtide.api")

NO_CREDENTIALS = (
    "no credentials: send a bearer token (the client reads EBBTIDE_TOKEN, else "
    "~/.config/ebbtide/token), or call through the server's Unix socket"
)


class PolicyWatch:
    """The policy file as it is now: read again when its modification time (or size,
    or inode) changes.  A file that no longer loads leaves the last good policy in force,
    and says why in the log."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._policy = load_policy(path)  # at start, a broken file is the caller's error

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> Policy:
        stamp = self._stat()
        if stamp == self._stamp:
            return self._policy
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._policy = load_policy(self.path)
                    log.info("policy %s reloaded", self.path)
                except (UserError, OSError) as exc:
                    log.error(
                        "policy %s: %s; the policy loaded before stays in force", self.path, exc
                    )
        return self._policy


def authenticate(request: Request, store: Store, policy: Policy) -> Caller:
    """The caller of ``request`` (see the module doc), or :class:`Unauthenticated`."""
    peer: Peer | None = request.scope.get("state", {}).get(PEER_STATE)
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must read: Bearer <token>")
        info = store.tokens.check(token.strip())
        where = f"on {peer.describe()}" if peer else f"from {_host(request)}"
        caller = Caller(
            info.user, admin=is_admin(info.user, policy.admins), via=f"token {info.id} {where}"
        )
    elif peer is not None:
        name = user_name(peer.uid)
        caller = Caller(
            name, admin=is_admin(name, policy.admins, uid=peer.uid), via=peer.describe()
        )
    else:
        raise Unauthenticated(NO_CREDENTIALS)
    act_as = request.headers.get(ACT_AS_HEADER)
    if act_as is not None:
        check_user_name(act_as, ACT_AS_HEADER)
    return acting_for(caller, act_as, f"{ACT_AS_HEADER}: {act_as}", "unset EBBTIDE_USER")


def _host(request: Request) -> str:
    return request.client.host if request.client else "?"
