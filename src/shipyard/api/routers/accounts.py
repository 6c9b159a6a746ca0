"""Sign-in, users, tokens and project roles."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from shipyard import audit
from shipyard.api.deps import Name, Reader, Served, Writer, checked_name, links, source_of
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.requests import LoginRequest, NewToken, NewUser, RoleBinding
from shipyard.schemas.views import CallerView, IssuedTokenView, TokenView, UserView
from shipyard.services.accounts import accounts, rbac

router = APIRouter(prefix="/api/v1", tags=["accounts"], responses=PROBLEM_RESPONSES)
TOKEN_LINKS = links(201, {"token_id": "id"}, "revokeToken")


@router.post("/auth/token", operation_id="login", response_model=IssuedTokenView)
def login(body: LoginRequest, request: Request, served: Served) -> IssuedTokenView:
    anonymous = served.ctx.acting_as(audit.Actor(name=body.username, source=source_of(request)))
    return accounts.login(anonymous, body.username, body.password).view()


@router.get("/users/me", operation_id="whoami", response_model=CallerView)
def whoami(ctx: Reader) -> CallerView:
    return CallerView(name=ctx.actor.name, admin=ctx.actor.is_admin, scopes=sorted(ctx.actor.scopes))


@router.get("/users", operation_id="listUsers", response_model=list[UserView])
def list_users(ctx: Reader) -> list[UserView]:
    return accounts.list_users(ctx)


@router.post("/users", operation_id="createUser", status_code=201, response_model=UserView)
def create_user(body: NewUser, ctx: Writer) -> UserView:
    return accounts.create_user(ctx, body.name, body.password, admin=body.admin, service=body.service)


@router.get("/tokens", operation_id="listTokens", response_model=list[TokenView])
def list_tokens(ctx: Reader) -> list[TokenView]:
    return accounts.list_tokens(ctx)


@router.post(
    "/tokens",
    operation_id="issueToken",
    response_model=IssuedTokenView,
    status_code=201,
    responses=TOKEN_LINKS,
)
def issue_token(body: NewToken, ctx: Writer) -> IssuedTokenView:
    scopes = [str(scope) for scope in body.scopes] if body.scopes is not None else None
    issued = accounts.issue_token(ctx, body.user or ctx.actor.name, body.name, scopes, days=body.days)
    return issued.view()


@router.delete("/tokens/{token_id}", operation_id="revokeToken", status_code=204)
def revoke_token(token_id: Name, ctx: Writer) -> Response:
    accounts.revoke_token(ctx, checked_name(token_id))
    return Response(status_code=204)


@router.put("/projects/{project}/members/{user}", operation_id="setRole", status_code=204)
def set_role(project: Name, user: Name, body: RoleBinding, ctx: Writer) -> Response:
    rbac.grant(ctx, checked_name(project), checked_name(user), body.role)
    return Response(status_code=204)


@router.delete("/projects/{project}/members/{user}", operation_id="removeRole", status_code=204)
def remove_role(project: Name, user: Name, ctx: Writer) -> Response:
    rbac.grant(ctx, checked_name(project), checked_name(user), None)
    return Response(status_code=204)
