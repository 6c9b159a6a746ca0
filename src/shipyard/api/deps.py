"""What routes depend on: the platform the app serves, the authenticated caller, and the types of
path and query parameters (ids that cannot walk out of a folder, bounded numbers)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Query, Request, Security
from fastapi import Path as PathParam
from fastapi.security import SecurityScopes
from starlette.concurrency import run_in_threadpool

from shipyard.api.limits import PerUser
from shipyard.api.metrics import Metrics
from shipyard.errors import Forbidden, InvalidSpec, Unauthenticated
from shipyard.schemas.documents import PATTERN_WORDS, shown
from shipyard.schemas.queues import QUEUE_NAME_PATTERN
from shipyard.services.accounts import accounts
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.planning import Advice
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs.submissions import SubmissionWriter

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""Ids and names in paths: no slashes, no dots first, so nothing can walk out of a folder."""
PATTERN_WORDS[ID_PATTERN] = (
    "a valid name: 1-128 letters, digits, '.', '_', ':' and '-', starting with a letter or digit"
)
MAX_VERSION = 2**31 - 1
"""Version numbers are 32-bit integers in the database; a larger one is a 422, not an overflow."""
Version = Annotated[int, PathParam(ge=1, le=MAX_VERSION)]
VersionQuery = Annotated[int, Query(ge=1, le=MAX_VERSION)]
LogOffset = Annotated[int, Query(ge=0, le=job_service.MAX_OFFSET)]
Name = Annotated[str, PathParam(pattern=ID_PATTERN)]
"""A path segment that names a job, token, user, project or model."""
QueuePath = Annotated[str, PathParam(pattern=QUEUE_NAME_PATTERN)]
ProjectQuery = Annotated[str | None, Query(max_length=64)]


UPLOADS_PER_USER = 2
STREAMS_PER_USER = 8
"""Uploads and log streams one user may have open at once on a server process."""


@dataclass(frozen=True, slots=True)
class Platform:
    """What the app serves, made when it starts (``app.state.platform``)."""

    ctx: ServiceContext
    """As nobody in particular: each request acts through ``ctx.acting_as(caller)``."""
    writer: SubmissionWriter
    metrics: Metrics
    uploads: PerUser = field(default_factory=lambda: PerUser(UPLOADS_PER_USER, "uploads"))
    streams: PerUser = field(default_factory=lambda: PerUser(STREAMS_PER_USER, "log streams"))


async def platform(request: Request) -> Platform:
    # async: FastAPI runs a plain function dependency in a worker thread, a hop per request.
    return _platform_of(request)


def _platform_of(request: Request) -> Platform:
    served: Platform = request.app.state.platform
    return served


def source_of(request: Request) -> str:
    """The client's address, as the audit log and the login throttle name it."""
    return request.client.host if request.client else "unknown"


SESSION_COOKIE = "shipyard_session"
"""The web dashboard's session: a login token in an HttpOnly, SameSite=Strict cookie."""
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
SAFE_METHODS = ("GET", "HEAD")


def csrf_token(session_token: str) -> str:
    """The session's CSRF token (synchroniser pattern, derived so nothing more is stored): a
    page's script cannot read the HttpOnly cookie it comes from, another site cannot compute it,
    and it dies with the session (a token from another or an ended session is refused)."""
    return hmac.new(session_token.encode(), b"shipyard csrf", hashlib.sha256).hexdigest()


def csrf_matches(session_token: str, sent: str | None) -> bool:
    return bool(session_token) and sent is not None and hmac.compare_digest(csrf_token(session_token), sent)


def same_origin(request: Request) -> bool:
    """Whether a browser's request comes from this site's own pages: its ``Origin`` (which
    browsers send on every cross-site POST) names this host, or it has none (no browser sent it,
    so no ambient cookie rode along uninvited). ``Origin: null`` (sandboxed frames, file pages)
    is another site."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc.lower() == host.lower() != ""


def refuse_other_origins(request: Request) -> None:
    if not same_origin(request):
        raise Forbidden(
            f"this request came from another site ({shown(request.headers.get('origin'))}); this site "
            "takes forms from its own pages only",
            hint="use the dashboard's own pages, or a bearer token from a script",
        )


async def authenticated(request: Request, token: str, needs: Iterable[str] = ()) -> ServiceContext:
    """The platform acting as the holder of ``token`` (a bearer token or a session's), which
    must hold every scope in ``needs``."""
    # In the event loop, not a worker thread: a token read a moment ago is checked without
    # the database; only a token to read goes to a thread (one hop fewer on each request).
    ctx = _platform_of(request).ctx
    source = source_of(request)
    actor = accounts.authenticate_cached(ctx, token, source)
    if actor is None:
        actor = await run_in_threadpool(accounts.authenticate, ctx, token, source)
    missing = sorted(set(needs) - actor.scopes)
    if missing:
        raise Forbidden(
            f"this token's scopes ({', '.join(sorted(actor.scopes))}) do not include "
            f"{' and '.join(missing)}, which {request.method} {request.url.path} needs",
            hint=f"use a token issued with the {' and '.join(missing)} scope",
        )
    request.state.credential = token  # long-lived answers check it again while they last
    return ctx.acting_as(actor)


async def caller(request: Request, security_scopes: SecurityScopes) -> ServiceContext:
    """The platform acting as the bearer of the request's token, or as the dashboard's session
    (whose requests that change anything must carry the session's CSRF token). The route
    declares the scopes the token must hold (``Reader``, ``Writer``)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return await authenticated(request, token.strip(), security_scopes.scopes)
    session = request.cookies.get(SESSION_COOKIE)
    if session is None:
        raise Unauthenticated("this request needs a bearer token", hint="POST /api/v1/auth/token first")
    if request.method not in SAFE_METHODS:
        refuse_other_origins(request)
    if request.method not in SAFE_METHODS and not csrf_matches(session, request.headers.get(CSRF_HEADER)):
        raise Forbidden(
            f"this request has no valid {CSRF_HEADER} header for its session",
            hint="send the token the dashboard's pages carry, or use a bearer token",
        )
    return await authenticated(request, session, security_scopes.scopes)


async def still_authenticated(request: Request) -> None:
    """Check again the credential a request came with (a long answer does, as it goes on):
    ``Unauthenticated`` once it is revoked or expired, or its user disabled."""
    await authenticated(request, request.state.credential)


READ, WRITE = "read", "write"
Reader = Annotated[ServiceContext, Security(caller, scopes=[READ])]
"""The caller of a route that only reads: its token must hold ``read``."""
Writer = Annotated[ServiceContext, Security(caller, scopes=[WRITE])]
"""The caller of a route that changes something: its token must hold ``write``. Cluster-wide
changes need ``admin`` too, which a token's holder is only with it (``Actor.is_admin``)."""
Served = Annotated[Platform, Depends(platform)]


def checked_name(value: str) -> str:
    """A path segment that names something: refuse traversal and separators with a 400."""
    if not re.match(ID_PATTERN, value) or ".." in value:
        raise InvalidSpec(
            f"{value!r} is not a valid name",
            hint="names are letters, digits, '.', '_', ':' and '-', without '/', '..' or a leading dot",
        )
    return value


def optional_name(value: str | None) -> str | None:
    return checked_name(value) if value else None


def links(status: int, parameters: dict[str, str], *operation_ids: str) -> dict[int | str, dict[str, Any]]:
    """``responses`` of a route whose answer names a resource the other operations take (OpenAPI
    links, which stateful clients and fuzzers follow): ``parameters`` maps each path parameter to
    the field of the answer that fills it."""
    fields = {param: f"$response.body#/{field}" for param, field in parameters.items()}
    return {status: {"links": {op: {"operationId": op, "parameters": fields} for op in operation_ids}}}


def advice_asked(
    params_b: Annotated[float, Query(gt=0, le=10_000, description="Model parameters, billions.")] = 8.0,
    tokens_b: Annotated[float, Query(gt=0, le=1_000_000, description="Training tokens, billions.")] = 100.0,
    workload: Annotated[str, Query(pattern="^(pretrain|finetune|lora|qlora)$")] = "pretrain",
    rank_by: Annotated[str, Query(pattern="^(time|cost|energy)$")] = "cost",
    devices: Annotated[
        int, Query(ge=0, le=100_000, description="Devices of each type; 0: the fewest that hold the model.")
    ] = 8,
) -> Advice:
    """A question to the hardware advisor, as the planner page and the API take it."""
    return Advice(params_b=params_b, tokens_b=tokens_b, workload=workload, rank_by=rank_by, devices=devices)


Asked = Annotated[Advice, Depends(advice_asked)]
