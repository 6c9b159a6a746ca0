"""What the store admits of a new artifact: valid names, the caller's right to write in the
project, a name not taken (artifacts are immutable), and room in the project's quota."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import StoredArtifact
from shipyard.errors import Conflict
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.storage import catalog
from shipyard.storage import config as storage_config
from shipyard.storage.config import StorageConfig
from shipyard.storage.names import check_name


def check_upload(ctx: ServiceContext, name: str, *, project: str, size_bytes: int | None) -> None:
    """What ``put`` will refuse of an upload, asked before its first byte is read: the names,
    the caller's right to write in the project, a name already taken, and the project's quota
    against the size the client declares. ``put`` asks again of the bytes that came."""
    check_name(name)
    check_name(project, "project name")
    config = storage_config.load(ctx.settings.home)
    with ctx.db.read() as session:
        rbac.require(ctx, session, Permission.ARTIFACT_WRITE, f"artifact/{project}/{name}", project)
        refuse_taken(session, project, name)
        check_quota(session, config, project, size_bytes or 0)


def refuse_taken(session: Session, project: str, name: str) -> None:
    if catalog.find(session, project, name) is not None:
        raise Conflict(
            f"artifact {project}/{name} exists already",
            hint="artifacts are immutable: choose another name, or `shipyard storage rm` it first",
        )


def check_quota(session: Session, config: StorageConfig, project: str, adding: int) -> None:
    quota_gib = config.project(project).quota_gib
    if quota_gib is None:
        return
    held = (
        session.scalar(
            select(func.coalesce(func.sum(StoredArtifact.size_bytes), 0)).where(
                StoredArtifact.project == project
            )
        )
        or 0
    )
    if held + adding > quota_gib * 2**30:
        raise Conflict(
            f"project {project!r} would hold {(held + adding) / 2**30:.2f} GiB of its {quota_gib:g} GiB "
            f"storage quota ({held / 2**30:.2f} GiB held, {adding / 2**30:.2f} GiB to add)",
            hint="delete artifacts it no longer needs (then `shipyard storage gc`), "
            "or raise projects.<name>.quota_gib in storage.yaml",
        )
