"""FastAPI app factory. Routes are thin (``routers/``, one per resource): authenticate, call one
use case, return its view.

Every permission check lives in the service layer (so the CLI and the API share them); the API
only turns a bearer token into the caller (``deps``). Errors become problem JSON in ``errors``,
bodies are bounded in ``limits``, requests are counted in ``metrics``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from shipyard import __version__
from shipyard.api import ui
from shipyard.api.deps import Platform
from shipyard.api.errors import install_error_handlers
from shipyard.api.limits import LimitBodies
from shipyard.api.metrics import MeasureRequests, Metrics
from shipyard.api.routers import ROUTERS
from shipyard.daemon.supervisor import Supervisor
from shipyard.services.accounts import accounts
from shipyard.services.caches.verified_tokens import VerifiedTokens
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.jobs import jobs
from shipyard.services.jobs.submissions import SubmissionWriter
from shipyard.services.storage.scrubber import scrub_in_background
from shipyard.settings import Settings

_log = logging.getLogger("shipyard.server")

NO_AGENT_ENV = "SHIPYARD_NO_AGENT"
"""Set to 1 (``shipyard server --no-agent``): the server queues jobs but starts no agent."""


AGENT_WATCH_S = 2.0
"""How often the server checks that its home's agent is there (a query of one row)."""
GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young collections (CPython's default, 700, collects after every page)."""


async def _keep_agent_alive(ctx: ServiceContext) -> None:
    """Start this home's agent again when it died while jobs were live (kill -9, a crash)."""
    while True:
        await asyncio.sleep(AGENT_WATCH_S)
        try:
            await run_in_threadpool(jobs.revive_agent, ctx)
        except Exception:  # a database that is down now may be back at the next look
            _log.exception("could not check on the agent")


def create_app(
    settings: Settings | None = None, *, init_admin: str | None = None, run_agent: bool | None = None
) -> FastAPI:
    """The API over the platform at ``settings`` (default: the environment). ``run_agent``: start
    this home's agent when jobs are submitted, so they train on this host (default: unless
    ``SHIPYARD_NO_AGENT=1``)."""
    if run_agent is None:
        run_agent = os.environ.get(NO_AGENT_ENV) != "1"
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starter = Supervisor() if run_agent else None
        # A cluster's nodes come from its agent's record: the server never joins the engine, so
        # it answers while a Ray head is away (a process that joins dies with the head).
        ctx = open_context(
            settings, verified_tokens=VerifiedTokens(), start_agent=starter, inventory_from_agent=True
        )
        if init_admin:
            accounts.ensure_initial_admin(ctx, init_admin)
        ctx.inventory.nodes()  # discover devices now (may import torch), not in the first request
        writer = SubmissionWriter(ctx.db)
        app.state.platform = Platform(ctx=ctx, writer=writer, metrics=metrics)
        # What startup made (modules, the catalog, the app) lives as long as the process: out of
        # the collector's sight, a full collection no longer walks it (130 ms pauses, measured,
        # on a server over 10,000 jobs), and young collections run less often.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        watchdog = asyncio.create_task(_keep_agent_alive(ctx)) if starter else None
        stopping = threading.Event()
        scrubber = threading.Thread(target=scrub_in_background, args=(ctx, stopping), name="scrubber")
        scrubber.start()
        yield
        if watchdog is not None:
            watchdog.cancel()
        stopping.set()
        scrubber.join()
        writer.close()
        ctx.close()

    # /docs is the dashboard's, with its assets from the package (no CDN).
    app = FastAPI(title="Shipyard", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.add_middleware(LimitBodies)
    app.add_middleware(MeasureRequests, metrics=metrics)
    for router in ROUTERS:
        # The routes themselves, not the router: an included router is one more level that every
        # request is matched through (0.15 ms of a served submission).
        app.router.routes.extend(router.routes)
    ui.install(app)
    return app
