"""What crosses between ``ebb server`` and :class:`~ebbtide.api.remote.RemoteClient`: a
job's JSON and an error's JSON, written by one side and read by the other in one place.

A job travels as ``ebb qstat --json`` shows it (:meth:`Client.as_dict
<ebbtide.client.Client.as_dict>`) plus ``spec``, what it was submitted with (its
environment's values masked for anyone but its owner and admins), from which the remote
client rebuilds the :class:`~ebbtide.queue.models.Job` row.

An error travels as ``{"detail": message, "error": class name}`` (with ``field`` for a
:class:`SpecError`, ``job_id`` for :class:`JobNotFound`) under its HTTP status, and is
raised again on the client side as the same class, so a caller catches the same
exceptions whether the store is local or behind a server.  No module here imports the
web framework: the remote client does not need it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ebbtide.errors import (
    ConfigError,
    EbbtideError,
    InvalidTransition,
    JobNotFound,
    PermissionDenied,
    SpecError,
    StaleState,
    Unauthenticated,
    UserError,
)

if TYPE_CHECKING:  # the thin client (ebbtide.cli.fast) reads errors without the models
    from ebbtide.queue.models import Job

#: The API's version prefix.
PREFIX = "/v1"
#: The header by which an admin acts for another user (``EBBTIDE_USER`` on the client).
ACT_AS_HEADER = "X-Ebbtide-Act-As"

#: HTTP status of each error, the most specific class first.
STATUS: tuple[tuple[type[EbbtideError], int], ...] = (
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (JobNotFound, 404),
    (SpecError, 422),
    (UserError, 400),
    (StaleState, 409),
    (InvalidTransition, 409),
    (EbbtideError, 400),
)
#: The classes a client raises again by name (anything else: by status).
_BY_NAME: dict[str, type[EbbtideError]] = {
    cls.__name__: cls
    for cls in (
        Unauthenticated,
        PermissionDenied,
        ConfigError,
        UserError,
        StaleState,
        InvalidTransition,
    )
}


def job_out(data: dict[str, Any], job: Job) -> dict[str, Any]:
    """A job's JSON: ``data`` (its ``as_dict`` or ``describe`` shape) with its ``spec``."""
    return {**data, "spec": json.loads(job.spec_json)}


def job_in(data: dict[str, Any]) -> Job:
    """The job row a job's JSON was made from."""
    from ebbtide.queue.models import Job

    fields = {name: data[name] for name in Job.model_fields if name in data}
    fields["spec_json"] = json.dumps(data["spec"])
    fields["depends_json"] = json.dumps(data.get("depends") or [])
    return Job.model_validate(fields)


def error_out(exc: EbbtideError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body of an error."""
    status = next(code for cls, code in STATUS if isinstance(exc, cls))
    body: dict[str, Any] = {"detail": str(exc) or type(exc).__name__, "error": type(exc).__name__}
    if isinstance(exc, SpecError):
        body["error"] = "SpecError"
        body["field"] = exc.field
    if isinstance(exc, JobNotFound):
        body["job_id"] = exc.job_id
    return status, body


def error_in(status: int, body: Any, where: str) -> EbbtideError:
    """The exception an error response from the server at ``where`` stands for."""
    if not isinstance(body, dict) or not isinstance(body.get("detail"), str):
        return EbbtideError(f"{where} answered HTTP {status}, not as an ebb server does")
    detail: str = body["detail"]
    name = body.get("error")
    if name == "SpecError":
        field = str(body.get("field") or "request")
        error = SpecError(field, detail.removeprefix(f"{field}: "))
        error.args = (detail,)
        return error
    if name == "JobNotFound" and isinstance(body.get("job_id"), int):
        return JobNotFound(body["job_id"])
    if isinstance(name, str) and name in _BY_NAME:
        return _BY_NAME[name](detail)
    if status == 401:
        return Unauthenticated(detail)
    if status == 403:
        return PermissionDenied(detail)
    if 400 <= status < 500:
        return UserError(detail)
    return EbbtideError(f"{where} failed (HTTP {status}): {detail}")
