"""Whose jobs a node runs, as its agent's heartbeat says (``nodes.runs_jobs_of``), and
whom that refuses: one reading for the agent (:mod:`ebbtide.workers.runas`, which works
the value out), submission (``client_checks``) and the planner (it places a job only on
a node that would run it for its owner).  Pure: no lookups.
"""

from __future__ import annotations

from typing import Final

#: Whose jobs a node runs, as its heartbeat says (``nodes.runs_jobs_of``): anyone's ...
RUNS_ANYONES: Final = "any"
#: ... every user's but root's (owner mode, as root, without ``allow_root_jobs``) ...
RUNS_USERS: Final = "users"
#: ... or one user's only: ``user:NAME`` (an owner-mode agent that is not root; a root
#: agent in agent mode that gives no one else a root shell)
RUNS_ONE_PREFIX: Final = "user:"


def refuses(runs_jobs_of: str | None, owner: str) -> str | None:
    """Why a node whose heartbeat said ``runs_jobs_of`` would refuse ``owner``'s job, in
    words that name what it runs; None when it would take it, or when it did not say (an
    agent older than the field)."""
    if not runs_jobs_of or runs_jobs_of == RUNS_ANYONES:
        return None
    if runs_jobs_of == RUNS_USERS:
        return "does not run root's jobs (allow_root_jobs is false)" if owner == "root" else None
    if runs_jobs_of.startswith(RUNS_ONE_PREFIX):
        only = runs_jobs_of[len(RUNS_ONE_PREFIX) :]
        return None if owner == only else f"runs only {only}'s jobs"
    return None  # a value a newer agent wrote: let that agent decide


def singled_out(runs_jobs_of: str | None) -> str | None:
    """The one owner a node that says ``runs_jobs_of`` treats unlike any other (root,
    whom ``users`` refuses; NAME, whom ``user:NAME`` alone runs); None when it treats
    every owner alike (anyone's, not said, a value a newer agent wrote).  Owners that no
    node singles out are all refused by the same nodes (:func:`refuses`)."""
    if runs_jobs_of == RUNS_USERS:
        return "root"
    if runs_jobs_of and runs_jobs_of.startswith(RUNS_ONE_PREFIX):
        return runs_jobs_of[len(RUNS_ONE_PREFIX) :]
    return None


def in_words(runs_jobs_of: str | None) -> str:
    """Whose jobs a node runs, in a few words: ``every user's but root's``."""
    if runs_jobs_of == RUNS_USERS:
        return "every user's but root's"
    if runs_jobs_of and runs_jobs_of.startswith(RUNS_ONE_PREFIX):
        return f"{runs_jobs_of[len(RUNS_ONE_PREFIX) :]}'s only"
    return "anyone's"
