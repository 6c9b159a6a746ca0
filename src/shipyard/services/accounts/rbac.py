"""Who may do what, checked against the database: the roles of ``shipyard.auth`` per project.

Every use case asks ``require`` before it acts, so the API, the CLI and any UI share one set of
rules. A refusal is audited and raises ``Forbidden`` naming the role and what it lacks.
"""

from __future__ import annotations

from typing import NoReturn

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import ROLES, Permission, allows
from shipyard.db import ProjectRole, User
from shipyard.errors import Forbidden, InvalidSpec, NotFound
from shipyard.services.context import ServiceContext


def role_of(session: Session, user: str, project: str) -> str | None:
    return session.scalar(
        select(ProjectRole.role).where(ProjectRole.user == user, ProjectRole.project == project)
    )


def projects_of(session: Session, actor: audit.Actor) -> dict[str, str]:
    """Projects the actor has a role in, with the role."""
    rows = session.execute(
        select(ProjectRole.project, ProjectRole.role).where(ProjectRole.user == actor.name)
    )
    return dict(rows.all())


def allowed(session: Session, actor: audit.Actor, permission: Permission, project: str | None = None) -> bool:
    if actor.is_admin:
        return True
    role = role_of(session, actor.name, project) if project is not None else None
    return allows(actor, permission, role, project)


def require(
    ctx: ServiceContext, session: Session, permission: Permission, resource: str, project: str | None = None
) -> None:
    """Raise ``Forbidden`` (and audit the refusal) unless the caller holds the permission.

    Called before a use case writes anything: the refusal is recorded in a transaction of its
    own, which commits although the use case's transaction is rolled back.
    """
    actor = ctx.actor
    if allowed(session, actor, permission, project):
        return
    role = role_of(session, actor.name, project) if project else None
    _record_denial(ctx, permission, resource, project)
    where = f" in project {project!r}" if project else ""
    held = f"its role {role!r}{where} does not allow it" if role else f"it has no role{where}"
    raise Forbidden(
        f"{actor.name} may not {permission} {resource}: {held}",
        hint="ask an owner of the project (or a cluster admin) for a role that does",
    )


def require_somewhere(ctx: ServiceContext, session: Session, permission: Permission, resource: str) -> None:
    """Refuse (audited) a caller who holds ``permission`` in no project, before any work is spent
    on its request: a user with no role gets nothing parsed, stored or computed."""
    roles = projects_of(session, ctx.actor).items()
    if ctx.actor.is_admin or any(allows(ctx.actor, permission, role, project) for project, role in roles):
        return
    _record_denial(ctx, permission, resource, None)
    raise Forbidden(
        f"{ctx.actor.name} may not {permission} in any project",
        hint="ask an owner of a project (or a cluster admin) for a role that does",
    )


def require_visible(
    ctx: ServiceContext,
    session: Session,
    permission: Permission,
    resource: str,
    project: str,
    *,
    seen_with: Permission,
    missing: NotFound,
) -> None:
    """``require``, for a thing the caller may not even know exists unless it holds ``seen_with``
    in its project: then the refusal (audited all the same) is ``missing``, the very answer
    for a thing that does not exist, so that no status, message or hint tells the two apart."""
    if not allowed(session, ctx.actor, seen_with, project):
        deny_as_missing(ctx, permission, resource, project, missing)
    require(ctx, session, permission, resource, project)


def deny_as_missing(
    ctx: ServiceContext, permission: Permission, resource: str, project: str | None, missing: NotFound
) -> NoReturn:
    """Audit the refusal, and answer as for a thing that does not exist."""
    _record_denial(ctx, permission, resource, project)
    raise missing


def visible_projects(session: Session, actor: audit.Actor) -> set[str] | None:
    """The projects whose jobs and models the actor may see (every role reads them); None: all."""
    return None if actor.is_admin else set(projects_of(session, actor))


def _record_denial(ctx: ServiceContext, permission: Permission, resource: str, project: str | None) -> None:
    with ctx.db.transaction() as own:
        audit.append(
            own, ctx.audit_key, ctx.actor, permission, resource, outcome="denied", detail={"project": project}
        )


def grant(ctx: ServiceContext, project: str, user: str, role: str | None) -> None:
    """Give ``user`` a role in ``project`` (None takes it away); owners and admins only."""
    if role is not None and role not in ROLES:
        raise InvalidSpec(f"unknown role {role!r}", hint=f"use one of: {', '.join(ROLES)}")
    with ctx.db.transaction() as session:
        require(ctx, session, Permission.PROJECT_ROLES, f"project/{project}", project)
        if session.get(User, user) is None:
            raise NotFound(f"no user named {user!r}", hint="`shipyard users list` shows them")
        current = session.get(ProjectRole, (project, user))
        if role is None:
            if current is not None:
                session.delete(current)
        elif current is None:
            session.add(ProjectRole(project=project, user=user, role=role))
        else:
            current.role = role
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "project.role",
            f"project/{project}",
            detail={"user": user, "role": role},
        )
