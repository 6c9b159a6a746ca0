"""Reading the audit log: cluster admins only, and every read is itself recorded."""

from __future__ import annotations

import json
import time
from datetime import datetime

from sqlalchemy import select

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import AuditRecord
from shipyard.schemas.views import AuditRecordView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext


def read_log(
    ctx: ServiceContext,
    since: datetime | None = None,
    limit: int = 1000,
    *,
    offset: int = 0,
    newest_first: bool = False,
    actor: str | None = None,
    action: str | None = None,
) -> list[AuditRecordView]:
    """Records in order (``newest_first``: the other way), ``offset`` skipped; ``actor`` and
    ``action`` (a prefix: ``job.`` is every job action) narrow them."""
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.AUDIT_READ, "audit")
        order = AuditRecord.seq.desc() if newest_first else AuditRecord.seq
        query = select(AuditRecord).order_by(order).limit(limit).offset(offset)
        if since is not None:
            query = query.where(AuditRecord.at >= since)
        if actor:
            query = query.where(AuditRecord.actor == actor)
        if action:
            query = query.where(AuditRecord.action.startswith(action, autoescape=True))
        records = [
            AuditRecordView(**json.loads(audit.canonical(r)), prev_hash=r.prev_hash, hash=r.hash)
            for r in session.scalars(query)
        ]
        audit.append(
            session, ctx.audit_key, ctx.actor, "audit.read", "audit", detail={"records": len(records)}
        )
        return records


def verify(ctx: ServiceContext) -> audit.Verdict:
    with ctx.db.transaction() as session:
        rbac.require(ctx, session, Permission.AUDIT_READ, "audit")
    verdict = audit.verify_log(ctx.db, ctx.audit_key)
    _verified[ctx.settings.db_url] = (verdict, time.time())
    return verdict


VERDICT_MAX_AGE_S = 60.0
_verified: dict[str, tuple[audit.Verdict, float]] = {}
"""Each database's last whole-chain verification in this process, and when it was made."""


def recent_verdict(ctx: ServiceContext) -> tuple[audit.Verdict, float]:
    """The whole chain's verdict, walked again when the last walk is older than a minute: what a
    page shows beside the records (a walk over a million records takes seconds, and a page is
    opened again and again), with how many seconds ago it was made."""
    known = _verified.get(ctx.settings.db_url)
    if known is None or time.time() - known[1] > VERDICT_MAX_AGE_S:
        verify(ctx)
    else:
        with ctx.db.transaction() as session:
            rbac.require(ctx, session, Permission.AUDIT_READ, "audit")
    verdict, at = _verified[ctx.settings.db_url]
    return verdict, time.time() - at
