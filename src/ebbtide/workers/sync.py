"""The node agent's store thread: everything the agent says to the store or asks of it.

The agent's loop (:mod:`ebbtide.workers.agent`) keeps deadlines, so it never waits for
the store: it journals reports (:mod:`ebbtide.workers.journal`) and reads what this
thread posts to its inbox.  This thread

1. delivers the journal's reports in order (retrying while the store does not answer,
   dropping one that lost a race), and the heartbeats among them: those the scheduler
   must act on at once, the rest once a write period (:mod:`ebbtide.workers.heartbeat`);
2. prepares starts: reads a dispatched job from the store, checks the dispatch is still
   this node's and current, and posts it to the loop;
3. reconciles every ``RECONCILE_PERIOD_S``, with the report that wakes it up to
   ``RECONCILE_EARLY_S`` before it is due, or by itself ``RECONCILE_LATE_S`` after (so
   that it wakes once for a heartbeat and a reconcile): against a view of the loop's
   attempts and the journal position it was taken at (delivered first), it tells the
   loop to kill attempts the store no longer gives to this node, to evict what the store
   says is being evicted, to start what was dispatched here and never arrived, and
   requeues attempts the store thinks run here but do not;
4. takes in admins' undrains (:mod:`ebbtide.workers.undrains`).

Any call the store answers is contact: the agent fences its attempts by
:meth:`StoreSync.silence_s`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ebbtide.clock import SYSTEM_CLOCK, Clock
from ebbtide.errors import EbbtideError, InvalidTransition, StaleState, first_line
from ebbtide.messaging.messages import AttemptChanged, EvictAttempt, StartAttempt
from ebbtide.queue.models import Job
from ebbtide.queue.outcomes import AGENT_LEFT, AGENT_RESTARTED, GONE
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.states import JobState
from ebbtide.queue.store import Store
from ebbtide.workers.heartbeat import TOUCHED, WRITTEN, HeartbeatRules, HeartbeatWriter, Toucher
from ebbtide.workers.journal import Journal, Report
from ebbtide.workers.stale import stale_start
from ebbtide.workers.undrains import UndrainWatch

log = logging.getLogger("ebbtide.agent")

#: How often the store thread reconciles with the store, in seconds.
RECONCILE_PERIOD_S = 0.5
#: How much earlier than due a reconcile may run when the thread is awake for a report
#: anyway, and how long past due the thread waits for one before it wakes for the
#: reconcile alone, in seconds: the reconciles fall in with the agent's heartbeats (also
#: every 0.5 s, posted at a tick of its loop) and the thread wakes half as often, each
#: wake-up costing the node more than the work done in it
RECONCILE_EARLY_S = RECONCILE_PERIOD_S / 2
RECONCILE_LATE_S = 0.1
#: The shortest the store thread waits for a report when nothing is due, in seconds.
MIN_WAIT_S = 0.005
#: How long a graceful stop waits for the store to take the journal's reports, in seconds.
DRAIN_TIMEOUT_S = 30.0
#: How long the store thread waits before trying an undeliverable report again, in s.
RETRY_S = 0.2
#: Errors that mean "the store did not answer": try again later.
TRANSIENT = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DBAPIError, OSError)


@dataclass(frozen=True)
class Prepared:
    """Store → loop: start this dispatched attempt."""

    job: Job
    spec: JobSpec


@dataclass(frozen=True)
class Kill:
    """Store → loop: this attempt is not this node's any more; kill it."""

    job_id: int
    attempt: int
    why: str


#: The loop's attempts as the store thread may see them: journal position, and per job
#: (attempt, being evicted).
View = tuple[int, dict[int, tuple[int, bool]]]


class StoreSync:
    def __init__(
        self,
        name: str,
        store: Store,
        journal: Journal,
        *,
        post: Callable[[Any], None],
        view: Callable[[], View],
        heartbeat: Callable[[], dict[str, Any]],
        notify: Callable[[AttemptChanged], None] | None = None,
        heartbeat_rules: HeartbeatRules | None = None,
        clock: Clock = SYSTEM_CLOCK,
        monotonic: Callable[[], float] | None = None,
        liveness: Toucher | None = None,
    ) -> None:
        self.name = name
        #: what this thread waits on and times its periods by (the agent's clock)
        self.clock = clock
        self.store = store
        self.journal = journal
        self._post = post
        self._view = view
        self._heartbeat_payload = heartbeat
        self._notify_fn = notify
        #: monotonic seconds (default: the clock's)
        self._monotonic = monotonic = monotonic or clock.monotonic
        #: writes the heartbeats the scheduler must see (and one a write period)
        self.heartbeats = HeartbeatWriter(
            name, store, heartbeat_rules, monotonic=monotonic, liveness=liveness
        )
        #: monotonic seconds of the last heartbeat the scheduler has: the store took it,
        #: or Redis did while the scheduler reads liveness there
        self.last_heartbeat_ok = monotonic()
        #: monotonic seconds of the last call the store answered
        self.last_contact_ok = self.last_heartbeat_ok
        self._starts: queue.Queue[StartAttempt] = queue.Queue()
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_reconcile = 0.0
        self._outage_logged = False
        self.started_at = clock.time()
        self.undrains = UndrainWatch(name, post)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"store-{self.name}", daemon=True)
        self._thread.start()

    def request_start(self, cmd: StartAttempt) -> None:
        self._starts.put(cmd)
        self.journal.wake()

    def finish(self, timeout_s: float | None = None) -> None:
        """Deliver what is journaled, requeue attempts dispatched here that never started,
        and stop (a graceful shutdown).  A store that does not answer within ``timeout_s``
        (default ``DRAIN_TIMEOUT_S``) leaves the rest in the journal for the next start."""
        self._draining.set()
        self.journal.wake()
        if self._thread is None:
            return
        self._thread.join(DRAIN_TIMEOUT_S if timeout_s is None else timeout_s)
        if self._thread.is_alive():
            log.warning(
                "the store did not take every report; %d stay in the journal for the next start",
                self.journal.pending(),
            )
            self._stop.set()
            self.journal.wake()
            self._thread.join(5.0)

    def silence_s(self) -> float:
        """How long this node has been cut off from the store, in seconds: since the
        store last answered, or since the scheduler last had a heartbeat (written, or
        touched in Redis while it reads liveness there) less one write period (writes
        failing while reads pass), whichever is longer.  The scheduler gives a node up a
        heartbeat timeout after its last heartbeat, which is at most a write period before
        the last contact: fencing at half the timeout leaves it half the timeout less a
        write period to spare."""
        now = self._monotonic()
        return max(
            now - self.last_contact_ok,
            now - self.last_heartbeat_ok - self.heartbeats.rules.period_s,
        )

    def write_heartbeat(self) -> None:
        """Write the latest heartbeat now (the agent's first); raises when the store does
        not answer."""
        self.heartbeats.write(self._heartbeat_payload())
        self._contact(heartbeat=True)

    def kill(self) -> None:
        """Stop at once, delivering nothing more (tests simulate a crash)."""
        self._stop.set()
        self.journal.wake()
        if self._thread is not None:
            self._thread.join()

    # -- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:
                log.exception("store thread: step failed")
                self.clock.wait(self._stop, RETRY_S)
            if self._draining.is_set() and self.journal.pending() == 0:
                self._leave()
                return

    def _step(self) -> None:
        # waits for the loop's next report, a start or a stop (other threads' doing: they
        # wake it), or until a reconcile is due, not polling: each wake-up of this thread
        # costs the node CPU, and the loop's reports come 2 to 10 times a second
        due_s = self._next_reconcile - self._monotonic() + RECONCILE_LATE_S
        report = self.journal.peek(
            timeout_s=min(max(due_s, MIN_WAIT_S), RECONCILE_PERIOD_S + RECONCILE_LATE_S),
            linger=True,
        )
        if report is not None and not self._deliver_up_to(self.journal.seq):
            self.clock.wait(self._stop, RETRY_S)
            return
        while not self._starts.empty():
            self._prepare(self._starts.get_nowait())
        if not self._draining.is_set():
            self._reconcile_if_due(early_s=RECONCILE_EARLY_S if report is not None else 0.0)

    def pump(self) -> bool:
        """One round of this thread's work, waiting for nothing: deliver what is
        journaled, prepare the starts asked for, reconcile when it is due.  For a driver
        that runs many nodes' store work on a few threads of its own (the fleet
        benchmark); False when the store did not answer."""
        if not self._deliver_up_to(self.journal.seq):
            return False
        while not self._starts.empty():
            self._prepare(self._starts.get_nowait())
        self._reconcile_if_due()
        return True

    def _leave(self) -> None:
        try:
            for a in self.store.active_attempts(node=self.name):
                if a.state == JobState.DISPATCHED:
                    why = f"node agent {self.name} shut down before starting it"
                    self._call(
                        self.store.requeue_lost,
                        a.job_id,
                        a.attempt,
                        why=why,
                        reason_code=AGENT_LEFT,
                    )
        except Exception:
            log.exception("store thread: could not requeue what was never started")

    # -- delivery -----------------------------------------------------------------------

    def _deliver(self, report: Report) -> bool:
        """Deliver one report; False when the store did not answer (try again)."""
        try:
            if report.op == "heartbeat":
                # cut off from the store for over a write period: no more touches, so
                # that the scheduler gives the node up (its attempts are fenced by then)
                in_touch = (
                    self._monotonic() - self.last_contact_ok <= self.heartbeats.rules.period_s
                )
                done = self.heartbeats.offer(self._heartbeat_payload(), touch=in_touch)
                if done == WRITTEN:
                    self._contact(heartbeat=True)
                elif done == TOUCHED:
                    self.last_heartbeat_ok = self._monotonic()
            else:
                getattr(self.store, report.op)(**report.kwargs)
                self._contact()
        except (StaleState, InvalidTransition) as exc:
            self._contact()  # the store answered, with a refusal
            log.info("stale report dropped (%s): %s", report.op, exc)
            if report.op == "mark_started":
                kw = report.kwargs
                why = "given up on before it started"
                self._post(Kill(kw["job_id"], kw["attempt"], why))
        except TRANSIENT as exc:
            if not self._outage_logged:
                log.error(
                    "the store does not answer (%s); reports wait in the journal",
                    first_line(exc),
                )
                self._outage_logged = True
            return False
        except Exception:
            log.exception("report %s could not be delivered; dropped", report.op)
        if self._outage_logged:
            log.info("the store answers again")
            self._outage_logged = False
        self.journal.done(report)
        if report.op in ("finish_attempt", "requeue_lost"):
            self._notify(int(report.kwargs["job_id"]))
        return True

    def _deliver_up_to(self, seq: int) -> bool:
        while (report := self.journal.peek(timeout_s=0)) is not None and report.seq <= seq:
            if not self._deliver(report):
                return False
        return True

    # -- starts -------------------------------------------------------------------------

    def _prepare(self, cmd: StartAttempt) -> None:
        try:
            job = self.store.get(cmd.job_id)
        except EbbtideError:
            self._contact()
            return
        except TRANSIENT:
            return  # the reconcile will find it when the store answers
        self._contact()
        why = stale_start(job, cmd.attempt, self.name)
        if why is not None:
            log.info("job %s attempt %s: start request ignored: %s", cmd.job_id, cmd.attempt, why)
            return
        try:
            spec = JobSpec.model_validate_json(job.spec_json)
        except ValueError as exc:
            why = f"could not start: its spec no longer reads ({exc})"
            self._call(
                self.store.finish_attempt, job.id, cmd.attempt, exit_code=127, why=why, final=True
            )
            self._notify(cmd.job_id)
            return
        self._post(Prepared(job, spec))

    # -- reconciliation -----------------------------------------------------------------

    def _reconcile_if_due(self, early_s: float = 0.0) -> None:
        """Reconcile if ``RECONCILE_PERIOD_S`` has passed since the last time, or will
        within ``early_s`` (on the clock's monotonic seconds)."""
        now = self._monotonic()
        if now >= self._next_reconcile - early_s:
            self._next_reconcile = now + RECONCILE_PERIOD_S
            self._reconcile()

    def _reconcile(self) -> None:
        seq, local = self._view()
        if not self._deliver_up_to(seq):
            return
        try:
            assigned = {a.job_id: a for a in self.store.active_attempts(node=self.name)}
        except Exception as exc:
            log.warning("reconcile: the store does not answer (%s)", type(exc).__name__)
            return
        self._contact()
        for job_id, (attempt, evicting) in local.items():
            a = assigned.get(job_id)
            if a is None or a.attempt != attempt:
                self._post(Kill(job_id, attempt, "the store no longer gives it to this node"))
            elif a.state == JobState.EVICTING and not evicting:
                # the scheduler's message has not arrived (yet): its record says why
                asked = self._call(self.store.eviction_request, job_id, attempt) or {}
                self._post(
                    EvictAttempt(
                        job_id=job_id,
                        attempt=attempt,
                        reason=asked.get("reason_code") or "scheduler",
                        message=asked.get("reason") or "evicted by the scheduler",
                        spike_at=asked.get("spike_at"),
                        deadline_s=asked.get("deadline_s"),
                    )
                )
        for job_id, a in assigned.items():
            if job_id in local:
                continue
            if a.state == JobState.DISPATCHED:
                self._prepare(StartAttempt(job_id=job_id, attempt=a.attempt))
            else:  # running here by the store's account, but no such process: lost
                if a.dispatched_at < self.started_at:  # a previous agent's, here
                    why = f"node agent {self.name} restarted; the attempt did not survive it"
                    code = AGENT_RESTARTED
                else:  # this agent's own time: it never saw it end (a second agent?)
                    why = f"its process is no longer running on node {self.name}"
                    code = GONE
                self._call(self.store.requeue_lost, job_id, a.attempt, why=why, reason_code=code)
                self._notify(job_id)
        self.undrains.take_if_due(self.store, self._monotonic(), self.started_at)

    # -- helpers ------------------------------------------------------------------------

    def _contact(self, *, heartbeat: bool = False) -> None:
        now = self._monotonic()
        self.last_contact_ok = now
        if heartbeat:
            self.last_heartbeat_ok = now

    def _notify(self, job_id: int) -> None:
        if self._notify_fn is not None:
            try:
                self._notify_fn(AttemptChanged(job_id=job_id, node=self.name))
            except Exception:
                log.exception("could not notify the scheduler")

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StaleState as exc:
            log.info("stale: %s", exc)
        except Exception:
            log.exception("store call %s failed", getattr(fn, "__name__", fn))
        return None
