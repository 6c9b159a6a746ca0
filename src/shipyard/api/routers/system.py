"""Liveness and Prometheus metrics: no token needed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shipyard import __version__
from shipyard.agent import telemetry
from shipyard.api.deps import Served
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import HealthView

router = APIRouter(tags=["system"], responses=PROBLEM_RESPONSES)


@router.get("/healthz", operation_id="health", response_model=HealthView)
async def health() -> HealthView:
    # In the event loop: liveness never waits for a worker thread that a flood of logins or
    # uploads may hold.
    return HealthView(status="ok", version=__version__)


@router.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
def prometheus(served: Served) -> Response:
    served.metrics.observe(telemetry.cluster_metrics(served.ctx))
    return Response(generate_latest(served.metrics.registry), media_type=CONTENT_TYPE_LATEST)
