"""Errors as problem JSON (RFC 9457: ``{type, title, status, detail, code, hint}``): every
``ShipyardError`` with its status, request validation as 422 in words, and anything else as a 500
that names no more than the exception's type (the server log has the rest)."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from shipyard.errors import InvalidSpec, ShipyardError, Throttled
from shipyard.schemas.documents import PATTERN_WORDS

log = logging.getLogger("shipyard.api")
PROBLEM = "application/problem+json"
PROBLEM_STATUSES = (400, 401, 403, 404, 408, 409, 413, 422, 429, 503, 507)


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    hint: str | None = None


def problem(
    status: int, code: str, detail: str, hint: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = Problem(
        type=f"https://shipyard.dev/problems/{code}",
        title=code.replace("_", " "),
        status=status,
        detail=detail,
        code=code,
        hint=hint,
    )
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(body.model_dump(), status_code=status, media_type=PROBLEM, headers=headers)


def _in_words(error: Any) -> str:
    pattern = (error.get("ctx") or {}).get("pattern")
    return f"must be {PATTERN_WORDS[pattern]}" if pattern in PATTERN_WORDS else str(error["msg"])


def in_words(exc: RequestValidationError) -> str:
    """Each field a request got wrong, and what it must be."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {_in_words(e)}" for e in exc.errors()
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShipyardError)
    async def known(_: Request, exc: ShipyardError) -> JSONResponse:
        status = 400 if isinstance(exc, InvalidSpec) and exc.http_status == 422 else exc.http_status
        headers = {"Retry-After": str(math.ceil(exc.retry_after_s))} if isinstance(exc, Throttled) else None
        return problem(status, exc.code, exc.message, exc.hint, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = f"the request is invalid: {in_words(exc)}"
        return problem(422, "invalid_request", detail, "fix the fields named")

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return problem(
            500, "internal_error", f"unexpected {type(exc).__name__}", "the server log has the details"
        )


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    for status in PROBLEM_STATUSES
}
"""The error answers every route documents (each router declares them, so its routes carry them)."""
