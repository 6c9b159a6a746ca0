"""The dashboard's pages and forms. Each page is one handler: read through the service layer as
the session's user, render one template. Forms post, act through the same use cases as the API
(audited there), and redirect back (so a reload never repeats an action)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import statistics
import sysconfig
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from shipyard.agent import scheduler
from shipyard.agent.telemetry import cluster_metrics
from shipyard.api.deps import MAX_VERSION, Name, Platform, Served, Version, checked_name
from shipyard.api.errors import in_words
from shipyard.api.ui import wording
from shipyard.api.ui.rendering import HERE, render
from shipyard.api.ui.session import (
    FormCaller,
    LoginRequired,
    PageCaller,
    check_login_form,
    keep_login_nonce,
    login_form_nonce,
    login_redirect,
    page_caller,
    sign_in,
    sign_in_by_link,
    sign_out,
)
from shipyard.domain import JobState
from shipyard.domain.text import DNS_LABEL
from shipyard.errors import Forbidden, NotFound, ShipyardError, Unauthenticated
from shipyard.planner.shapes import model_shape
from shipyard.planner.workload import TrainingWorkload
from shipyard.registry import STAGES
from shipyard.schemas.documents import MAX_DOCUMENT_BYTES
from shipyard.schemas.jobspec import parse_job_spec, validate_job_spec
from shipyard.schemas.views import JobView
from shipyard.services.accounts import auditing
from shipyard.services.cluster import cluster
from shipyard.services.cluster import usage as usage_service
from shipyard.services.context import ServiceContext
from shipyard.services.estimates import planning
from shipyard.services.jobs import access as job_access
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs import submissions
from shipyard.services.models import models
from shipyard.services.storage import storage as storage_service
from shipyard.services.storage import upkeep
from shipyard.settings import Settings

_log = logging.getLogger("shipyard.ui")
PAGE_SIZE = 50
HEATMAP_HOURS = 24
Filter = Annotated[str, Query(max_length=64)]


class PageRoute(APIRoute):
    """A dashboard route: errors become pages, not problem JSON. A thing the caller may not
    read is answered 404, as one that does not exist (a page never reveals what exists)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            answer = await answered(request)
            answer.headers.update(PAGE_HEADERS)
            return answer

        async def answered(request: Request) -> Response:
            try:
                return await handle(request)
            except LoginRequired as needed:
                return login_redirect(needed.back_to)
            except Forbidden as exc:
                if request.method == "GET":
                    return _error_page(request, 404, "Not found", "There is nothing here you may see.")
                return _error_page(request, 403, "Not allowed", exc.message, exc.hint)
            except NotFound:
                return _error_page(request, 404, "Not found", "There is nothing here you may see.")
            except RequestValidationError as exc:  # a malformed address is no page; a bad field, a 400
                if any(error["loc"][0] == "path" for error in exc.errors()):
                    return _error_page(request, 404, "Not found", "There is nothing here you may see.")
                message = f"The request is invalid: {in_words(exc)}"
                return _error_page(request, 400, "That did not work", message)
            except ShipyardError as exc:
                return _error_page(request, exc.http_status, "That did not work", exc.message, exc.hint)
            except Exception:
                _log.exception("%s %s failed", request.method, request.url.path)
                return _error_page(request, 500, "Something broke", "The server log has the details.")

        return guarded


PAGE_HEADERS = {
    # Scripts and everything else from this site only (no inline script runs, so markup that
    # slipped through escaping could not run either); uPlot and the heatmap set inline styles.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    # A sign-in link's token never leaves in a Referer; and within the site, forms keep their
    # Origin (with no-referrer, browsers send `Origin: null`, which the CSRF check refuses).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


router = APIRouter(route_class=PageRoute, include_in_schema=False, default_response_class=HTMLResponse)


def _paged(
    request: Request,
    template: str,
    active: str,
    page: int,
    fetch: Callable[[int, int], list[Any]],
    **context: Any,
) -> Response:
    """A list page: ``PAGE_SIZE`` rows of ``fetch(limit, offset)``, newest first (one more row is
    asked for, to know whether an older page exists), as ``rows``."""
    rows = fetch(PAGE_SIZE + 1, (page - 1) * PAGE_SIZE)
    return render(
        request,
        template,
        active=active,
        rows=rows[:PAGE_SIZE],
        more=len(rows) > PAGE_SIZE,
        page=page,
        **context,
    )


def _error_page(request: Request, status: int, title: str, message: str, hint: str | None = None) -> Response:
    return render(request, "error.html", status_code=status, title=title, message=message, hint=hint)


# -- signing in and out ---------------------------------------------------------------------------


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
    return _paged(
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
    chunk = job_service.read_log(ctx, name, attempt=number)
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


@router.get("/models")
def models_page(ctx: PageCaller, request: Request) -> Response:
    versions = models.list_versions(ctx)
    names: dict[tuple[str, str], list[Any]] = {}
    for version in versions:
        names.setdefault((version.project, version.name), []).append(version)
    return render(request, "models.html", active="models", names=names)


ProjectFilter = Annotated[str | None, Query(pattern=DNS_LABEL)]


@router.get("/models/{name}")
def model_page(
    name: Name,
    ctx: PageCaller,
    request: Request,
    project: ProjectFilter = None,
    a: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None,
    b: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None,
) -> Response:
    project = models.project_of(ctx, checked_name(name), project)
    versions = models.list_versions(ctx, name, project)
    if not versions:
        raise NotFound(f"no model {project}/{name}")
    lineages = {v.version: models.lineage(ctx, f"{name}:{v.version}", project=project) for v in versions}
    compared = models.compare(ctx, f"{name}:{a}", f"{name}:{b}", project=project) if a and b else None
    return render(
        request,
        "model.html",
        active="models",
        name=name,
        project=project,
        versions=versions,
        lineages=lineages,
        compared=compared,
        compared_rows=wording.differences([v.model_dump(mode="json") for v in (compared.a, compared.b)])
        if compared
        else [],
        pair=(a, b),
        stages=STAGES,
        files={v.version: models.files(Path(v.path)) if Path(v.path).is_dir() else [] for v in versions},
    )


@router.post("/models/{name}/versions/{version}/stage")
def promote_model(
    name: Name,
    version: Version,
    ctx: FormCaller,
    stage: Annotated[str, Form(max_length=32)],
    project: Annotated[str, Form(pattern=DNS_LABEL)],
) -> Response:
    models.promote(ctx, f"{checked_name(name)}:{version}", stage, project=project)
    return RedirectResponse(f"/models/{name}?project={project}", status_code=303)


# -- storage, audit -------------------------------------------------------------------------------


@router.get("/storage")
def storage_page(
    ctx: PageCaller,
    request: Request,
    project: Filter = "",
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> Response:
    try:
        status = upkeep.status(ctx, fresh=False)
    except Forbidden:  # the store's upkeep is the cluster admins'
        status = None
    return _paged(
        request,
        "storage.html",
        "storage",
        page,
        lambda limit, offset: storage_service.list_artifacts(
            ctx, project or None, limit=limit, offset=offset
        ),
        status=status,
        project=project,
    )


@router.get("/audit")
def audit_page(
    ctx: PageCaller,
    request: Request,
    actor: Filter = "",
    action: Filter = "",
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> Response:
    return _paged(
        request,
        "audit.html",
        "audit",
        page,
        lambda limit, offset: auditing.read_log(
            ctx, limit=limit, offset=offset, newest_first=True, actor=actor or None, action=action or None
        ),
        verdict=auditing.recent_verdict(ctx),
        filters={"actor": actor, "action": action},
    )


# -- planner --------------------------------------------------------------------------------------


@router.get("/planner")
def planner_page(
    ctx: PageCaller,
    request: Request,
    params_b: Annotated[float, Query(gt=0, le=10_000)] = 8.0,
    tokens_b: Annotated[float, Query(gt=0, le=1_000_000)] = 100.0,
    workload: Annotated[str, Query(pattern="^(pretrain|finetune|lora|qlora)$")] = "pretrain",
    rank_by: Annotated[str, Query(pattern="^(time|cost|energy)$")] = "cost",
    devices: Annotated[int, Query(ge=0, le=100_000)] = 8,
) -> Response:
    """``devices`` of each type (one node's worth by default; 0: the fewest that hold the model)."""
    hardware = ctx.settings.home / planning.HARDWARE_FILE
    changed = hardware.stat().st_mtime_ns if hardware.is_file() else 0
    listed = _planned(ctx.settings, changed, params_b, tokens_b, workload, rank_by, devices)
    return render(
        request,
        "planner.html",
        active="planner",
        rows=listed,
        charts={field: _bars(listed, field) for field in ("time_h", "cost_usd", "energy_kwh")},
        asked={
            "params_b": params_b,
            "tokens_b": tokens_b,
            "workload": workload,
            "rank_by": rank_by,
            "devices": devices,
        },
    )


@functools.lru_cache(maxsize=64)
def _planned(
    settings: Settings,
    _hardware_changed: int,
    params_b: float,
    tokens_b: float,
    workload: str,
    rank_by: str,
    devices: int,
) -> list[dict[str, Any]]:
    """The 20-odd types planned for one question (a tenth of a second's work), kept for the next
    asker until ``hardware.yaml`` changes (``_hardware_changed``: its modification time)."""
    work = TrainingWorkload(
        model=model_shape(params_b * 1e9),
        kind=workload,  # type: ignore[arg-type]
        seq_len=2048,
        global_batch_tokens=2**22,
        tokens=tokens_b * 1e9,
        precision="bf16",
        optimizer="adamw",
        lora_rank=16,
        flash_attention=True,
    )
    catalog = planning.hardware_catalog(settings)
    return [
        row.to_dict() for row in planning.compare_accelerators(catalog, work, None, devices or None, rank_by)
    ]


def _bars(rows: list[dict[str, Any]], field: str) -> list[tuple[dict[str, Any], float | None]]:
    """The rows best first by ``field``, each with its bar's length on a log scale (the types
    span three orders of magnitude: on a linear one the CPU would leave the rest as slivers);
    the rows that do not fit, or have no figure, come last with no bar."""
    known = sorted((r for r in rows if r["fits"] and r[field]), key=lambda r: r[field])
    if not known:
        return [(row, None) for row in rows]
    low, high = math.log10(known[0][field]), math.log10(known[-1][field])
    span = (high - low) or 1.0
    # The best gets a tenth of the width, so that it still shows as a bar.
    bars: list[tuple[dict[str, Any], float | None]] = [
        (row, 0.1 + 0.9 * (math.log10(row[field]) - low) / span) for row in known
    ]
    return bars + [(row, None) for row in rows if row not in known]


def install(app: FastAPI) -> None:
    """Serve the dashboard at ``/``, its assets at ``/static``, and the API's documentation from
    the package (no CDN: the offline deployments have none)."""
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.router.routes.extend(router.routes)

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
