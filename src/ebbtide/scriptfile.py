"""Reading a job script from disk, with nothing heavier than the standard library, so the
thin client of ``ebb qsub`` (:mod:`ebbtide.cli.fast`) can send its text to a server.

The file is looked at (``os.stat``) before it is read: a directory, a named pipe, a device
or a file over :data:`MAX_SCRIPT_BYTES` is refused without reading a byte.  Errors are
:class:`~ebbtide.errors.SpecError` on the field ``SCRIPT``.
"""

from __future__ import annotations

import os
import stat

from ebbtide.errors import SpecError

#: Largest script, in bytes (1 MiB): the script is stored with the job.
MAX_SCRIPT_BYTES = 1024 * 1024

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(mode: int, size: int, name: str) -> None:
    """A script is a regular file of at most :data:`MAX_SCRIPT_BYTES`."""
    if not stat.S_ISREG(mode):
        what = next((words for test, words in _NOT_REGULAR if test(mode)), "not a regular file")
        raise SpecError("SCRIPT", f"{name!r} is {what}, not a script (give a regular file)")
    if size > MAX_SCRIPT_BYTES:
        raise SpecError(
            "SCRIPT",
            f"{name!r} is {size} bytes; a script may be at most {MAX_SCRIPT_BYTES} (1 MiB)",
        )


def read_script(path: str | os.PathLike[str]) -> str:
    """The text of the job script at ``path`` (UTF-8, no NUL byte, not blank)."""
    name = os.fspath(path)
    if "\0" in name:
        raise SpecError("SCRIPT", f"{name!r} holds a NUL byte, so it cannot be a path")
    try:
        info = os.stat(path)
        _check_regular(info.st_mode, info.st_size, name)
        # non-blocking: should the path turn into a pipe after the stat, open still returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            _check_regular(info.st_mode, info.st_size, name)
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise SpecError("SCRIPT", f"cannot read {name!r}: {exc.strerror}") from None
    if len(data) > MAX_SCRIPT_BYTES:  # it grew after the stat
        raise SpecError(
            "SCRIPT", f"{name!r} is over {MAX_SCRIPT_BYTES} bytes; a script may be at most 1 MiB"
        )
    if b"\0" in data:
        raise SpecError("SCRIPT", f"{name!r} is not a text file (it holds a NUL byte)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("SCRIPT", f"{name!r} is not a text file (it is not UTF-8)") from None
    if not text.strip():
        raise SpecError("SCRIPT", f"{name!r} is empty")
    return text
