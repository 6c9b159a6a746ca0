"""Who may do what: roles per project, plus cluster admins. Default deny.

Every use case asks ``require`` before it acts, so the API, the CLI and any UI share one set of
rules. A refusal is audited and raises ``Forbidden`` naming the role and what it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.db import ProjectRole, User
from shipyard.errors import Forbidden, InvalidSpec, NotFound
from shipyard.services import audit
from shipyard.services.context import ServiceContext

ROLES = ("viewer", "member", "maintainer", "owner")

_VIEWER = frozenset({"job.read", "job.logs", "model.read", "dataset.read"})
_MEMBER = _VIEWER | {"job.submit", "job.cancel.own", "model.download", "artifact.read", "artifact.write"}
_MAINTAINER = _MEMBER | {"job.cancel.any", "model.publish", "model.promote", "artifact.delete"}
_OWNER = _MAINTAINER | {"model.delete", "project.roles"}

PERMISSIONS: Mapping[str, frozenset[str]] = {
    "viewer": _VIEWER,
    "member": _MEMBER,
    "maintainer": _MAINTAINER,
    "owner": _OWNER,
}
"""Role -> permissions in its project. Cluster admins hold every permission everywhere, and the
cluster-wide ones (users, queues and quotas, the audit log) only they hold."""

ADMIN_ONLY = frozenset(
    {
        "user.manage",
        "queue.manage",
        "audit.read",
        "storage.scrub",
        "storage.gc",
        "storage.roots",
        "storage.rotate_key",
    }
)


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


def allowed(session: Session, actor: audit.Actor, permission: str, project: str | None = None) -> bool:
    if actor.is_admin:
        return True
    if permission in ADMIN_ONLY or project is None:
        return False
    role = role_of(session, actor.name, project)
    return role is not None and permission in PERMISSIONS[role]


def require(
    ctx: ServiceContext, session: Session, permission: str, resource: str, project: str | None = None
) -> None:
    """Raise ``Forbidden`` (and audit the refusal) unless the caller holds the permission.

    Called before a use case writes anything: the refusal is recorded in a transaction of its
    own, which commits although the use case's transaction is rolled back.
    """
    actor = ctx.actor
    if allowed(session, actor, permission, project):
        return
    role = role_of(session, actor.name, project) if project else None
    with ctx.db.transaction() as own:
        audit.append(
            own, ctx.audit_key, actor, permission, resource, outcome="denied", detail={"project": project}
        )
    where = f" in project {project!r}" if project else ""
    held = f"its role {role!r}{where} does not allow it" if role else f"it has no role{where}"
    raise Forbidden(
        f"{actor.name} may not {permission} {resource}: {held}",
        hint="ask an owner of the project (or a cluster admin) for a role that does",
    )


def grant(ctx: ServiceContext, project: str, user: str, role: str | None) -> None:
    """Give ``user`` a role in ``project`` (None takes it away); owners and admins only."""
    if role is not None and role not in ROLES:
        raise InvalidSpec(f"unknown role {role!r}", hint=f"use one of: {', '.join(ROLES)}")
    with ctx.db.transaction() as session:
        require(ctx, session, "project.roles", f"project/{project}", project)
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
