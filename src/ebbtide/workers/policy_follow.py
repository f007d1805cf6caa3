"""A lone node agent's policy, followed as it changes, so that the rules the agent enforces
itself (margins, pausing, suspending) are the scheduler's: with no policy file of its own,
the one the scheduler publishes to the store (``Store.publish_policy``); with one, that
file, read again when its text changes (a ConfigMap updated in place: a trial found the
agents of a Kubernetes install kept their old margins until restarted, and a restart
evicts the node's jobs).  ``ebb worker`` wires it (:func:`ebbtide.runtime.build`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from ebbtide.config.policy import Policy, load_policy, parse_published
from ebbtide.errors import ConfigError
from ebbtide.queue.interface import JobStore

log = logging.getLogger("ebbtide")

#: How often a worker with no policy file looks for a new published policy, in seconds.
FOLLOW_PERIOD_S = 10.0


class PolicyFollower:
    """A lone node agent's policy when it has no file of its own: the one the scheduler
    publishes to the store, read when the agent is built, then looked at every
    ``period_s`` (and at once on SIGHUP) and applied when its text changes, so that the
    rules the agent enforces itself (margins, pausing, suspending) are the scheduler's.
    Never ``allow_root_jobs: true``: root shells on a host are for its own policy file to
    allow, not for whoever can write the store.  A policy this ebbtide cannot read is
    reported and the one in force kept."""

    def __init__(self, store: JobStore | None, *, period_s: float = FOLLOW_PERIOD_S) -> None:
        self.store = store
        self.period_s = period_s
        #: what a new policy is handed to (the runtime's ``apply_policy``)
        self.apply: Callable[[Policy], None] = lambda _policy: None
        #: the published text last read (applied, or refused)
        self.seen: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="policy-follower", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.period_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.check()

    def check(self) -> bool:
        """Apply the published policy if its text changed; whether it applied one."""
        policy = self.read()
        if policy is None:
            return False
        self.apply(policy)
        return True

    def read(self) -> Policy | None:
        """The published policy if its text changed since the last read (and can be
        read here), else None."""
        if self.store is None:
            return None
        try:
            published = self.store.published_policy()
        except Exception as exc:  # the store is away: the next look tries again
            log.warning("cannot read the scheduler's policy: %s", str(exc).splitlines()[0])
            return None
        if published is None or published[0] == self.seen:
            return None
        text, source, _ = published
        self.seen = text
        try:
            policy = parse_published(text, source)
        except ConfigError as exc:
            for line in str(exc).splitlines():
                log.error("the scheduler's policy cannot be read here; keeping mine: %s", line)
            return None
        log.info("policy: %s, as the scheduler published it", source or "built-in defaults")
        if policy.allow_root_jobs:
            # the gate to root shells on this host stays with this host's root: whoever
            # can write the store must not open it for every worker at once
            log.warning(
                "the scheduler's policy allows root's jobs; this worker does not follow "
                "that: give it a policy file of its own (--policy) that does"
            )
            policy = policy.model_copy(update={"allow_root_jobs": False})
        return policy


class FileFollower(PolicyFollower):
    """A lone node agent's own policy file, read again every ``period_s`` (and at once on
    SIGHUP) and applied when its text changed; one that no longer reads is reported and
    the policy in force kept.  (The ``kubernetes:`` section is the executor's, taken at
    start: a change there needs a restart.)"""

    def __init__(self, path: Path, *, period_s: float = FOLLOW_PERIOD_S) -> None:
        super().__init__(None, period_s=period_s)
        self.path = path
        self.seen = self._text()

    def _text(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def read(self) -> Policy | None:
        text = self._text()
        if text is None or text == self.seen:
            return None
        self.seen = text
        try:
            policy = load_policy(self.path)
        except ConfigError as exc:
            for line in str(exc).splitlines():
                log.error("policy not reloaded, keeping the old one: %s", line)
            return None
        log.info("policy reloaded from %s: it changed", self.path)
        return policy
