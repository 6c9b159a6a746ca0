"""Queues and quotas: the configuration in force, and changing it (cluster admins, audited).

A configuration applied here is stored in the database as a new version, so every server and
agent of the cluster sees the same quotas and each change is recorded as ``quota.change`` with
what it changed. A home that never applied one reads ``$SHIPYARD_HOME/queues.yaml`` when it
exists (convenient on one machine, but not audited); with neither, one queue without limits
takes every job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import QueueConfigVersion
from shipyard.db.base import utcnow
from shipyard.errors import Conflict, NotFound
from shipyard.scheduling.quota import Queues, queues_of
from shipyard.schemas.queues import ClusterQueueSpec, QueueConfig, parse_queue_config, validate_queue_config
from shipyard.schemas.views import QueueChangeView, QueueSettingsView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext

QUEUES_FILE = "queues.yaml"
NO_CONFIG = "none: one queue without limits takes every job"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    config: QueueConfig | None
    version: int | None
    """The applied version in force (None when read from the file, or when there is none)."""
    source: str
    """``database``, the path of the file, or ``NO_CONFIG``."""

    def view(self) -> QueueSettingsView:
        config = self.config.document() if self.config else None
        return QueueSettingsView(version=self.version, source=self.source, config=config)


def current(session: Session, home: Path) -> QueueSettings:
    row = session.scalars(
        select(QueueConfigVersion).order_by(QueueConfigVersion.version.desc()).limit(1)
    ).first()
    if row is not None:
        source = f"queue configuration version {row.version}"
        return QueueSettings(validate_queue_config(row.document, source=source), row.version, "database")
    path = home / QUEUES_FILE
    if path.is_file():
        return QueueSettings(parse_queue_config(path.read_text(), source=str(path)), None, str(path))
    return QueueSettings(None, None, NO_CONFIG)


def load_queues(session: Session, home: Path, capacity: Mapping[str, int]) -> Queues:
    """The scheduler's view of the configuration in force."""
    config = current(session, home).config
    return Queues.unlimited(capacity) if config is None else queues_of(config)


def show(ctx: ServiceContext) -> QueueSettingsView:
    """The configuration in force and where it comes from (any signed-in user may read quotas)."""
    with ctx.db.transaction() as session:
        return current(session, ctx.settings.home).view()


def apply(ctx: ServiceContext, config: QueueConfig) -> QueueChangeView:
    """Put ``config`` in force, replacing the whole configuration."""
    return _change(ctx, lambda _: config)


def set_queue(ctx: ServiceContext, queue: ClusterQueueSpec, local_queues: list[str]) -> QueueChangeView:
    """Add the cluster queue, or replace the one of its name; ``local_queues`` point at it."""

    def change(before: QueueConfig | None) -> QueueConfig:
        after = (before or QueueConfig(cluster_queues=[])).with_queue(queue)
        pointed = {**after.local_queues, **dict.fromkeys(local_queues, queue.name)}
        return after.model_copy(update={"local_queues": pointed})

    return _change(ctx, change)


def remove_queue(ctx: ServiceContext, name: str) -> QueueChangeView:
    """Take the cluster queue out, with the local queues that point at it; their jobs then wait
    with a reason until a queue takes them."""

    def change(before: QueueConfig | None) -> QueueConfig:
        if before is None or all(q.name != name for q in before.cluster_queues):
            names = ", ".join(q.name for q in before.cluster_queues) if before else "none"
            raise NotFound(f"no cluster queue named {name!r}", hint=f"cluster queues: {names}")
        return before.without_queue(name)

    return _change(ctx, change)


def _change(ctx: ServiceContext, change: Callable[[QueueConfig | None], QueueConfig]) -> QueueChangeView:
    """Read, change and store the configuration in one transaction, and audit what changed. Two
    admins changing it at once cannot both win: the second gets a conflict and retries."""
    try:
        with ctx.db.transaction() as session:
            rbac.require(ctx, session, Permission.QUEUE_MANAGE, "queues")
            before = current(session, ctx.settings.home)
            after = validate_queue_config(change(before.config).document())
            version = (session.scalar(select(func.max(QueueConfigVersion.version))) or 0) + 1
            session.add(
                QueueConfigVersion(
                    version=version, document=after.document(), applied_by=ctx.actor.name, applied_at=utcnow()
                )
            )
            changed = changes(before.config, after)
            detail = {"version": version, "replaces": before.source, **changed}
            audit.append(session, ctx.audit_key, ctx.actor, "quota.change", "queues", detail=detail)
    except IntegrityError:
        raise Conflict(
            "the queue configuration was changed by someone else at the same time",
            hint="look at `shipyard queues config` and run the command again",
        ) from None
    settings = QueueSettings(after, version, "database").view()
    return QueueChangeView(**settings.model_dump(), replaced=before.source, changes=changed)


def changes(before: QueueConfig | None, after: QueueConfig) -> dict[str, Any]:
    """What a new configuration changes, for the audit record and the command's answer."""
    old = _by_name(before.cluster_queues if before else [])
    new = _by_name(after.cluster_queues)
    diff: dict[str, Any] = {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "changed": {name: {"before": old[name], "after": new[name]}
                    for name in sorted(old.keys() & new.keys()) if old[name] != new[name]},
    }  # fmt: skip
    old_local = dict(before.local_queues) if before else {}
    if old_local != dict(after.local_queues):
        diff["local_queues"] = {"before": old_local, "after": dict(after.local_queues)}
    return diff


def _by_name(queues: list[ClusterQueueSpec]) -> dict[str, dict[str, Any]]:
    return {q.name: q.model_dump(by_alias=True, exclude_none=True) for q in queues}
