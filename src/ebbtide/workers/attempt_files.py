"""An attempt's directories and files, made so that no job can turn them against the agent.

An agent running as root writes into directories that its jobs' owners can write, and
that is where symlink tricks live: a ``stdout.log`` planted as a link to ``/etc/passwd``
would have root append to it, a ``chown`` through a link would hand over any file.  So:

- what the agent trusts for its own control lives where no job can write: the shim's
  status file is in the agent's run directory (``<home>/run/<node>``, 0700); the job's
  own status lines (``status.jsonl``) are read as untrusted input
  (:mod:`ebbtide.workers.status`);
- the directories on the way to an attempt's are the agent's: ``<home>/logs``,
  ``<home>/logs/<job>`` and ``<home>/checkpoints``, mode 0711 (a job's user passes
  through to its own directory, and lists no one's); ``<home>`` too when jobs run as
  other users (:func:`share_home`; it stays 0700 otherwise);
- an attempt's directory ``<home>/logs/<job>/<attempt>`` and its default checkpoint
  directory ``<home>/checkpoints/<job>`` belong to the job's user, mode 0700: made by the
  agent in a directory of its own (so nothing can have been planted in their place) and
  handed over through a descriptor opened with ``O_NOFOLLOW``;
- files in them are opened with ``O_NOFOLLOW`` and checked (a regular file with one link,
  the job user's or the agent's) before anything is written to them or handed over, and
  the job's script is written under a fresh name and renamed into place (a rename replaces
  a planted link, never what it points to).  Logs are 0600;
- directories the job names itself (``checkpoint_dir``) are made by the job's user, in the
  shim's child once it has dropped privileges: the agent never makes a directory its
  job's user could not.

The ``identity`` is whom the job runs as (:class:`~ebbtide.workers.runas.Identity`); None
or one the agent need not switch to: the agent's own user, and nothing is handed over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from ebbtide.workers.runas import Identity

#: Directories on the way to the attempts' own: passed through, not listed, by others.
SHARED_DIR_MODE: Final = 0o711
#: An attempt's directory and its default checkpoint directory: its user's alone.
PRIVATE_DIR_MODE: Final = 0o700
#: The attempt's stdout and stderr.
LOG_MODE: Final = 0o600
#: The job's script (``job.script``): read and run by whoever runs the job (a pod's user
#: too, where the attempt's directory is handed to it); its directory keeps others out.
SCRIPT_MODE: Final = 0o755


class UnsafeFile(OSError):
    """A path the agent was to write or hand over is not what it must be (a link, another
    user's, not a regular file): the attempt is not started, and the message says why."""


def _switching(identity: Identity | None) -> Identity | None:
    return identity if identity is not None and identity.switch else None


def share_home(home: Path) -> list[str]:
    """Make ``home`` and its ``logs`` and ``checkpoints`` passable for jobs of other users
    (0711, the agent's).  Returns warnings about the directories above ``home`` that
    others cannot pass through (then no job of theirs can reach its files)."""
    home.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    home = home.resolve()  # a home that is a link is the admin's choice, not a job's
    for d in (home, home / "logs", home / "checkpoints"):
        directory(d, SHARED_DIR_MODE)
    warnings = []
    for above in home.parents:
        mode = os.stat(above).st_mode
        if not mode & stat.S_IXOTH:
            warnings.append(
                f"{above} is mode {stat.S_IMODE(mode):04o}: jobs running as other users "
                f"cannot reach {home}; give it o+x (or move EBBTIDE_HOME)"
            )
    return warnings


def directory(path: Path, mode: int, identity: Identity | None = None) -> Path:
    """Make ``path`` (in a directory of the agent's) unless it is there; check that it is a
    directory, not a link, and the agent's or ``identity``'s; give it ``mode`` and, when
    the job runs as another user, that user — all through one ``O_NOFOLLOW`` descriptor."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # ELOOP: a link; ENOTDIR: something else
        raise UnsafeFile(f"{path} is not a directory ({exc.strerror}); not using it") from None
    try:
        st = os.fstat(fd)
        _check_owner(st, path, identity)
        target = _switching(identity)
        if target is not None and (st.st_uid, st.st_gid) != (target.uid, target.gid):
            os.fchown(fd, target.uid, target.gid)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def attempt_dir(home: Path, job_id: int, attempt: int, identity: Identity | None) -> Path:
    """``<home>/logs/<job>/<attempt>``: the attempt's logs, script and status lines."""
    logs = directory(home / "logs", SHARED_DIR_MODE)
    job = directory(logs / str(job_id), SHARED_DIR_MODE)
    return directory(job / str(attempt), PRIVATE_DIR_MODE, identity)


def checkpoint_dir(home: Path, job_id: int, identity: Identity | None) -> Path:
    """``<home>/checkpoints/<job>``: where a job that names none keeps its checkpoints."""
    top = directory(home / "checkpoints", SHARED_DIR_MODE)
    return directory(top / str(job_id), PRIVATE_DIR_MODE, identity)


def open_log(path: Path, identity: Identity | None) -> int:
    """A descriptor to append the attempt's output to ``path``: a regular file of the job's
    user, mode 0600 (made if missing; a link, a FIFO or another user's file is refused)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, LOG_MODE)
    except OSError as exc:  # ELOOP: a link; ENXIO: a FIFO no one reads
        raise UnsafeFile(f"cannot open the log {path}: {exc.strerror}") from None
    try:
        _take_over(fd, path, identity, LOG_MODE)
        # O_NONBLOCK kept a FIFO from hanging the open; the job's output blocks as usual
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_script(path: Path, text: str, identity: Identity | None) -> Path:
    """Write the job's script to ``path`` (0755, the job user's) under a fresh name, then
    rename it into place: whatever was at ``path`` (a planted link) is replaced, not
    followed."""
    return write_file(path, text, identity, SCRIPT_MODE)


def write_file(path: Path, text: str, identity: Identity | None, mode: int) -> Path:
    """Write ``text`` to ``path`` (``mode``, the job user's) as :func:`write_script` does."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data) :]
            _take_over(fd, tmp, identity, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _take_over(fd: int, path: Path, identity: Identity | None, mode: int) -> None:
    """Check the file open at ``fd`` (a regular file, one link, the agent's or the job
    user's), then give it the job's user and ``mode``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path} is not a regular file; not using it")
    if st.st_nlink != 1:
        raise UnsafeFile(f"{path} has {st.st_nlink} links (another file's?); not using it")
    _check_owner(st, path, identity)
    target = _switching(identity)
    if target is not None and (st.st_uid, st.st_gid) != (target.uid, target.gid):
        os.fchown(fd, target.uid, target.gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


def _check_owner(st: os.stat_result, path: Path, identity: Identity | None) -> None:
    allowed = {os.geteuid()} | ({identity.uid} if identity is not None else set())
    if st.st_uid not in allowed:
        raise UnsafeFile(
            f"{path} belongs to uid {st.st_uid}, not to the agent or the job's user; not using it"
        )
