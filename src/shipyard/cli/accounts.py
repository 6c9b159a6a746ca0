"""``shipyard users | tokens | projects``: accounts, API tokens and roles, on the server given by
SHIPYARD_URL (or ``shipyard login``) or on the embedded platform."""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from typing import Annotated

import typer
from pydantic import BaseModel

from shipyard.cli._output import JsonOpt, print_json, rows_or_json
from shipyard.cli._remote import either

users_app = typer.Typer(help="People and service accounts.", no_args_is_help=True)
tokens_app = typer.Typer(
    help="API tokens: shown once, stored hashed, scoped, expiring.", no_args_is_help=True
)
projects_app = typer.Typer(help="Roles in projects: owner, maintainer, member, viewer.", no_args_is_help=True)


def _show(rows: Sequence[BaseModel], columns: list[str], json_out: bool) -> None:
    rows_or_json(rows, json_out, columns, lambda row: [getattr(row, c) for c in columns])


@users_app.command("add")
def add_user(
    name: str,
    admin: Annotated[bool, typer.Option(help="Make a cluster admin.")] = False,
    service: Annotated[bool, typer.Option(help="A service account: tokens only, no password.")] = False,
) -> None:
    """Create a user (asks for the password, or reads SHIPYARD_NEW_PASSWORD)."""
    from shipyard.services.accounts import accounts

    password = None
    if not service:
        password = os.environ.get("SHIPYARD_NEW_PASSWORD") or getpass.getpass(f"password for {name}: ")
    either(
        lambda c: c.create_user(name, password, admin=admin, service=service),
        lambda ctx: accounts.create_user(ctx, name, password, admin=admin, service=service),
    )
    typer.echo(f"created {'service account' if service else 'user'} {name}")


@users_app.command("list")
def list_users(json_out: JsonOpt = False) -> None:
    """Every account (admins only)."""
    from shipyard.services.accounts import accounts

    rows = either(lambda c: c.list_users(), accounts.list_users)
    _show(rows, ["name", "admin", "service", "disabled"], json_out)


@tokens_app.command("create")
def create_token(
    name: str,
    scope: Annotated[list[str] | None, typer.Option(help="read, write or admin; repeat for several.")] = None,
    days: Annotated[float, typer.Option(help="Lifetime in days.", min=0.0)] = 30.0,
    user: Annotated[str | None, typer.Option(help="For another user (admins only).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Issue a token; its secret is printed this once."""
    from shipyard.services.accounts import accounts

    issued = either(
        lambda c: c.issue_token(name, scope, days, user),
        lambda ctx: accounts.issue_token(ctx, user or ctx.actor.name, name, scope, days=days).view(),
    )
    if json_out:
        print_json(issued)
        return
    typer.echo(f"token {issued.id} (expires {issued.expires_at}); copy it now, it is not shown again:")
    typer.echo(issued.token)


@tokens_app.command("list")
def list_tokens(json_out: JsonOpt = False) -> None:
    """Your tokens (all tokens for an admin), without their secrets."""
    from shipyard.services.accounts import accounts

    rows = either(lambda c: c.list_tokens(), accounts.list_tokens)
    _show(rows, ["id", "user", "name", "scopes", "expires_at", "last_used_at", "revoked"], json_out)


@tokens_app.command("revoke")
def revoke_token(token_id: str) -> None:
    """Revoke a token at once."""
    from shipyard.services.accounts import accounts

    either(lambda c: c.revoke_token(token_id), lambda ctx: accounts.revoke_token(ctx, token_id))
    typer.echo(f"revoked token {token_id}")


@projects_app.command("grant")
def grant(project: str, user: str, role: str) -> None:
    """Give USER the ROLE (owner, maintainer, member, viewer) in PROJECT."""
    from shipyard.services.accounts import rbac

    either(lambda c: c.set_role(project, user, role), lambda ctx: rbac.grant(ctx, project, user, role))
    typer.echo(f"{user} is {role} of {project}")


@projects_app.command("revoke")
def revoke_role(project: str, user: str) -> None:
    """Take USER's role in PROJECT away."""
    from shipyard.services.accounts import rbac

    either(lambda c: c.set_role(project, user, None), lambda ctx: rbac.grant(ctx, project, user, None))
    typer.echo(f"{user} has no role in {project} any more")


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
    app.add_typer(tokens_app, name="tokens")
    app.add_typer(projects_app, name="projects")
