"""The dashboard's pages of what the platform keeps beside jobs: model versions and their stages,
stored artifacts, the audit log, and the planner's advisor."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from shipyard.api.deps import MAX_VERSION, Asked, Name, Version, checked_name
from shipyard.api.ui import wording
from shipyard.api.ui.rendering import render
from shipyard.api.ui.routing import Filter, page_router, paged
from shipyard.api.ui.session import (
    FormCaller,
    PageCaller,
)
from shipyard.domain.text import DNS_LABEL
from shipyard.errors import Forbidden, NotFound
from shipyard.registry import STAGES
from shipyard.services.accounts import auditing
from shipyard.services.estimates import planning
from shipyard.services.models import models
from shipyard.services.storage import storage as storage_service
from shipyard.services.storage import upkeep

router = page_router()


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
    return paged(
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
    return paged(
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
def planner_page(ctx: PageCaller, request: Request, asked: Asked) -> Response:
    """``devices`` of each type (one node's worth by default; 0: the fewest that hold the model)."""
    listed, price_note = planning.advice(ctx.settings, asked)
    return render(
        request,
        "planner.html",
        active="planner",
        rows=listed,
        price_note=price_note,
        ties=_ties(listed, asked.rank_by),
        charts={field: _bars(listed, field) for field in ("time_h", "cost_usd", "energy_kwh")},
        asked=asked,
    )


def _bars(rows: list[dict[str, Any]], field: str) -> list[Bar]:
    """The rows best first by ``field``, each with its bar's length on a log scale (the types
    span three orders of magnitude: on a linear one the CPU would leave the rest as slivers) and
    its 80 % range as an error bar on the same scale; the rows that do not fit, or have no figure,
    come last with no bar."""
    known = sorted((r for r in rows if r["fits"] and r[field]), key=lambda r: r[field])
    if not known:
        return [Bar(row) for row in rows]
    ends = [r[field] for r in known] + [
        r[f"{field}_range"][end] for r in known if r[f"{field}_range"] for end in ("low", "high")
    ]
    low, high = math.log10(min(ends)), math.log10(max(ends))
    span = (high - low) or 1.0

    def share(value: float) -> float:
        # The lowest gets a tenth of the width, so that it still shows as a bar.
        return 0.1 + 0.9 * (math.log10(value) - low) / span

    bars = [
        Bar(
            row,
            share(row[field]),
            *((share(r["low"]), share(r["high"])) if (r := row[f"{field}_range"]) else ()),
        )
        for row in known
    ]
    return bars + [Bar(row) for row in rows if row not in known]


def _ties(rows: list[dict[str, Any]], rank_by: str) -> str | None:
    """``Tied on cost: rank 1 a100-80gb, h100-sxm; ...``: the types the advisor will not order."""
    groups: dict[int, list[str]] = {}
    for row in rows:
        if row["tied"]:
            groups.setdefault(row["rank"], []).append(row["accelerator"])
    if not groups:
        return None
    listed = "; ".join(f"rank {rank} {', '.join(names)}" for rank, names in groups.items())
    return f"Tied on {rank_by} (80% ranges overlap, so none is called better than the other): {listed}."


@dataclass(frozen=True, slots=True)
class Bar:
    row: dict[str, Any]
    share: float | None = None
    """Its length as a share of the chart's width; None: no bar (does not fit, or no figure)."""
    low: float | None = None
    high: float | None = None
    """Where its 80 % range starts and ends, as shares of the width."""
