"""The tamper-evident audit log: read it (every read is recorded) and verify its chain."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shipyard import audit
from shipyard.api.deps import Reader
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import AuditRecordView, AuditVerdictView
from shipyard.services.accounts import auditing

router = APIRouter(prefix="/api/v1/audit", tags=["audit"], responses=PROBLEM_RESPONSES)


@router.get("", operation_id="listAudit", response_model=list[AuditRecordView])
def list_audit(
    ctx: Reader,
    since: Annotated[str | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> list[AuditRecordView]:
    return auditing.read_log(ctx, audit.parse_since(since) if since else None, limit)


@router.get("/verify", operation_id="verifyAudit", response_model=AuditVerdictView)
def verify_audit(ctx: Reader) -> AuditVerdictView:
    return auditing.verify(ctx).view()
