"""The executor's nodes and their devices."""

from __future__ import annotations

from fastapi import APIRouter

from shipyard.api.deps import Reader
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import DeviceView, NodeView
from shipyard.services.cluster import list_nodes as node_status
from shipyard.services.devices import list_devices

router = APIRouter(prefix="/api/v1", tags=["nodes"], responses=PROBLEM_RESPONSES)


@router.get("/nodes", operation_id="listDevices", response_model=list[DeviceView])
def list_nodes(ctx: Reader) -> list[DeviceView]:
    """The devices of the nodes this server runs jobs on, each with its node and accelerator type."""
    return list_devices(ctx)


@router.get("/nodes/status", operation_id="listNodes", response_model=list[NodeView])
def list_node_status(ctx: Reader) -> list[NodeView]:
    """Every node: devices per accelerator type, those in use, labels, whether it is up, its jobs."""
    return node_status(ctx)
