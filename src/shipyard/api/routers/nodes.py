"""The executor's nodes and their devices."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shipyard.api.deps import Name, Reader, checked_name
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import DeviceSeriesView, DeviceView, NodeView
from shipyard.services.cluster import telemetry as device_telemetry
from shipyard.services.cluster.cluster import list_nodes as node_status
from shipyard.services.cluster.devices import list_devices

router = APIRouter(prefix="/api/v1", tags=["nodes"], responses=PROBLEM_RESPONSES)


@router.get("/nodes", operation_id="listDevices", response_model=list[DeviceView])
def list_nodes(ctx: Reader) -> list[DeviceView]:
    """The devices of the nodes this server runs jobs on, each with its node and accelerator type."""
    return list_devices(ctx)


@router.get("/nodes/status", operation_id="listNodes", response_model=list[NodeView])
def list_node_status(ctx: Reader) -> list[NodeView]:
    """Every node: devices per accelerator type, those in use, labels, whether it is up, its jobs."""
    return node_status(ctx)


@router.get("/nodes/{node}/telemetry", operation_id="nodeTelemetry", response_model=list[DeviceSeriesView])
def node_telemetry(
    node: Name,
    ctx: Reader,
    hours: Annotated[float, Query(gt=0, le=device_telemetry.MAX_HOURS)] = 1.0,
    max_points: Annotated[int, Query(ge=2, le=device_telemetry.MAX_POINTS)] = 300,
) -> list[DeviceSeriesView]:
    """Each device of the node over the last ``hours``: utilization, memory, power, temperature,
    clock, disk traffic and throttling, averaged into at most ``max_points`` buckets."""
    return device_telemetry.node_telemetry(ctx, checked_name(node), hours=hours, max_points=max_points)
