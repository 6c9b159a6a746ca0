"""One router per resource; ``ROUTERS`` is the order they appear in the OpenAPI document."""

from shipyard.api.routers import (
    accounts,
    artifacts,
    audit,
    jobs,
    models,
    nodes,
    planner,
    queues,
    series,
    system,
    usage,
)

ROUTERS = (
    system.router,
    accounts.router,
    jobs.router,
    series.router,
    queues.router,
    nodes.router,
    usage.router,
    planner.router,
    models.router,
    artifacts.router,
    audit.router,
)

__all__ = ["ROUTERS"]
