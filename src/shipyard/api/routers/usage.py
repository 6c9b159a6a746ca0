"""What each project, queue, user and accelerator type used, and what it cost."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from shipyard.api.deps import Reader
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import UsageView
from shipyard.services.cluster import usage as usage_service

router = APIRouter(prefix="/api/v1", tags=["usage"], responses=PROBLEM_RESPONSES)


@router.get("/usage", operation_id="usage", response_model=UsageView)
def usage(
    ctx: Reader,
    by: Annotated[str, Query(max_length=16)] = "project",
    since: datetime | None = None,
    until: datetime | None = None,
) -> UsageView:
    """Device-hours and cost per project, queue, user or type (``by``) and per UTC day, from the
    attempts' real start and end (running ones up to now); the window defaults to the last seven
    days. Admins see every project, others the projects they hold a role in."""
    return usage_service.usage(ctx, by=by, since=since, until=until)
