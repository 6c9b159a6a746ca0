"""One router per resource; ``ROUTERS`` is the order they appear in the OpenAPI document."""

from shipyard.api.routers import accounts, artifacts, audit, jobs, models, nodes, queues, system

ROUTERS = (
    system.router,
    accounts.router,
    jobs.router,
    queues.router,
    nodes.router,
    models.router,
    artifacts.router,
    audit.router,
)

__all__ = ["ROUTERS"]
