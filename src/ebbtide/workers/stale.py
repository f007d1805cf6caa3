"""Whether a request to start an attempt is out of date, and why, in words an operator
can act on (the node agent's store thread logs it and does nothing more).

A start request can arrive twice (the scheduler's message and the agent's own reconcile
both ask) or late (after the scheduler moved on).  Pure: the job as the store has it in.
"""

from __future__ import annotations

from ebbtide.queue.models import Job
from ebbtide.queue.states import ACTIVE_STATES, JobState


def stale_start(job: Job, attempt: int, node: str) -> str | None:
    """Why a request to start ``attempt`` of ``job`` on ``node`` is out of date, in words
    an operator can act on; None: it is to be started.  A start request can arrive twice
    (the scheduler's message and the agent's own reconcile both ask) or late (after the
    scheduler moved on), and then there is nothing to do.  Pure."""
    if job.attempts != attempt:
        return (
            f"the job is at attempt {job.attempts} now (a late request: the scheduler "
            "moved on before it arrived); nothing to do"
        )
    if job.state == JobState.QUEUED:
        return (
            "the scheduler requeued it before it started here (e.g. not started within "
            "defaults.dispatch_timeout_s); nothing to do"
        )
    if job.state not in ACTIVE_STATES:
        return f"it is {job.state} now, no longer waiting to start; nothing to do"
    if job.node != node:
        return f"the store has this attempt on node {job.node}, not here; nothing to do"
    if job.state != JobState.DISPATCHED:
        return (
            f"it is {job.state} here already (the same request arrived twice: the "
            "scheduler's message and this agent's own check); nothing to do"
        )
    return None
