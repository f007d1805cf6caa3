"""An attempt's output as its owner reads it (``ebb logs``, ``Client.logs``).

The node agent writes each attempt's output to
``$EBBTIDE_HOME/logs/<job id>/<attempt>/stdout.log`` and ``stderr.log``; a fleet's API
server reads them where that home is shared with the agents.

The reader may run as root (``ebb server``) for a job's owner, who may own the attempt's
directory: so the path below ``logs/`` is walked without following symbolic links, and
only a plain file with one name is read — never what a job pointed its log at.

A job submitted with ``-o``/``-e`` (PBS) or ``--output``/``--error`` (Slurm, whose
default is ``slurm-%j.out``) writes there instead; its node agent records the path each
attempt's output went to (``%j``, ``%N``... filled in), and :func:`read_job_file` reads
it — a path the job's owner chose, so only a plain file of theirs is shown.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ebbtide.errors import UserError

#: How much of a log's end is read when the caller does not say, in bytes (1 MiB).
DEFAULT_TAIL_BYTES = 1024 * 1024
#: The most of a log's end one read returns, in bytes (64 MiB).
MAX_TAIL_BYTES = 64 * 1024 * 1024

STREAMS = ("stdout", "stderr")
#: A job joined with ``-j oe`` (``eo``) and no file named: the kept log both streams go to
JOINED_LOG = {"oe": "stdout", "eo": "stderr"}


@dataclass(frozen=True)
class LogTail:
    """The end of one attempt's stdout or stderr."""

    job_id: int
    attempt: int
    #: ``stdout`` or ``stderr``
    stream: str
    #: the bytes read, as UTF-8 (a character cut at the start, or bytes that are not
    #: UTF-8, read as U+FFFD)
    text: str
    #: the file's size, in bytes
    size: int
    #: the file holds more than was read
    truncated: bool
    #: the file the job sent this output to (``-o``, ``--output``...), where it was read
    #: from; None: the attempt's log, kept by ebbtide
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogTail:
        """From :meth:`to_dict`'s shape; keys this version does not know are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class NoLogYet(UserError):
    """There is no output to show yet: the attempt has not started, or has not written
    any (``ebb logs -f`` waits for it)."""


def attempt_dir(home: Path, job_id: int, attempt: int) -> Path:
    """Where the node agent keeps an attempt's logs."""
    return home / "logs" / str(job_id) / str(attempt)


def read_tail(
    home: Path, job_id: int, attempt: int, stream: str, tail_bytes: int, *, owner: str
) -> LogTail:
    """The last ``tail_bytes`` of the attempt's ``stream``, or a :class:`UserError`
    saying why there is none to read.  The file must belong to the job's ``owner``, to
    this process's user or to root (an agent running jobs as itself): the owner controls
    the directory, and must not get another user's file shown through a hard link."""
    path = attempt_dir(home, job_id, attempt) / f"{stream}.log"
    fds: list[int] = []
    try:
        fds.append(os.open(home / "logs", os.O_RDONLY | os.O_DIRECTORY))
        for part in (str(job_id), str(attempt)):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            fds.append(os.open(part, flags, dir_fd=fds[-1]))
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        fds.append(os.open(f"{stream}.log", flags, dir_fd=fds[-1]))
        info = os.fstat(fds[-1])
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise UserError(f"{path} is not a plain file; its log cannot be shown")
        if info.st_uid not in _log_owners(owner):
            raise UserError(f"{path} does not belong to {owner}; its log cannot be shown")
        start = max(0, info.st_size - tail_bytes)
        data = _read_from(fds[-1], start, info.st_size - start)
    except FileNotFoundError:
        raise NoLogYet(
            f"job {job_id} attempt {attempt} has no {stream} log at {path} (no output yet, "
            "or the node agent's home is not shared with this host)"
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UserError(f"{path} is not a plain file; its log cannot be shown") from None
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return LogTail(
        job_id=job_id,
        attempt=attempt,
        stream=stream,
        text=data.decode("utf-8", errors="replace"),
        size=info.st_size,
        truncated=start > 0,
    )


def is_kept_log(path: str, job_id: int, attempt: int, stream: str) -> bool:
    """Whether ``path``, where an attempt's ``stream`` went, is the log ebbtide keeps for
    the attempt (``…/logs/<job id>/<attempt>/<stream>.log``) rather than a file the job
    named."""
    return Path(path).parts[-4:] == ("logs", str(job_id), str(attempt), f"{stream}.log")


def read_job_file(
    path: str,
    job_id: int,
    attempt: int,
    stream: str,
    tail_bytes: int,
    *,
    owner: str,
    reader_uid: int | None = None,
) -> LogTail:
    """The last ``tail_bytes`` of ``path``, the file the attempt's ``stream`` went to (the
    job's ``-o``/``--output``), or a :class:`UserError` saying why it is not shown.

    The job's owner chose the path, and may have replaced the file since: it is shown only
    if it is a plain file (never opened if it is a device or a FIFO; a symbolic link in
    its last part is not followed) that belongs to the job's owner — or to ``reader_uid``,
    the user this process reads for itself (a client on one host, whose own permissions
    already decide what it may read; never ``ebb server`` reading for a caller)."""
    where = f"job {job_id} attempt {attempt} sent its {stream} to {path}"
    if path == os.devnull:
        raise UserError(f"{where}: nothing was kept")
    uids = set() if reader_uid is None else {reader_uid}
    with contextlib.suppress(KeyError, ValueError):
        uids.add(pwd.getpwnam(owner).pw_uid)
    try:
        seen = os.lstat(path)
        if not stat.S_ISREG(seen.st_mode):
            raise UserError(f"{where}, which is not a plain file now; it cannot be shown")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
                raise UserError(f"{where}, which changed while it was opened; try again")
            if info.st_uid not in uids:
                raise UserError(
                    f"{where}, which belongs to {_user(info.st_uid)}, not {owner}; "
                    "it cannot be shown"
                )
            start = max(0, info.st_size - tail_bytes)
            data = _read_from(fd, start, info.st_size - start)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise NoLogYet(
            f"{where}, which is not there (no output yet; or it was moved or deleted, or "
            "it is on a file system this host does not see)"
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UserError(f"{where}, which is not a plain file now; it cannot be shown") from None
        raise UserError(f"{where}, which cannot be read here: {exc.strerror}") from None
    return LogTail(
        job_id=job_id,
        attempt=attempt,
        stream=stream,
        text=data.decode("utf-8", errors="replace"),
        size=info.st_size,
        truncated=start > 0,
        path=path,
    )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _log_owners(owner: str) -> set[int]:
    """The uids a job's log may belong to: its owner's, ours, root's."""
    uids = {0, os.geteuid()}
    with contextlib.suppress(KeyError, ValueError):
        uids.add(pwd.getpwnam(owner).pw_uid)
    return uids


def _read_from(fd: int, offset: int, count: int) -> bytes:
    chunks = []
    while count > 0:
        chunk = os.pread(fd, count, offset)
        if not chunk:  # the file shrank meanwhile
            break
        chunks.append(chunk)
        offset += len(chunk)
        count -= len(chunk)
    return b"".join(chunks)
