"""What waits and why, quota and usage per queue, and changing quotas (cluster admins; audited)."""

from __future__ import annotations

from fastapi import APIRouter

from shipyard.agent.scheduler import queue_status
from shipyard.api.deps import QueuePath, Reader, Writer
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.queues import ClusterQueueSpec, QueueConfig
from shipyard.schemas.requests import QueueUpdate
from shipyard.schemas.views import QueueChangeView, QueueSettingsView, QueueStatusView
from shipyard.services.cluster import queues as queue_settings

router = APIRouter(prefix="/api/v1", tags=["queues"], responses=PROBLEM_RESPONSES)


@router.get("/queues", operation_id="queueStatus", response_model=QueueStatusView)
def queue_state(ctx: Reader) -> QueueStatusView:
    """Status jobs with why each waits, and every queue's quota, usage and borrowing."""
    return queue_status(ctx)


@router.get("/queue-config", operation_id="getQueueConfig", response_model=QueueSettingsView)
def get_queue_config(ctx: Reader) -> QueueSettingsView:
    """The queue configuration in force (cluster queues, quotas, local queues) and its source."""
    return queue_settings.show(ctx)


@router.put("/queue-config", operation_id="applyQueueConfig", response_model=QueueChangeView)
def apply_queue_config(config: QueueConfig, ctx: Writer) -> QueueChangeView:
    """Replace the whole configuration (cluster admins); audited as ``quota.change``."""
    return queue_settings.apply(ctx, config)


@router.put("/queues/{name}", operation_id="setQueue", response_model=QueueChangeView)
def set_queue(name: QueuePath, body: QueueUpdate, ctx: Writer) -> QueueChangeView:
    """Add one cluster queue or replace its quota (cluster admins); audited."""
    queue = ClusterQueueSpec(
        name=name, nominal=body.nominal, cohort=body.cohort, borrowing_limit=body.borrowing_limit
    )
    return queue_settings.set_queue(ctx, queue, body.local_queues)


@router.delete("/queues/{name}", operation_id="removeQueue", response_model=QueueChangeView)
def remove_queue(name: QueuePath, ctx: Writer) -> QueueChangeView:
    """Remove a cluster queue and the local queues naming it (cluster admins); audited."""
    return queue_settings.remove_queue(ctx, name)
