"""``ebb server``'s application: the SDK over HTTP, for fleets whose users must not hold
the database's URL.

Every request is authenticated (:mod:`ebbtide.api.auth`) and served by a
:class:`~ebbtide.client.Client` made for it — the shared store, the policy in force, the
caller — so what a caller may do is decided in one place, the same as with direct store
access.  Errors are JSON ``{"detail": message, ...}`` (see :mod:`ebbtide.api.wire`):
400/422 for what the caller wrote, 401 without valid credentials, 403 where the caller
may not, 404 for a job that does not exist; never a 500 for what a client sends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ebbtide import __version__
from ebbtide.api.auth import PolicyWatch, authenticate
from ebbtide.api.wire import PREFIX, error_out
from ebbtide.client import Client, published_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import EbbtideError, Unauthenticated, first_line
from ebbtide.metrics import Metrics
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store, open_store
from ebbtide.redaction import scrub

log = logging.getLogger("ebbtide.api")


@dataclass
class ServerContext:
    """What every request shares: the settings, the store, the policy file."""

    settings: Settings
    store: Store
    policies: PolicyWatch


def create_app(
    settings: Settings, *, store: Store | None = None, metrics: Metrics | None = None
) -> FastAPI:
    """The API in front of ``store`` (default: the one ``settings`` name; the caller
    closes a store it hands in, :func:`close_app` the one made here); requests are
    counted in ``metrics``."""
    from ebbtide.api import routes

    app = FastAPI(
        title="ebbtide",
        version=__version__,
        summary="Submit, watch and control offline GPU jobs, and the fleet's nodes.",
        description=__doc__,
        docs_url=None,
        redoc_url=None,
    )
    policies = PolicyWatch(settings.policy_path)
    app.state.ebbtide = ServerContext(settings, store or open_store(settings), policies)
    app.state.ebbtide_owns_store = store is None
    app.include_router(routes.router)
    app.add_exception_handler(EbbtideError, _ebbtide_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(sqlalchemy.exc.OperationalError, _store_unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.openapi = _openapi_with_jobspec(app)  # type: ignore[method-assign]
    app.middleware("http")(_counter(metrics if metrics is not None else Metrics()))
    app.add_api_route("/healthz", _healthz, include_in_schema=False)
    app.add_api_route("/readyz", _readyz, include_in_schema=False)
    return app


def _healthz() -> PlainTextResponse:
    """Liveness: the server answers (no token asked)."""
    return PlainTextResponse("ok\n")


def _readyz(request: Request) -> PlainTextResponse:
    """Readiness: the server answers and so does its store (no token asked)."""
    ctx: ServerContext = request.app.state.ebbtide
    try:
        ctx.store.published_policy()  # one row: the cheapest read that goes to the store
    except Exception as exc:
        why = scrub(first_line(exc))
        return PlainTextResponse(f"not ready: the store does not answer ({why})\n", 503)
    return PlainTextResponse("ok\n")


def _counter(
    metrics: Metrics,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """A middleware that counts each request by its route's template (``/v1/jobs/{job_id}``,
    never the id itself: labels stay bounded) and times it."""

    async def count(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        code = 500
        try:
            response = await call_next(request)
            code = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            metrics.api_requests.labels(request.method, template, str(code)).inc()
            metrics.api_duration.labels(template).observe(time.perf_counter() - started)

    return count


def close_app(app: FastAPI) -> None:
    """Close the store :func:`create_app` opened."""
    if app.state.ebbtide_owns_store:
        app.state.ebbtide.store.close()


def request_client(request: Request) -> Iterator[Client]:
    """The :class:`Client` that serves one request, as its caller (a FastAPI dependency)."""
    ctx: ServerContext = request.app.state.ebbtide
    # the running scheduler's policy, as every client sees it; the server's file until
    # a scheduler publishes one
    policy = published_policy(ctx.store) or ctx.policies.current()
    caller = authenticate(request, ctx.store, policy)
    yield Client(ctx.settings, store=ctx.store, policy=policy, caller=caller, workdir=None)


# -- errors -----------------------------------------------------------------------------


def _ebbtide_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EbbtideError)
    status, body = error_out(exc)
    headers = (
        {"WWW-Authenticate": 'Bearer realm="ebbtide"'} if isinstance(exc, Unauthenticated) else None
    )
    return JSONResponse(body, status_code=status, headers=headers)


def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's checks of parameters and bodies, as one :class:`SpecError`-shaped line
    naming the first bad parameter (``limit: ...``)."""
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors()) or [{"loc": ("request",), "msg": "invalid request"}]
    messages = []
    for err in errors[:3]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        messages.append((".".join(loc) or "body", str(err.get("msg", "invalid"))))
    field = messages[0][0]
    detail = "; ".join(f"{where}: {msg}" for where, msg in messages)
    return JSONResponse({"detail": detail, "error": "SpecError", "field": field}, status_code=422)


def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.error("the store failed: %s", str(exc).splitlines()[0])
    body = {"detail": "the job store is unavailable; try again", "error": "EbbtideError"}
    return JSONResponse(body, status_code=503)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """The framework's own answers (no such route, a method a route does not take) in
    the shape of every other error, ``{"detail", "error"}`` (a trial's trap: a route
    that does not exist answered ``{"detail": "Not Found"}`` alone)."""
    assert isinstance(exc, StarletteHTTPException)
    detail = str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such route: {request.method} {request.url.path} (the API: /openapi.json)"
    elif exc.status_code == 405:
        detail = f"{request.url.path} does not take {request.method} (the API: /openapi.json)"
    return JSONResponse(
        {"detail": detail, "error": "UserError"},
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


# -- the schema -------------------------------------------------------------------------


def _openapi_with_jobspec(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The schema, with :class:`JobSpec` as the body of ``POST /v1/jobs`` (which takes it
    as a plain object, to check it the way the SDK does)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            spec = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(spec.pop("$defs", {}))
            components["JobSpec"] = spec
            body = schema["paths"][f"{PREFIX}/jobs"]["post"]["requestBody"]
            body["content"]["application/json"]["schema"] = {
                "$ref": "#/components/schemas/JobSpec",
                "description": "A JobSpec.",
            }
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
