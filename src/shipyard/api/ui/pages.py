"""The dashboard's pages and forms. Each page is one handler: read through the service layer as
the session's user, render one template. Forms post, act through the same use cases as the API
(audited there), and redirect back (so a reload never repeats an action)."""

from __future__ import annotations

import asyncio
import logging
import statistics
import sysconfig
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import yaml
from fastapi import Depends, FastAPI, Form, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute

from shipyard.agent import scheduler
from shipyard.agent.telemetry import cluster_metrics
from shipyard.api.deps import Name, Platform, Served, checked_name
from shipyard.api.ui import resource_pages, wording
from shipyard.api.ui.rendering import HERE, render
from shipyard.api.ui.routing import Filter, page_router, paged
from shipyard.api.ui.session import (
    FormCaller,
    PageCaller,
    check_login_form,
    keep_login_nonce,
    login_form_nonce,
    page_caller,
    sign_in,
    sign_in_by_link,
    sign_out,
)
from shipyard.domain import JobState
from shipyard.errors import Forbidden, NotFound, ShipyardError, Unauthenticated
from shipyard.schemas.documents import MAX_DOCUMENT_BYTES
from shipyard.schemas.jobspec import parse_job_spec, validate_job_spec
from shipyard.schemas.views import JobView
from shipyard.services.cluster import cluster
from shipyard.services.cluster import usage as usage_service
from shipyard.services.context import ServiceContext
from shipyard.services.estimates import planning
from shipyard.services.jobs import access as job_access
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs import logs as log_service
from shipyard.services.jobs import submissions
from shipyard.services.models import models

_log = logging.getLogger("shipyard.ui")
HEATMAP_HOURS = 24
router = page_router()


@router.get("/login")
def login_form(request: Request, next: Annotated[str, Query(max_length=2000)] = "/") -> Response:
    return _login_page(request, next)


def _login_page(request: Request, next: str, status_code: int = 200, failed: str | None = None) -> Response:
    nonce = login_form_nonce(request)
    page = render(request, "login.html", status_code=status_code, next=next, failed=failed)
    return keep_login_nonce(request, page, nonce)


@router.post("/login")
def login(
    request: Request,
    served: Served,
    username: Annotated[str, Form(max_length=64)],
    password: Annotated[str, Form(max_length=1024)],
    next: Annotated[str, Form(max_length=2000)] = "/",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    try:
        check_login_form(request, csrf)
        return sign_in(served.ctx, request, username, password, next)
    except ShipyardError as exc:  # a form from elsewhere, a wrong password, or too many of them
        return _login_page(request, next, exc.http_status, exc.message)


@router.get("/login/link")
def login_by_link(request: Request, served: Served, token: Annotated[str, Query(max_length=256)]) -> Response:
    """Where ``shipyard ui`` sends the browser: a one-time link that starts a session."""
    try:
        return sign_in_by_link(served.ctx, request, token)
    except Unauthenticated:
        message = "This sign-in link was used already or has expired: run `shipyard ui` again."
        return _login_page(request, "/", 401, message)


@router.post("/logout")
def logout(ctx: FormCaller, request: Request) -> Response:
    return sign_out(ctx, request)


# -- overview -------------------------------------------------------------------------------------


@router.get("/")
def overview(ctx: PageCaller, request: Request) -> Response:
    metrics = cluster_metrics(ctx)
    nodes = cluster.list_nodes(ctx)
    catalog = planning.hardware_catalog(ctx.settings)
    by_type: dict[str, dict[str, float]] = {}
    for node in nodes:
        for kind, total in node.capacity.items():
            row = by_type.setdefault(kind, {"total": 0, "used": 0, "usd_per_h": 0.0})
            row["total"] += total if node.up else 0
            row["used"] += node.used.get(kind, 0)
    for kind, row in by_type.items():
        spec = catalog.get(kind)
        price = spec.hourly_usd if spec is not None else None
        # CPU capacity is counted in cores; its price is the machine's, not a core's.
        row["usd_per_h"] = (price or 0.0) * row["used"] if kind != "cpu" else 0.0
    return render(
        request,
        "overview.html",
        active="overview",
        metrics=metrics,
        nodes=nodes,
        by_type=by_type,
        cost_per_h=sum(row["usd_per_h"] for row in by_type.values()),
        states=list(JobState),
    )


# -- jobs -----------------------------------------------------------------------------------------


@router.get("/jobs")
def jobs_page(
    ctx: PageCaller,
    request: Request,
    state: Filter = "",
    project: Filter = "",
    queue: Filter = "",
    owner: Filter = "",
    accelerator_type: Filter = "",
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> Response:
    where = job_service.JobFilter(
        state or None, project or None, queue or None, owner or None, accelerator_type or None
    )
    return paged(
        request,
        "jobs.html",
        "jobs",
        page,
        lambda limit, offset: job_service.list_jobs(ctx, limit=limit, offset=offset, where=where),
        filters={
            "state": state,
            "project": project,
            "queue": queue,
            "owner": owner,
            "accelerator_type": accelerator_type,
        },
        states=list(JobState),
    )


@router.get("/jobs/{job_id}")
def job_page(job_id: Name, ctx: PageCaller, request: Request) -> Response:
    detail = job_service.get(ctx, checked_name(job_id))
    with ctx.db.read() as session:
        job = job_access.find_job(session, detail.id)
        cancellable = JobState(detail.state) in (JobState.QUEUED, JobState.RUNNING) and job_access.may_cancel(
            ctx, session, job
        )
    published = models.list_versions(ctx, project=detail.project, job_id=detail.id)
    return render(
        request,
        "job.html",
        active="jobs",
        job=detail,
        published=published,
        cancellable=cancellable,
        live=not JobState(detail.state).is_final,
        spec_yaml=yaml.safe_dump(detail.spec, sort_keys=False),
    )


@router.get("/jobs/{job_id}/live")
def job_live(job_id: Name, ctx: PageCaller, request: Request) -> Response:
    """The parts of a job's page that change while it runs (htmx swaps them in)."""
    detail = job_service.get(ctx, checked_name(job_id))
    return render(request, "job_live.html", job=detail, live=not JobState(detail.state).is_final)


@router.get("/jobs/{job_id}/attempts/{number}/log")
def attempt_log(job_id: Name, number: int, ctx: PageCaller) -> Response:
    """One attempt's whole log, as a file to keep."""
    name = checked_name(job_id)
    chunk = log_service.read_log(ctx, name, attempt=number)
    disposition = f'attachment; filename="{name}-attempt-{number}.log"'
    return Response(
        chunk.data, media_type="text/plain; charset=utf-8", headers={"Content-Disposition": disposition}
    )


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: Name, ctx: FormCaller) -> Response:
    job_service.cancel(ctx, checked_name(job_id))
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/resubmit")
async def resubmit_job(
    job_id: Name, ctx: FormCaller, served: Served, resume: Annotated[str, Form(max_length=3)] = ""
) -> Response:
    """The same spec again; ``resume``: as a new job that starts from this one's newest checkpoint."""
    detail = job_service.get(ctx, checked_name(job_id))
    created = await _submit(ctx, served, detail.spec, resume_from=detail.id if resume == "yes" else None)
    return RedirectResponse(f"/jobs/{created.id}", status_code=303)


MAX_COMPARED = 8


@router.get("/compare")
def compare_page(
    ctx: PageCaller,
    request: Request,
    job: Annotated[list[str], Query(max_length=MAX_COMPARED + 1)] = [],  # noqa: B006 (FastAPI copies it)
) -> Response:
    """Runs side by side: their outcomes, the settings that differ (in words), their curves overlaid."""
    details, missing = [], []
    for job_id in dict.fromkeys(j.strip() for j in job if j.strip()):
        try:
            details.append(job_service.get(ctx, checked_name(job_id)))
        except (NotFound, Forbidden, ShipyardError):
            missing.append(job_id)
    details = details[:MAX_COMPARED]
    return render(
        request,
        "compare.html",
        active="jobs",
        jobs=details,
        missing=missing,
        live=any(not JobState(d.state).is_final for d in details),
        differences=wording.differences([d.spec for d in details]) if len(details) > 1 else [],
    )


@router.get("/submit", dependencies=[Depends(page_caller)])
def submit_form(request: Request) -> Response:
    return render(request, "submit.html", active="jobs", text=_STARTER_SPEC, failed=None)


@router.post("/submit")
async def submit(
    ctx: FormCaller,
    served: Served,
    request: Request,
    spec: Annotated[str, Form(max_length=MAX_DOCUMENT_BYTES)],
) -> Response:
    # Who may submit is asked before the spec is read; reading it happens in a worker thread,
    # bounded in depth, values and time (schemas.documents), never in the event loop.
    await run_in_threadpool(job_service.require_submitter, ctx)
    try:
        parsed = await run_in_threadpool(parse_job_spec, spec, source="the job spec")
        created = await asyncio.wrap_future(
            served.writer.submit(submissions.Submission(ctx, parsed, False, None, None))
        )
    except ShipyardError as exc:
        return render(request, "submit.html", status_code=400, active="jobs", text=spec, failed=exc.message)
    return RedirectResponse(f"/jobs/{created.id}", status_code=303)


async def _submit(
    ctx: ServiceContext, served: Platform, document: dict[str, Any], *, resume_from: str | None = None
) -> JobView:
    spec = validate_job_spec(document)
    return await asyncio.wrap_future(
        served.writer.submit(submissions.Submission(ctx, spec, False, resume_from, None))
    )


_STARTER_SPEC = f"""\
# A tiny model trained on this server's Python standard library (`shipyard spec` explains
# every field; data paths must lie under the server's data roots).
apiVersion: shipyard/v1
name: my-first-job
model: {{preset: llama-tiny}}
data:
  paths: ["{Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py"}"]
  tokenizer: {{vocab_size: 512}}
training: {{steps: 200, global_batch_tokens: 2048, micro_batch_size: 4, seq_len: 64, eval_interval: 50}}
resources: {{accelerator: cpu, devices: 1}}
checkpoint: {{interval: 50, keep: 2}}
"""


# -- queues, nodes --------------------------------------------------------------------------------


@router.get("/queues")
def queues_page(ctx: PageCaller, request: Request) -> Response:
    status = scheduler.queue_status(ctx, replan=False)
    now = datetime.now(UTC)
    waits = [(now - datetime.fromisoformat(p.submitted_at)).total_seconds() for p in status.pending]
    return render(
        request,
        "queues.html",
        active="queues",
        status=status,
        waits=waits,
        median_wait=statistics.median(waits) if waits else None,
    )


@router.get("/nodes")
def nodes_page(ctx: PageCaller, request: Request) -> Response:
    nodes = cluster.list_nodes(ctx)
    return render(
        request,
        "nodes.html",
        active="nodes",
        nodes=nodes,
        heatmap=cluster.allocation_by_hour(ctx, nodes, HEATMAP_HOURS),
    )


@router.get("/usage")
def usage_page(
    ctx: PageCaller,
    request: Request,
    by: Annotated[str, Query(max_length=16)] = "project",
    days: Annotated[int, Query(ge=1, le=usage_service.MAX_DAYS)] = 7,
) -> Response:
    now = datetime.now(UTC)
    view = usage_service.usage(ctx, by=by, since=now - timedelta(days=days), until=now)
    per_day = [sum(row.by_day[i] for row in view.rows) for i in range(len(view.days))]
    return render(
        request,
        "usage.html",
        active="usage",
        usage=view,
        days=days,
        groupings=usage_service.GROUPINGS,
        per_day=per_day,
        peak_day=max(per_day, default=0.0),
    )


# -- models ---------------------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/``, its assets at ``/static``, and the API's documentation from
    the package (no CDN: the offline deployments have none)."""
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.router.routes.extend(routes())

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="Shipyard API",
            swagger_js_url="/static/vendor/swagger-ui-bundle.js",
            swagger_css_url="/static/vendor/swagger-ui.css",
            swagger_favicon_url="/static/favicon.svg",
            # Its default sends the document to validator.swagger.io: nothing leaves the site.
            swagger_ui_parameters={"validatorUrl": None},
        )


def routes() -> list[BaseRoute]:
    """Every dashboard page and form (the fuzz test walks them all)."""
    return [*router.routes, *resource_pages.router.routes]
