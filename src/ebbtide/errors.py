"""The exception tree: one root, a few branches.

Everything ebbtide raises on purpose derives from :class:`EbbtideError`, so a caller
can catch one class.  User mistakes (bad specs, bad files, bad flags) derive from
:class:`UserError` and are reported by the CLI as one clear message, never a traceback.
"""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name where it has none: how a
    log line or a probe names an error it waits out (a driver's message runs on for lines)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class EbbtideError(Exception):
    """Root of every error ebbtide raises on purpose."""


class UserError(EbbtideError):
    """Something the user wrote is wrong; the message says what and where."""


class SpecError(UserError, ValueError):
    """A job spec field is invalid (also a ``ValueError``).

    Attributes:
      field: dotted path of the offending field (``"slice.gpu"``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class ConfigError(UserError):
    """A settings value or a policy file is invalid."""


class NoStore(UserError):
    """A command that only reads found no store where the settings point (a SQLite file
    that is not there): nothing was submitted there, or ``EBBTIDE_HOME`` is mistyped."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"there is no ebbtide store at {path}: nothing was ever submitted there; check "
            "EBBTIDE_HOME (or EBBTIDE_DB_URL)"
        )
        self.path = path


class JobNotFound(UserError):
    """No job has that id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class PermissionDenied(UserError):
    """The caller may not act on that job (it belongs to someone else)."""


class Unauthenticated(PermissionDenied):
    """``ebb server`` could not tell who the caller is: no credentials, or a bearer token
    that is unknown, revoked or expired (HTTP 401)."""


class InvalidTransition(EbbtideError):
    """A state change the transition table does not allow."""


class StaleState(EbbtideError):
    """The row was no longer in the expected state (or attempt) when we tried to change it.

    This is the normal outcome of a race (two actors deciding about one job) or of a
    late message from an attempt that was already given up on: the loser backs off.
    """


class NotLeader(EbbtideError):
    """A scheduler wrote with a leadership epoch that is no longer the current one: it
    lost its lock (its connection dropped, it was paused) and another scheduler leads.
    The write did not happen; the deposed scheduler stands down."""


class StoreUnavailable(EbbtideError):
    """The job store (the database) cannot be reached; the message names it without its
    password."""


class BrokerUnavailable(EbbtideError):
    """The message broker cannot be reached."""


class ServerUnavailable(EbbtideError):
    """The ``ebb server`` at ``EBBTIDE_URL`` cannot be reached."""


class PlatformUnavailable(EbbtideError):
    """The platform attempts run on (the Kubernetes API server) cannot be reached."""
