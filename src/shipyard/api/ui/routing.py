"""How a dashboard page is routed: errors become pages (a thing the caller may not read is a
404, as one that does not exist), every answer carries the pages' security headers, and a list
page is cut into pages of ``PAGE_SIZE`` rows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute

from shipyard.api.errors import in_words
from shipyard.api.ui.rendering import render
from shipyard.api.ui.session import (
    LoginRequired,
    login_redirect,
)
from shipyard.errors import Forbidden, NotFound, ShipyardError

_log = logging.getLogger("shipyard.ui")


PAGE_SIZE = 50
Filter = Annotated[str, Query(max_length=64)]


class PageRoute(APIRoute):
    """A dashboard route: errors become pages, not problem JSON. A thing the caller may not
    read is answered 404, as one that does not exist (a page never reveals what exists)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            answer = await answered(request)
            answer.headers.update(PAGE_HEADERS)
            return answer

        async def answered(request: Request) -> Response:
            try:
                return await handle(request)
            except LoginRequired as needed:
                return login_redirect(needed.back_to)
            except Forbidden as exc:
                if request.method == "GET":
                    return error_page(request, 404, "Not found", "There is nothing here you may see.")
                return error_page(request, 403, "Not allowed", exc.message, exc.hint)
            except NotFound:
                return error_page(request, 404, "Not found", "There is nothing here you may see.")
            except RequestValidationError as exc:  # a malformed address is no page; a bad field, a 400
                if any(error["loc"][0] == "path" for error in exc.errors()):
                    return error_page(request, 404, "Not found", "There is nothing here you may see.")
                message = f"The request is invalid: {in_words(exc)}"
                return error_page(request, 400, "That did not work", message)
            except ShipyardError as exc:
                return error_page(request, exc.http_status, "That did not work", exc.message, exc.hint)
            except Exception:
                _log.exception("%s %s failed", request.method, request.url.path)
                return error_page(request, 500, "Something broke", "The server log has the details.")

        return guarded


PAGE_HEADERS = {
    # Scripts and everything else from this site only (no inline script runs, so markup that
    # slipped through escaping could not run either); uPlot and the heatmap set inline styles.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    # A sign-in link's token never leaves in a Referer; and within the site, forms keep their
    # Origin (with no-referrer, browsers send `Origin: null`, which the CSRF check refuses).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def paged(
    request: Request,
    template: str,
    active: str,
    page: int,
    fetch: Callable[[int, int], list[Any]],
    **context: Any,
) -> Response:
    """A list page: ``PAGE_SIZE`` rows of ``fetch(limit, offset)``, newest first (one more row is
    asked for, to know whether an older page exists), as ``rows``."""
    rows = fetch(PAGE_SIZE + 1, (page - 1) * PAGE_SIZE)
    return render(
        request,
        template,
        active=active,
        rows=rows[:PAGE_SIZE],
        more=len(rows) > PAGE_SIZE,
        page=page,
        **context,
    )


def error_page(request: Request, status: int, title: str, message: str, hint: str | None = None) -> Response:
    return render(request, "error.html", status_code=status, title=title, message=message, hint=hint)


# -- signing in and out ---------------------------------------------------------------------------


def page_router() -> APIRouter:
    """A router of dashboard pages: not in the OpenAPI document, HTML by default."""
    return APIRouter(route_class=PageRoute, include_in_schema=False, default_response_class=HTMLResponse)
