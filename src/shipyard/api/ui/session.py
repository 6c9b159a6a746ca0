"""Signing in and out of the dashboard, and the caller of every page.

A page's caller comes from the session cookie; without a valid one (none, expired, revoked) the
browser is sent to the login form, which brings it back. A form that changes something must carry
the session's CSRF token: a forged or replayed one (from another session, or an ended one) is
refused before anything is read from it.
"""

from __future__ import annotations

import secrets
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Form, Request
from fastapi.responses import RedirectResponse, Response

from shipyard import audit
from shipyard.api.deps import (
    CSRF_FIELD,
    READ,
    SESSION_COOKIE,
    WRITE,
    authenticated,
    csrf_matches,
    csrf_token,
    refuse_other_origins,
    source_of,
)
from shipyard.errors import Forbidden, Unauthenticated
from shipyard.services.accounts import accounts
from shipyard.services.context import ServiceContext

SESSION_DAYS = 0.5
"""A dashboard session lasts 12 hours; signing in again starts another."""
LOGIN_COOKIE = "shipyard_login"
LOGIN_FORM_S = 3600
"""How long a login form may wait before it is submitted."""


class LoginRequired(Exception):
    """No valid session: the page answers with a redirect to the login form."""

    def __init__(self, back_to: str) -> None:
        super().__init__(back_to)
        self.back_to = back_to


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of this site only (never ``//elsewhere``)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def login_redirect(back_to: str) -> RedirectResponse:
    return RedirectResponse(f"/login?next={quote(safe_next(back_to), safe='/')}", status_code=303)


async def page_caller(request: Request) -> ServiceContext:
    """The platform acting as the session's user (what every page depends on)."""
    return await _session_caller(request, READ)


async def _session_caller(request: Request, needs: str) -> ServiceContext:
    token = request.cookies.get(SESSION_COOKIE)
    back_to = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if not token:
        raise LoginRequired(back_to if request.method == "GET" else "/")
    try:
        ctx = await authenticated(request, token, (needs,))
    except Unauthenticated:
        raise LoginRequired(back_to if request.method == "GET" else "/") from None
    request.state.user = ctx.actor
    request.state.csrf = csrf_token(token)
    return ctx


async def form_caller(
    request: Request, csrf: Annotated[str, Form(alias=CSRF_FIELD, max_length=128)] = ""
) -> ServiceContext:
    """The caller of a form that changes something: the session's, with its CSRF token, sent
    from this site."""
    refuse_other_origins(request)
    token = request.cookies.get(SESSION_COOKIE) or ""
    if not csrf_matches(token, csrf):
        raise Forbidden(
            "this form did not carry this session's CSRF token",
            hint="reload the page and submit the form again",
        )
    return await _session_caller(request, WRITE)


PageCaller = Annotated[ServiceContext, Depends(page_caller)]
FormCaller = Annotated[ServiceContext, Depends(form_caller)]


def login_form_nonce(request: Request) -> str:
    """The login form's pre-session secret: the browser's own (an HttpOnly, SameSite=Strict
    cookie that another site's form never sends), made now if it has none. The form carries its
    CSRF token, so a sign-in posted from elsewhere (login CSRF: planting the attacker's session
    in the victim's browser) is refused."""
    nonce = request.cookies.get(LOGIN_COOKIE) or ""
    if not 32 <= len(nonce) <= 128:
        nonce = secrets.token_urlsafe(32)
    request.state.csrf = csrf_token(nonce)
    return nonce


def keep_login_nonce(request: Request, answer: Response, nonce: str) -> Response:
    if request.cookies.get(LOGIN_COOKIE) != nonce:
        answer.set_cookie(
            LOGIN_COOKIE, nonce, max_age=LOGIN_FORM_S, httponly=True, samesite="strict",
            secure=request.url.scheme == "https", path="/login",
        )  # fmt: skip
    return answer


def check_login_form(request: Request, sent: str) -> None:
    """Refuse a sign-in that did not come from this site's own login form."""
    refuse_other_origins(request)
    if not csrf_matches(request.cookies.get(LOGIN_COOKIE) or "", sent):
        raise Forbidden(
            "this sign-in did not come from this site's login form (or the form is over an hour old)",
            hint="reload the login page and sign in again",
        )


def sign_in(ctx: ServiceContext, request: Request, username: str, password: str, back_to: str) -> Response:
    """Check the password (audited, throttled as the API's login) and start a session."""
    anonymous = ctx.acting_as(audit.Actor(name=username, source=source_of(request)))
    issued = accounts.login(anonymous, username, password, token_days=SESSION_DAYS)
    return _session(request, issued.token, back_to)


def sign_in_by_link(ctx: ServiceContext, request: Request, link: str) -> Response:
    """Exchange a ``shipyard ui`` link for a session (the link works once)."""
    issued = accounts.redeem_link(ctx, link, source_of(request), session_days=SESSION_DAYS)
    return _session(request, issued.token, "/")


def _session(request: Request, token: str, back_to: str) -> Response:
    answer = RedirectResponse(safe_next(back_to), status_code=303)
    answer.delete_cookie(LOGIN_COOKIE, path="/login")
    answer.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=int(SESSION_DAYS * 86400),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return answer


def sign_out(ctx: ServiceContext, request: Request) -> Response:
    """Revoke the session's token (so a copied cookie is worth nothing) and forget the cookie."""
    accounts.revoke_token(ctx, accounts.token_id_of(request.cookies.get(SESSION_COOKIE, "")))
    answer = RedirectResponse("/login", status_code=303)
    answer.delete_cookie(SESSION_COOKIE, path="/")
    return answer
