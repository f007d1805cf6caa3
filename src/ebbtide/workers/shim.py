"""The attempt shim: a small supervisor between the node agent and one attempt's processes.

(Longer than our modules should be: it is run by path with the standard library only
(``python -I shim.py``: it starts in tens of milliseconds and no job environment reaches
it), so it cannot import helpers from other modules.)

The local executor starts every attempt through this shim, as the leader of a new
session.  The shim

1. becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so every process the job
   starts stays below it, however deep or detached (``setsid``, a double fork): the
   attempt's processes are exactly the shim's descendants;
2. starts the job (its argv, environment and working directory) and waits for it;
3. holds a **lease**: the agent writes to a pipe about once a second.  When the agent is gone (the
   pipe reads end-of-file: killed, crashed) or stops renewing for ``--lease-s`` (paused,
   hung, cut off), the shim kills every process of the attempt and exits.  No agent is
   needed for that, so an attempt never outlives its agent's lease.  The agent also kills
   an attempt through the pipe (``K``): the shim, a subreaper, kills and reaps every
   process of it, so none lingers as a zombie for init to reap;
4. when the job's leader exits, kills what the job left behind, writes how it ended to
   ``--status`` (JSON) and exits with the leader's exit code (``128 + N`` for signal N).
   During an eviction (once the agent has told it the deadline) it waits instead for
   the job's last process, up to the deadline: a shell wrapper the warning killed leaves
   its Python child to checkpoint; the attempt then ends as that last process did.

Told a user (``--uid``, ``--gid``, ``--groups``: the job's owner, see
:mod:`ebbtide.workers.runas`), the shim stays what it is (root) and its child becomes that
user before the job's ``exec``: supplementary groups, then the group, then the user, for
good (real, effective and saved ids).  Only then does the child make the directories the
job named (``--mkdir``: its checkpoint directory) and enter its working directory (its
``--cwd``, else the user's ``--home``, else ``/``), so that it makes and enters nothing
the user could not.  Told that the job's ``PATH`` is the agent's (``--trim-path``: the
job gave none), the child then keeps of it only the absolute directories that user can
search, as the kernel decides for the user (mode bits, ACLs, links, a file server that
maps root to nobody) and away from the agent's loop, which no slow mount then stalls.
The shim keeps what the agent relies on — killing the whole tree, writing the status
file (in a directory of the agent's, never through a link) — out of the job's reach.

It uses the standard library only and is run by path (``python -I shim.py``), so it
starts in a few tens of milliseconds and no job environment (``PYTHONPATH``…) reaches it.
Signals the agent sends to the attempt's process group (the eviction warning) are
caught and ignored here: they are meant for the job.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

#: prctl option: orphaned descendants are re-parented to this process, not to init
PR_SET_CHILD_SUBREAPER = 36
#: prctl option: a signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1

#: Why the shim ended the attempt (the ``cause`` in the status file).
CAUSE_JOB = "job"  # the job's leader exited by itself (or by a signal the agent sent)
CAUSE_LEASE = "lease"  # the agent stopped renewing the lease
CAUSE_AGENT_GONE = "agent_gone"  # the lease pipe closed: the agent is gone
CAUSE_START = "start"  # the job could not be started at all
CAUSE_KILLED = "killed"  # the agent told the shim to kill the attempt (a deadline, a sweep)
CAUSE_DEADLINE = "deadline"  # the eviction deadline the agent set came: killed by the shim

#: What the agent writes to the lease pipe: a renewal; "kill the attempt now"; and
#: ``D<monotonic seconds>\n``: "kill it then, whatever happens to me" (an eviction's
#: deadline, kept even by a paused or dead agent).
RENEW = b"."
KILL = b"K"
DEADLINE = b"D"

#: ``PATH`` when none of the directories of the agent's is left for the job's user.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

#: Exit code when the job could not be started (as a shell says for "command not found").
START_FAILED_EXIT = 127
#: Exit code when the lease ended the attempt (SIGKILL's 128 + 9: the job was killed).
LEASE_EXIT = 137

#: Signals the shim catches and forwards to the job's processes: the warning signals.  A
#: warning sent to the shim (its job not forked yet, or not exec'd) reaches the job.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
    signal.SIGALRM,
    signal.SIGXCPU,
)
#: Rounds of "kill every descendant" before giving up on a fork storm.
_KILL_ROUNDS = 200


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stat_fields(pid: int | str) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, …; field 3
    of proc(5) first), or ``[]`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return stat[stat.rfind(b")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from ``/proc``), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def children(root: int) -> list[int]:
    """The live children of ``root`` (for a shim: the job's leader, and what it left
    behind once it ended, which the shim adopts)."""
    if not _has_child_lists(root):
        return [pid for pid in descendants(root) if _parent(pid) == root]
    return _child_pids(root)


def tree(root: int) -> list[int]:
    """Every live descendant of ``root`` by the kernel's own child lists
    (``/proc/PID/task/TID/children``): the cost of the tree, not of the host's process
    count.  Falls back to :func:`descendants` where the kernel keeps no such lists."""
    if not _has_child_lists(root):
        return descendants(root)
    out: list[int] = []
    todo = [root]
    while todo:
        kids = _child_pids(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def _has_child_lists(pid: int) -> bool:
    """Whether the kernel keeps ``/proc/PID/task/TID/children`` lists."""
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def _child_pids(pid: int) -> list[int]:
    """``pid``'s children, from the child lists of each of its threads (none once it or
    a thread is gone meanwhile)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
        except (OSError, ValueError):
            continue
    return kids


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _reap() -> list[tuple[int, int]]:
    """Reap every exited child; return their ``(pid, wait status)``."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def kill_tree(root: int, group: int | None = None, *, reap: bool = True) -> int:
    """SIGKILL every descendant of ``root`` until none is left; return how many died.

    ``group`` (the job's process group) is killed first in one call: most of a job is
    there, and it dies at once; a scan of ``/proc`` then finds what left the group.
    ``reap``: reap the dead (the caller is their subreaper); a caller with children of
    its own to wait for passes False."""
    killed = 0
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for _ in range(_KILL_ROUNDS):
        pids = descendants(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if reap:
            _reap()
        time.sleep(0.001)
    if reap:
        _reap()
    return killed


def exit_code(status: int) -> int:
    """A wait status as a shell would report it: the code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _write_status(path: str | None, **fields: object) -> None:
    """Write the status file through a fresh file renamed into place, never through a
    link (a rename replaces a link; ``O_NOFOLLOW`` refuses to open one)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600), "w") as f:
            json.dump({**fields, "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError as exc:
        _say(f"cannot write {path}: {exc}")


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"ebbtide: {text}\n".encode())


@dataclass(frozen=True)
class User:
    """The user the job runs as, when the shim is to switch to it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


class _NotStarted(Exception):
    """The job's process could not be made ready as its user (said on the report pipe)."""


@dataclass(frozen=True)
class Outputs:
    """Files the job's stdout and stderr go to (the same path for both joins them)."""

    stdout: str | None = None
    stderr: str | None = None
    #: start them afresh (a job's first attempt) rather than append
    truncate: bool = False


def _child_setup(
    user: User | None = None,
    make_dirs: Sequence[str] = (),
    cwd: str | None = None,
    report_fd: int | None = None,
    outputs: Outputs | None = None,
    trim_path: bool = False,
    argv: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> None:  # pragma: no cover - runs in the child before exec
    """In the job's process before exec (and, with ``user``, after ``subprocess`` made it
    that user): die with the shim (set now: a change of user clears it); as the user, make
    ``make_dirs`` and enter ``cwd`` (or the user's home, or ``/``), then open the files
    its output goes to (``outputs``), telling ``report_fd`` why not if that fails; then
    take back the default action of the signals the shim catches before letting them in,
    so a warning sent between fork and exec ends the job as it would a moment later (the
    shim's own handlers would swallow it).  With ``trim_path``, exec ``argv`` here with
    ``env`` (None: the shim's own) less the ``PATH`` directories this user cannot search."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        if user is not None:
            _enter(user, make_dirs, cwd)
        if outputs is not None:
            _redirect(outputs, user)
        job_env = None
        if trim_path:
            job_env = dict(os.environ if env is None else env)
            job_env["PATH"] = searchable_path(job_env.get("PATH", ""))
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        if job_env is not None:
            _exec(argv, job_env)
    except _NotStarted as exc:
        if report_fd is not None:
            with contextlib.suppress(OSError):
                os.write(report_fd, str(exc).encode())
        raise


def searchable_path(path: str) -> str:
    """``path`` (a ``PATH``) as this process's user can use it: only its absolute
    directories the user can search (real uid and groups, as the kernel decides: ACLs,
    links and every directory on the way included), in order, without repeats;
    :data:`DEFAULT_PATH` when none is left."""
    kept: list[str] = []
    for d in path.split(os.pathsep):
        if os.path.isabs(d) and d not in kept and os.path.isdir(d) and os.access(d, os.X_OK):
            kept.append(d)
    return os.pathsep.join(kept) or DEFAULT_PATH


def _exec(argv: Sequence[str], env: dict[str, str]) -> NoReturn:  # pragma: no cover - child
    """Exec the job with ``env``, finding its command on ``env``'s ``PATH`` as this user.

    (``subprocess`` execs with the environment it built before the fork, so an
    environment decided in the child is exec'd here.  Its ``close_fds`` would come after
    this: every descriptor above stderr (the lease pipe) is closed on exec instead.)"""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every descriptor there may be
        fds = list(range(3, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):  # not open (the listing's own, closed by now)
                os.set_inheritable(fd, False)
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as exc:  # worded as subprocess words it
        hint = denied_hint(argv[0], env.get("PATH", "")) if exc.errno == errno.EACCES else ""
        raise _NotStarted(f"[Errno {exc.errno}] {exc.strerror}: {argv[0]!r}{hint}") from None


def denied_hint(program: str, path: str, access: Callable[[str, int], bool] = os.access) -> str:
    """Why this user may not run ``program`` (found on ``path`` as ``execvp`` finds it),
    where the program is a link whose target lies where the user cannot pass (a trial's
    trap: a virtual environment made from root's own Python, ``/opt/venv/bin/python`` a
    link into root's 0700 home: "Permission denied" and nothing more), or is not
    executable to it; "" when that is not it."""
    dirs = [""] if "/" in program else [d for d in path.split(os.pathsep) if d]
    for d in dirs:
        found = os.path.join(d, program) if d else program
        if not os.path.lexists(found):
            continue
        real = os.path.realpath(found)
        if real != os.path.abspath(found):
            parent = os.path.dirname(real)
            steps = [parent]
            while steps[-1] != os.path.dirname(steps[-1]):
                steps.append(os.path.dirname(steps[-1]))
            for step in reversed(steps):  # from the root down: the first one refused
                if not access(step, os.X_OK):
                    return f" ({found} is a link to {real}, and this user cannot pass {step})"
        if not access(real, os.X_OK):
            return f" ({found}: this user may not execute {real})"
    return ""


def _redirect(outputs: Outputs, user: User | None) -> None:  # pragma: no cover - in the child
    """Point stdout and stderr at ``outputs``' files, opened as the job's user (a path
    relative to its working directory, which it is in), saying so in the attempt's logs."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if outputs.truncate else 0)
    opened: dict[str, int] = {}
    for path, target in ((outputs.stdout, 1), (outputs.stderr, 2)):
        if path is None:
            continue
        if path not in opened:
            try:
                opened[path] = os.open(path, flags, 0o644)
            except OSError as exc:
                who = f" as {user.name}" if user is not None else ""
                raise _NotStarted(
                    f"could not open {path} for the job's output{who}: {exc.strerror}"
                ) from None
        with contextlib.suppress(OSError):
            name = "stdout" if target == 1 else "stderr"
            os.write(target, f"ebbtide: the job's {name} goes to {path}\n".encode())
        os.dup2(opened[path], target)
    for fd in opened.values():
        os.close(fd)


def _enter(user: User, make_dirs: Sequence[str], cwd: str | None) -> None:  # pragma: no cover
    """As ``user`` already: make the job's directories and enter its working directory."""
    if os.getresuid() != (user.uid,) * 3 or os.getresgid() != (user.gid,) * 3:
        raise _NotStarted(f"could not become {user.name} (uid {user.uid})")  # never run as root
    for d in make_dirs:
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise _NotStarted(f"could not make {d} as {user.name}: {exc.strerror}") from None
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise _NotStarted(f"could not enter {cwd} as {user.name}: {exc.strerror}") from None
        return
    for where in (user.home, "/"):  # where a login would start
        with contextlib.suppress(OSError):
            os.chdir(where)
            return


def run(
    argv: Sequence[str],
    *,
    lease_fd: int | None,
    lease_s: float,
    status_path: str | None,
    cwd: str | None = None,
    user: User | None = None,
    make_dirs: Sequence[str] = (),
    env: dict[str, str] | None = None,
    outputs: Outputs | None = None,
    trim_path: bool = False,
) -> int:
    """Supervise one attempt (see the module doc); return the shim's exit code.  With
    ``user``, the job runs as that user, who makes ``make_dirs`` first; ``env`` is the
    job's environment (None: the shim's own); ``outputs`` where its output goes (None:
    the shim's own stdout and stderr); ``trim_path``: ``env``'s ``PATH`` is the agent's,
    of which the job keeps only the directories its user can search."""
    me = os.getpid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    forward: list[int] = []  # warning signals sent to the shim, for the job
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, _frame: forward.append(signum))

    # the job is forked with the caught signals blocked; it lets them in only once their
    # default action is back (see _child_setup)
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    # the child says on this pipe why it could not get ready (as another user, or with its
    # output files: subprocess itself only says that something failed); it closes on exec
    needs_report = user is not None or outputs is not None or trim_path
    report_r, report_w = os.pipe() if needs_report else (None, None)
    try:
        # a single-threaded process: preexec_fn is safe here
        leader = subprocess.Popen(
            list(argv),
            env=env,
            # as another user the child enters it itself, once it is that user
            cwd=(cwd or None) if user is None else None,
            preexec_fn=functools.partial(
                _child_setup,
                user,
                make_dirs,
                cwd,
                report_w,
                outputs,
                trim_path=trim_path,
                argv=argv,
                env=env,
            ),
            close_fds=True,
            process_group=0,  # the job's own group: killed in one call, the shim spared
            # subprocess does setgroups, setregid, setreuid in this order, before preexec_fn
            user=None if user is None else user.uid,
            group=None if user is None else user.gid,
            extra_groups=None if user is None else list(user.groups),
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        where = f" in {cwd}" if cwd else ""
        why = str(exc)
        if report_r is not None and report_w is not None:
            os.close(report_w)
            report_w = None
            why = os.read(report_r, 4096).decode(errors="replace") or why
        # the job's stderr (its owner's) has the whole command line; the status becomes the
        # job's reason and an event, which every user reads: the program alone there (its
        # arguments may hold what only its owner may see, as qstat -f masks them)
        _say(f"could not start {list(argv)!r}{where}: {why}")
        error = f"could not start {argv[0]!r}{where}: {why}" if argv else f"could not start: {why}"
        _write_status(status_path, cause=CAUSE_START, exit_code=START_FAILED_EXIT, error=error)
        return START_FAILED_EXIT
    finally:
        for fd in (report_r, report_w):
            if fd is not None:
                os.close(fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    expires = time.monotonic() + lease_s
    kill_at = float("inf")  # set once an eviction began: its deadline
    pending = b""
    leader_code: int | None = None
    after_leader: int | None = None  # how the last of the others ended, after the leader

    def result(default: int) -> int:
        """The attempt's exit code: its leader's; but a leader ended by a signal during
        an eviction (a shell wrapper the warning killed) speaks for none of the work, so
        then the last of its processes to end does (the Python child that checkpointed
        and asked for a requeue, or finished)."""
        if leader_code is None:
            return default
        if leader_code > 128 and after_leader is not None:
            return after_leader
        return leader_code

    def read_lease() -> str | None:
        """Take in what the agent wrote (without waiting): ``kill``, ``gone`` or None."""
        nonlocal expires, kill_at, pending
        if lease_fd is None:
            return None
        try:
            data = os.read(lease_fd, 4096)
        except BlockingIOError:
            return None  # nothing new
        except OSError as exc:
            _say(f"lease pipe: {exc}")
            data = b""
        if not data:
            return "gone"
        if KILL in data:
            return "kill"
        expires = time.monotonic() + lease_s
        pending, deadlines = _deadlines(pending + data)
        kill_at = min([kill_at, *deadlines])
        return None

    def take_exits() -> None:
        """Reap what ended, noting how the leader and (after it) the others ended."""
        nonlocal leader_code, after_leader
        for pid, status in _reap():
            if pid == leader.pid:
                leader_code = exit_code(status)
            elif leader_code is not None:
                after_leader = exit_code(status)

    watched = [wake_r] + ([lease_fd] if lease_fd is not None else [])
    while True:
        take_exits()
        while forward:
            warning = forward.pop(0)
            for pid in descendants(me):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, warning)
        # the agent's word first: a deadline it wrote before its warning killed the
        # leader must be known before the leader's end is judged
        action = read_lease()
        group = leader.pid if leader_code is None else None
        if action == "kill":
            return _end(
                me, group, status_path, CAUSE_KILLED, "killed by the node agent", quiet=True
            )
        if action == "gone":
            return _end(me, group, status_path, CAUSE_AGENT_GONE, "the node agent is gone")
        # the leader's end ends the attempt, except during an eviction: then what it left
        # running (a checkpointing child) gets until the deadline to finish
        if leader_code is not None and (kill_at == float("inf") or not descendants(me)):
            take_exits()  # one that ended since the last look is a zombie, not a descendant
            left = kill_tree(me)  # its group's id may be reused now: a scan only
            code = result(leader_code)
            _write_status(
                status_path,
                cause=CAUSE_JOB,
                exit_code=code,
                leader_exit_code=leader_code,
                leftovers_killed=left,
            )
            return code
        if time.monotonic() >= kill_at:
            return _end(
                me,
                group,
                status_path,
                CAUSE_DEADLINE,
                "its eviction deadline came",
                quiet=True,
                code=result(LEASE_EXIT),
            )
        if lease_fd is not None and time.monotonic() >= expires:
            return _end(
                me,
                group,
                status_path,
                CAUSE_LEASE,
                f"the node agent did not renew the lease for {lease_s:g}s",
            )
        wake_at = min(expires if lease_fd is not None else float("inf"), kill_at)
        timeout = None if wake_at == float("inf") else max(0.0, wake_at - time.monotonic())
        try:
            ready, _, _ = select.select(watched, [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)


def _deadlines(data: bytes) -> tuple[bytes, list[float]]:
    """The ``D<seconds>\n`` deadlines in ``data`` (renewals around them skipped), and what
    is left of an unfinished one."""
    found: list[float] = []
    while (start := data.find(DEADLINE)) >= 0:
        end = data.find(b"\n", start)
        if end < 0:
            return data[start:], found
        with contextlib.suppress(ValueError):
            found.append(float(data[start + 1 : end]))
        data = data[end + 1 :]
    return b"", found


def _end(
    me: int,
    group: int | None,
    status_path: str | None,
    cause: str,
    why: str,
    *,
    quiet: bool = False,
    code: int = LEASE_EXIT,
) -> int:
    if not quiet:
        _say(f"{why}: killing the attempt")
    killed = kill_tree(me, group)
    _write_status(status_path, cause=cause, exit_code=code, error=why, killed=killed)
    return code


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ebbtide-shim", description=__doc__.splitlines()[0])
    parser.add_argument("--lease-fd", type=int, help="read end of the agent's lease pipe")
    parser.add_argument("--lease-s", type=float, default=5.0, help="lease length, in seconds")
    parser.add_argument("--status", help="where to write how the attempt ended (JSON)")
    parser.add_argument("--cwd", help="the job's working directory")
    parser.add_argument("--user", help="run the job as this user (its name, for messages)")
    parser.add_argument("--uid", type=int, help="... whose uid this is")
    parser.add_argument("--gid", type=int, help="... with this group")
    parser.add_argument("--groups", default="", help="... and these groups (comma-separated)")
    parser.add_argument("--home", default="/", help="... starting here when no --cwd")
    parser.add_argument(
        "--mkdir", action="append", default=[], help="a directory the job's user makes first"
    )
    parser.add_argument(
        "--env-fd",
        type=int,
        help="read the job's environment (a JSON object) from this descriptor; the shim's "
        "own stays the agent's minimal one, so nothing the job sets (LD_PRELOAD, ...) acts "
        "on the shim",
    )
    parser.add_argument(
        "--trim-path",
        action="store_true",
        help="the job's PATH is the agent's, not the job's: keep only its absolute "
        "directories the job's user can search, as that user decides just before the exec",
    )
    parser.add_argument("--stdout", help="the file the job's stdout goes to")
    parser.add_argument("--stderr", help="the file the job's stderr goes to")
    parser.add_argument(
        "--truncate-output", action="store_true", help="start those files afresh, not append"
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the job's command")
    ns = parser.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        parser.error("no command to run")
    if (ns.uid is None) != (ns.gid is None):
        parser.error("--uid and --gid go together")
    user = None
    if ns.uid is not None:
        groups = tuple(int(g) for g in ns.groups.split(",") if g)
        user = User(ns.user or f"uid {ns.uid}", ns.uid, ns.gid, groups or (ns.gid,), ns.home)
    elif ns.mkdir:
        parser.error("--mkdir is for a job that runs as another user (--uid)")
    env = None
    if ns.env_fd is not None:
        try:
            env = read_env(ns.env_fd)
        except (OSError, ValueError) as exc:
            parser.error(f"--env-fd: {exc}")
    if ns.lease_fd is not None:
        os.set_blocking(ns.lease_fd, False)
        os.set_inheritable(ns.lease_fd, False)  # the shim's alone: never the job's
    return run(
        argv,
        lease_fd=ns.lease_fd,
        lease_s=ns.lease_s,
        status_path=ns.status,
        cwd=ns.cwd,
        user=user,
        make_dirs=ns.mkdir,
        env=env,
        outputs=(
            Outputs(ns.stdout, ns.stderr, ns.truncate_output) if ns.stdout or ns.stderr else None
        ),
        trim_path=ns.trim_path,
    )


def read_env(fd: int) -> dict[str, str]:
    """The job's environment, a JSON object of strings, read from ``fd`` to its end."""
    chunks = []
    with open(fd, "rb", closefd=True) as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    env = json.loads(b"".join(chunks))
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("expected a JSON object of strings")
    return env


if __name__ == "__main__":
    sys.exit(main())
