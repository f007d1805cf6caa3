"""Whom an attempt runs as: its owner's Unix user, or the node agent's own.

Job owners are OS user names (:mod:`ebbtide.identity`).  A node agent's ``run_as`` says
what an owner means on its node:

- ``owner``: each attempt runs with its owner's uid, gid and supplementary groups.  An
  agent running as root switches to them in the attempt shim's child, just before the
  job's ``exec`` (:mod:`ebbtide.workers.shim`): the shim itself stays root so that it can
  always kill the attempt's tree and write how it ended.  An agent running as anyone else
  cannot switch: it runs its own user's jobs and refuses everyone else's.  Root's jobs are
  refused unless the policy says ``allow_root_jobs: true``: on a fleet, a root job is a
  root shell on a GPU host.
- ``agent``: every attempt runs as the agent's own user, whoever owns it: a box with one
  user (``ebb up``), a container, CI.  This is the library's default
  (:class:`~ebbtide.workers.agent.NodeAgent`); ``ebb worker`` defaults to ``owner``.

An owner-mode attempt's environment starts from nothing of the agent's but what no one
keeps secret and a program needs to run: a ``PATH`` (the job's own, else the agent's
less the directories the owner cannot search, which the attempt's shim drops as the
owner, just before the job's exec: an agent run from a virtual environment in root's
0700 home would give its jobs ``Permission denied``), the locale and the time zone.
The owner's login variables (``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, from the
password database) come on top of the job's own, so a job submitted by an admin for
someone does not run with the admin's home.

The decision (:func:`resolve`) is pure but for the two lookups it is given.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ebbtide.errors import EbbtideError
from ebbtide.identity import user_name
from ebbtide.queue.whose_jobs import RUNS_ANYONES, RUNS_ONE_PREFIX, RUNS_USERS
from ebbtide.workers import shim

RunAs = Literal["owner", "agent"]
#: Attempts run as their owners (``ebb worker``'s default).
RUN_AS_OWNER: Final = "owner"
#: Attempts run as the agent's user (the library's and ``ebb up``'s default).
RUN_AS_AGENT: Final = "agent"
RUN_AS_CHOICES: Final = (RUN_AS_OWNER, RUN_AS_AGENT)

#: The agent's variables an owner-mode attempt still gets: where programs are, and how to
#: speak and tell the time (besides ``LC_*``).  None of them is anyone's secret.
PASSED_VARIABLES: Final = frozenset({"PATH", "LANG", "LANGUAGE", "TZ"})
#: ``PATH`` when neither the job nor the agent has one (or the owner can search none of
#: the agent's directories).
DEFAULT_PATH: Final = shim.DEFAULT_PATH


class RunAsRefused(EbbtideError):
    """This node will not run the job as its owner; the message says why, in words the
    owner or an admin can act on.  The attempt fails at once with it."""


@dataclass(frozen=True)
class Identity:
    """The Unix user an attempt runs as, from the password database."""

    user: str
    uid: int
    gid: int
    #: supplementary groups (``os.getgrouplist``), the primary one included
    groups: tuple[int, ...]
    home: str
    shell: str
    #: the attempt's shim drops to this user before the job's exec (the agent is root);
    #: False: the agent is this user already
    switch: bool

    def login_env(self) -> dict[str, str]:
        """The variables a login as this user sets."""
        return {
            "HOME": self.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": self.shell or "/bin/sh",
        }

    def shim_args(self) -> list[str]:
        """What tells the shim to switch to this user (nothing when it need not)."""
        if not self.switch:
            return []
        return [
            "--user",
            self.user,
            "--uid",
            str(self.uid),
            "--gid",
            str(self.gid),
            "--groups",
            ",".join(str(g) for g in self.groups),
            "--home",
            self.home,
        ]


def resolve(
    owner: str,
    *,
    run_as: str,
    node: str,
    allow_root_jobs: bool,
    agent_uid: int | None = None,
    others_as_agent: bool = True,
    getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
    getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist,
) -> Identity | None:
    """Whom ``owner``'s attempt runs as on ``node``: None for the agent's own user, as
    before (``run_as`` ``agent``), else the owner's :class:`Identity`.

    Raises :class:`RunAsRefused` when the job cannot run as its owner here: no such user
    on this node, a root job without ``allow_root_jobs``, or an agent that is not root
    asked to run someone else's job.

    ``others_as_agent`` False: an agent running as root in ``agent`` mode runs only
    root's jobs (as ``ebb up``/``ebb worker --run-as agent`` do), so no user whose job
    reached its store through ``ebb server`` gets a root shell."""
    if run_as == RUN_AS_AGENT:
        agent_uid = os.geteuid() if agent_uid is None else agent_uid
        if others_as_agent or agent_uid != 0:
            return None
        try:
            root_owned = getpwnam(owner).pw_uid == 0
        except (KeyError, ValueError):
            root_owned = False
        if not root_owned:
            raise RunAsRefused(
                f"node {node}'s agent runs every job as root (--run-as agent), so it runs "
                f"only root's jobs, not {owner}'s; run it with --run-as owner to run each "
                "job as its owner"
            )
        return None
    if run_as != RUN_AS_OWNER:
        raise ValueError(f"run_as: {run_as!r} is not one of {', '.join(RUN_AS_CHOICES)}")
    agent_uid = os.geteuid() if agent_uid is None else agent_uid
    try:
        entry = getpwnam(owner)
    except (KeyError, ValueError):  # ValueError: a name with a NUL in it
        raise RunAsRefused(f"owner {owner} is not a user on node {node}") from None
    if entry.pw_uid == 0 and not allow_root_jobs:
        raise RunAsRefused(
            f"owner {owner} is root, and node {node} does not run root's jobs (the policy's "
            "allow_root_jobs is false: a root job is a root shell on the node); submit it as "
            "an ordinary user"
        )
    if agent_uid != 0 and entry.pw_uid != agent_uid:
        me = user_name(agent_uid)
        raise RunAsRefused(
            f"node {node}'s agent runs as {me}, not root, so it runs only {me}'s jobs, not "
            f"{owner}'s (an admin runs it as root to run every owner's jobs, or with "
            f"--run-as agent to run them all as {me})"
        )
    try:
        groups = tuple(getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return Identity(
        user=entry.pw_name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        groups=groups or (entry.pw_gid,),
        home=entry.pw_dir or "/",
        shell=entry.pw_shell,
        switch=agent_uid == 0,
    )


def jobs_run_here(
    run_as: str,
    *,
    agent_uid: int,
    allow_root_jobs: bool,
    others_as_agent: bool,
    runs_processes: bool = True,
) -> str:
    """Whose jobs an agent set up this way runs, as :func:`resolve` decides it, for its
    heartbeat: :data:`RUNS_ANYONES`, :data:`RUNS_USERS` or ``user:NAME``.  Whether the
    owner is a user on the node at all is not said: only the node can look that up."""
    if not runs_processes:  # pods run as their pod spec says, whoever owns them
        return RUNS_ANYONES
    if run_as == RUN_AS_AGENT:
        return RUNS_ANYONES if others_as_agent or agent_uid != 0 else RUNS_ONE_PREFIX + "root"
    if agent_uid != 0:
        return RUNS_ONE_PREFIX + user_name(agent_uid)
    return RUNS_ANYONES if allow_root_jobs else RUNS_USERS


def base_env(
    identity: Identity, job_env: Mapping[str, str], agent_env: Mapping[str, str]
) -> dict[str, str]:
    """An owner-mode attempt's environment before ebbtide's contract: the agent's
    ``PASSED_VARIABLES`` and ``LC_*``, the job's own, then the owner's login variables.
    The agent's ``PATH`` (:data:`DEFAULT_PATH` when it has none) is passed on whole: the
    attempt's shim keeps of it only what the owner can search (:func:`trims_path`); the
    job's own is kept as given."""
    env = {k: v for k, v in agent_env.items() if k in PASSED_VARIABLES or k.startswith("LC_")}
    env["PATH"] = env.get("PATH") or DEFAULT_PATH
    env.update(job_env)
    env.update(identity.login_env())
    return env


def trims_path(identity: Identity | None, job_env: Mapping[str, str]) -> bool:
    """Whether an attempt's ``PATH`` is the agent's, which its shim trims, as the owner,
    to the directories the owner can search: an owner-mode attempt's whose job gives no
    ``PATH`` of its own (a job's own is its business, and an agent-mode attempt's user is
    the agent's)."""
    return identity is not None and "PATH" not in job_env


def job_path(path: str, identity: Identity | None) -> Path:
    """A directory the job named (``checkpoint_dir``, ``cwd``) as its user means it:
    for an owner, ``~`` is the owner's home and a relative path starts there (where a
    login starts); for the agent's user, as before (``~`` is the agent's home)."""
    if identity is None:
        return Path(path).expanduser()
    if path == "~" or path.startswith("~/"):
        return Path(identity.home) / path[2:]
    p = Path(path).expanduser()  # ~bob/...: bob's home, which the job may or may not enter
    return p if p.is_absolute() else Path(identity.home) / p
