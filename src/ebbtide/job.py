"""The API an offline job imports: ``import ebbtide.job as job``.

A checkpointable job restores its state, works, checkpoints now and then, and when the
node agent warns it (online load is rising and its slice is wanted back) checkpoints once
more and exits with :data:`REQUEUE_EXIT_CODE`; ebbtide requeues it and a later attempt
resumes from that checkpoint::

    import ebbtide.job as job

    state = job.restore({"step": 0})
    while state["step"] < 1000:
        train_one_step(state)
        state["step"] += 1
        if state["step"] % 100 == 0:
            job.checkpoint(state)
        if job.preempted():
            job.checkpoint(state)
            job.requeue()

Jobs whose framework writes its own checkpoint files use :func:`checkpoint_dir`,
:func:`resume_from` and :func:`checkpointed` instead of :func:`checkpoint` and
:func:`restore`.

The contract with the node agent (all of it; a job in another language can follow it
directly, see ``examples/count.sh``):

=========================== ================================================================
``EBBTIDE_JOB_ID``          the job id (int)
``EBBTIDE_ATTEMPT``         the attempt number, 1, 2, …
``EBBTIDE_ARRAY_INDEX``     the index of an array task (array tasks only)
``EBBTIDE_CHECKPOINT_DIR``  an existing directory where the job keeps its checkpoints
``EBBTIDE_RESUME_FROM``     the last checkpoint reported, unset or empty on a fresh start
``EBBTIDE_WARNING_SIGNAL``  the eviction warning signal, a name like ``TERM`` (default), ``USR1``
``EBBTIDE_STATUS_FILE``     a file the job appends JSON lines to, one object per line
=========================== ================================================================

Status lines are ``{"type": "checkpoint", "path", "size_bytes", "duration_s", "time"}``,
``{"type": "progress", "done", "total", "time"}`` (``time`` in Unix seconds) and
``{"type": "result", "value"}`` (:func:`result`: what ``JobHandle.result()`` returns).  Exit
code :data:`REQUEUE_EXIT_CODE` (99) means "checkpointed, requeue me".

Outside ebbtide (none of these variables set) everything still works for local runs:
checkpoints go to ``./.ebbtide-checkpoints``, status lines are dropped, and
:func:`preempted` reacts to ``SIGTERM``.

The warning handler is installed when this module is imported (and again on first use
if the import happened off the main thread).  It only sets a flag: nothing is raised in
the middle of the job's code, and the job decides when to stop by polling
:func:`preempted`.  A job that ignores the warning is killed at the eviction deadline and
resumes from its last periodic checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from ebbtide import status_lines as _lines
from ebbtide import units
from ebbtide.queue.spec import REQUEUE_EXIT_CODE
from ebbtide.status_lines import PROGRESS_LINE_PERIOD_S

__all__ = [
    "DEFAULT_CHECKPOINT_DIR",
    "PROGRESS_LINE_PERIOD_S",
    "REQUEUE_EXIT_CODE",
    "STATE_FILE_NAME",
    "array_index",
    "attempt",
    "checkpoint",
    "checkpoint_dir",
    "checkpointed",
    "job_id",
    "preempted",
    "progress",
    "requeue",
    "restore",
    "result",
    "resume_from",
    "warning_signal",
]

#: Where checkpoints go when ``EBBTIDE_CHECKPOINT_DIR`` is not set (relative to the cwd).
DEFAULT_CHECKPOINT_DIR = ".ebbtide-checkpoints"
#: The file :func:`checkpoint` writes in the checkpoint directory (a pickle).
STATE_FILE_NAME = "state.pkl"
#: The largest result a job may give (``result``), in bytes of JSON: it travels in one
#: status line, which the node agent reads up to 4 KiB.
MAX_RESULT_BYTES = 3072

_TMP_PREFIX = f".{STATE_FILE_NAME}."
_TMP_SUFFIX = ".tmp"

_warned = False
_handler_installed = False
_install_lock = threading.Lock()
_swept_temp_files = False


# --------------------------------------------------------------------------- identity


def job_id() -> int | None:
    """The ebbtide job id, or ``None`` outside ebbtide."""
    _ensure_handler()
    return _env_int("EBBTIDE_JOB_ID")


def attempt() -> int:
    """The attempt number (1 for the first run, 2 after one requeue, …); 1 outside ebbtide."""
    _ensure_handler()
    value = _env_int("EBBTIDE_ATTEMPT")
    return 1 if value is None else value


def array_index() -> int | None:
    """The index of this array task, or ``None`` for a job that is not an array task."""
    _ensure_handler()
    return _env_int("EBBTIDE_ARRAY_INDEX")


def warning_signal() -> signal.Signals:
    """The signal the agent sends as the eviction warning (``EBBTIDE_WARNING_SIGNAL``)."""
    raw = os.environ.get("EBBTIDE_WARNING_SIGNAL", "").strip() or "TERM"
    try:
        return signal.Signals(units.parse_warning_signal(raw))
    except ValueError as exc:
        raise ValueError(f"EBBTIDE_WARNING_SIGNAL: {exc}") from None


# ------------------------------------------------------------------------- preemption


def preempted() -> bool:
    """True once the eviction warning arrived: checkpoint now, then call :func:`requeue`."""
    _ensure_handler()
    return _warned


def requeue() -> NoReturn:
    """End this attempt as evicted, not failed: ``sys.exit(REQUEUE_EXIT_CODE)``.

    ``finally`` blocks and ``atexit`` hooks run.  Call it from the main thread (in another
    thread ``sys.exit`` only ends that thread), after a checkpoint.
    """
    _ensure_handler()
    _lines.flush_progress()
    sys.exit(REQUEUE_EXIT_CODE)


def _on_warning(signum: int, frame: FrameType | None) -> None:
    global _warned
    _warned = True


def _ensure_handler() -> None:
    """Install the warning handler once; retried later if not on the main thread now."""
    global _handler_installed
    if _handler_installed:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal only works on the main thread; the next call there installs it
    with _install_lock:
        if _handler_installed:
            return
        signum = warning_signal()
        try:
            signal.signal(signum, _on_warning)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"EBBTIDE_WARNING_SIGNAL: cannot handle {signum.name} ({exc}); "
                "use a catchable signal like TERM or USR1"
            ) from None
        _handler_installed = True


# ------------------------------------------------------------ pickled state (simple API)


def restore(default: Any = None) -> Any:
    """The state saved by the last :func:`checkpoint`, or ``default`` on a fresh start.

    Under ebbtide, the checkpoint the node agent gives (``EBBTIDE_RESUME_FROM``; empty:
    a fresh start, whatever the checkpoint directory holds: other jobs may share it).  A
    local run (the variable is not set) resumes from the newest ``state.pkl`` under
    :func:`checkpoint_dir`, and says so on stderr (so that one stopped and rerun resumes).

    Raises:
      ValueError: ``EBBTIDE_RESUME_FROM`` names something :func:`checkpoint` did not
        write, e.g. a framework's checkpoint file (use :func:`resume_from` for those).
      FileNotFoundError: ``EBBTIDE_RESUME_FROM`` names a path that does not exist.
    """
    _ensure_handler()
    given = resume_from()
    if given is not None:
        if not given.exists():
            raise FileNotFoundError(f"EBBTIDE_RESUME_FROM={given}: no such checkpoint")
        path = given / STATE_FILE_NAME if given.is_dir() else given
        if path.name != STATE_FILE_NAME or not path.is_file():
            raise ValueError(_not_ours(given, f"it is not a {STATE_FILE_NAME}"))
        return _load(path, given)
    if "EBBTIDE_RESUME_FROM" in os.environ:
        # the agent's word: a fresh start (a state.pkl in a shared directory is another's)
        return default
    candidates = list(checkpoint_dir().rglob(STATE_FILE_NAME))
    if not candidates:
        return default
    newest = max(candidates, key=lambda p: p.stat().st_mtime_ns)
    state = _load(newest, newest)
    print(
        f"ebbtide.job: a local run: resuming from {newest} (delete it to start afresh)",
        file=sys.stderr,
    )
    return state


def checkpoint(state: Any) -> Path:
    """Save ``state`` (anything picklable) atomically and tell the agent; return its path.

    The pickle is written to a temporary file in the checkpoint directory, flushed and
    fsynced, renamed over ``state.pkl`` and the directory fsynced: a kill at any moment
    leaves either the previous checkpoint or this one, never a damaged file.
    """
    _ensure_handler()
    started = time.monotonic()
    directory = checkpoint_dir()
    _sweep_temp_files(directory)
    target = directory / STATE_FILE_NAME
    tmp = directory / f"{_TMP_PREFIX}{os.getpid()}{_TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as f:
            try:
                pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                why = f"checkpoint: the state cannot be pickled ({exc}); keep plain data in it"
                raise TypeError(f"{why}, or save it yourself and call checkpointed(path)") from exc
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    _report_checkpoint(target, target.stat().st_size, time.monotonic() - started)
    return target


# ------------------------------------------------------- framework files (file-based API)


def checkpoint_dir() -> Path:
    """The directory where this job keeps its checkpoints (created if missing), absolute."""
    _ensure_handler()
    directory = Path(os.environ.get("EBBTIDE_CHECKPOINT_DIR") or DEFAULT_CHECKPOINT_DIR)
    directory = directory.expanduser().absolute()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def resume_from() -> Path | None:
    """The checkpoint to resume from (``EBBTIDE_RESUME_FROM``), or ``None`` on a fresh start."""
    _ensure_handler()
    raw = os.environ.get("EBBTIDE_RESUME_FROM", "")
    return Path(raw) if raw else None


def checkpointed(path: str | os.PathLike[str], duration_s: float | None = None) -> None:
    """Tell the agent that ``path`` is now the latest checkpoint.

    ``path`` is a file or a directory the framework has finished writing (atomically,
    e.g. a temporary name then a rename); a later attempt gets it from
    :func:`resume_from`.  Give ``duration_s`` (how long saving took, in seconds) if
    known; it is reported as ``null`` otherwise.
    """
    _ensure_handler()
    target = Path(path).absolute()
    if not target.exists():
        raise FileNotFoundError(f"checkpointed({str(path)!r}): no such file or directory")
    _report_checkpoint(target, _size_bytes(target), duration_s)


# --------------------------------------------------------------------------- progress


def progress(done: float, total: float | None = None) -> None:
    """Report progress (``done`` of ``total`` units of work, any unit) to the agent.

    Cheap enough for every step: a status line is written at most every
    :data:`PROGRESS_LINE_PERIOD_S`, the latest call's, and the one left over goes out with
    the next checkpoint or result, at :func:`requeue` and when the process exits.  The
    node agent passes the latest on to the store at most every 10 s (the first at once,
    the last when the attempt ends).
    """
    checked = _lines.checked_progress(done, total)  # (refused before anything is set up)
    _ensure_handler()
    _lines.progress(*checked)


def result(value: Any) -> None:
    """Give ``value`` as the job's result, for ``JobHandle.result()``: a small JSON value
    (a metric, a path to the output), at most :data:`MAX_RESULT_BYTES` as JSON.  The last
    one given wins.  Raises ``TypeError`` or ``ValueError`` for what cannot be one."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"a job's result must be a JSON value: {exc}") from None
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise ValueError(
            f"a job's result is at most {MAX_RESULT_BYTES} bytes as JSON; give a path to a "
            "file instead"
        )
    _lines.flush_progress()
    _lines.write({"type": "result", "value": value})


# ---------------------------------------------------------------------------- helpers


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _not_ours(given: Path, why: str) -> str:
    return (
        f"EBBTIDE_RESUME_FROM={given} was not written by ebbtide.job.checkpoint() ({why}). "
        "A job whose framework writes its own checkpoint files should save them under "
        "job.checkpoint_dir(), report them with job.checkpointed(path) and load "
        "job.resume_from() itself instead of calling job.restore()."
    )


def _load(path: Path, given: Path) -> Any:
    with open(path, "rb") as f:
        try:
            return pickle.load(f)
        except (pickle.UnpicklingError, EOFError) as exc:
            raise ValueError(_not_ours(given, f"it does not unpickle: {exc}")) from None


def _sweep_temp_files(directory: Path) -> None:
    """Remove temporary files left by attempts killed in the middle of a checkpoint."""
    global _swept_temp_files
    if _swept_temp_files:
        return
    mine = f"{_TMP_PREFIX}{os.getpid()}{_TMP_SUFFIX}"
    for leftover in directory.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        if leftover.name != mine:
            leftover.unlink(missing_ok=True)
    _swept_temp_files = True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size_bytes(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            entry = Path(root, name)
            if not entry.is_symlink():
                total += entry.stat().st_size
    return total


def _report_checkpoint(path: Path, size_bytes: int, duration_s: float | None) -> None:
    _lines.flush_progress()
    _lines.write(
        {
            "type": "checkpoint",
            "path": str(path),
            "size_bytes": size_bytes,
            "duration_s": duration_s,
            "time": time.time(),
        }
    )


_ensure_handler()
