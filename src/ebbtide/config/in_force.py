"""Why the policy file a user looks at may not be the policy in force.

Clients check jobs against the policy the scheduler published to the store, not against
``EBBTIDE_POLICY``'s file (that one counts only while no scheduler has published one),
and a scheduler whose reload failed keeps the policy it had.  Either way a queue the
user's file names is refused as unknown, and the refusal must say which file counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ebbtide.errors import ConfigError, SpecError


class Publisher(Protocol):
    """Where the scheduler publishes its policy (the store)."""

    def published_policy(self) -> tuple[str, str, float] | None: ...


def not_in_force(source: str, text: str, chosen: Path | None) -> str | None:
    """Why the file a user may believe in is not the policy in force, which the
    scheduler loaded from ``source`` (``""``: the built-in defaults) as ``text``:
    ``chosen`` (``EBBTIDE_POLICY``) is another file, or ``source`` has changed since it
    was loaded (a reload that failed keeps the old policy).  None when neither holds."""
    where = source or "the built-in defaults"
    if chosen is not None and not _same(Path(source) if source else None, chosen):
        return (
            f"the policy in force is the scheduler's, from {where}, not EBBTIDE_POLICY's "
            f"{chosen}: a scheduler reads only its own file; change that one, or restart the "
            f"scheduler with EBBTIDE_POLICY={chosen}"
        )
    loaded = Path(source) if source else None
    if loaded is not None and loaded.is_absolute() and _differs(loaded, text):
        return (
            f"{source} has changed since the scheduler loaded it: what it loaded is the "
            f"policy in force; if a reload failed, ebb policy check {source} says why"
        )
    return None


def queue_refused(exc: ConfigError, store: Publisher, chosen: Path | None) -> SpecError:
    """The refusal of a job whose queue the policy in force does not know (``exc``), with
    why the user's file does not count where that is the reason."""
    message = str(exc).removeprefix("queue: ")
    record = store.published_policy()
    why = None if record is None else not_in_force(record[1], record[0], chosen)
    return SpecError("queue", message if why is None else f"{message}; {why}")


def _same(loaded: Path | None, chosen: Path) -> bool:
    if loaded is None:
        return False
    if loaded == chosen:
        return True
    try:
        return loaded.is_absolute() and loaded.resolve() == chosen.resolve()
    except OSError:
        return False


def _differs(path: Path, text: str) -> bool:
    """Whether the file at ``path`` (readable here) no longer holds ``text``."""
    try:
        return path.read_text() != text
    except (OSError, UnicodeDecodeError):
        return False  # another host's path, or not ours to read: nothing to compare
