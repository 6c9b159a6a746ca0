"""Registered model versions: publish, promote, download, lineage, compare, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse

from shipyard.api.deps import (
    Name,
    ProjectQuery,
    Reader,
    Version,
    VersionQuery,
    Writer,
    checked_name,
    links,
    optional_name,
)
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.api.routers.artifacts import BINARY_ANSWER
from shipyard.domain.text import DNS_LABEL
from shipyard.schemas.requests import Registration, StageChange
from shipyard.schemas.views import ModelComparisonView, ModelLineageView, ModelVersionView
from shipyard.services.models import models

router = APIRouter(prefix="/api/v1/models", tags=["models"], responses=PROBLEM_RESPONSES)
MODEL_LINKS = links(
    201,
    {"name": "name", "version": "version", "project": "project"},
    "promoteModel",
    "modelLineage",
    "deleteModel",
)


ModelProject = Annotated[
    str | None,
    Query(
        pattern=DNS_LABEL,
        description="The model's project: needed only when the name is a model of several projects "
        "the caller can see",
    ),
]


@router.get("", operation_id="listModels", response_model=list[ModelVersionView])
def list_models(
    ctx: Reader, name: ProjectQuery = None, project: ModelProject = None
) -> list[ModelVersionView]:
    return models.list_versions(ctx, optional_name(name), project)


@router.post(
    "/{name}/versions",
    operation_id="registerModel",
    response_model=ModelVersionView,
    status_code=201,
    responses=MODEL_LINKS,
)
def register_model(name: Name, body: Registration, ctx: Writer) -> ModelVersionView:
    """Publish a finished job's export as the next version of ``name``, a model of the job's
    project (maintainers and up)."""
    return models.register(ctx, checked_name(body.job_id), checked_name(name))


@router.post("/{name}/versions/{version}/stage", operation_id="promoteModel", response_model=ModelVersionView)
def promote_model(
    name: Name, version: Version, body: StageChange, ctx: Writer, project: ModelProject = None
) -> ModelVersionView:
    return models.promote(ctx, _ref(name, version), body.stage, project=project)


@router.get(
    "/{name}/versions/{version}/files/{file:path}",
    operation_id="downloadModelFile",
    response_class=FileResponse,
    responses=BINARY_ANSWER,
)
def download_model_file(
    name: Name, version: Version, file: str, ctx: Reader, project: ModelProject = None
) -> FileResponse:
    path = models.download(ctx, _ref(name, version), file, project=project)
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get(
    "/{name}/versions/{version}/lineage", operation_id="modelLineage", response_model=ModelLineageView
)
def model_lineage(
    name: Name, version: Version, ctx: Reader, project: ModelProject = None
) -> ModelLineageView:
    return models.lineage(ctx, _ref(name, version), project=project)


@router.get("/{name}/compare", operation_id="compareModels", response_model=ModelComparisonView)
def compare_models(
    name: Name, ctx: Reader, a: VersionQuery, b: VersionQuery, project: ModelProject = None
) -> ModelComparisonView:
    """Two versions' lineage side by side, and the fields that differ."""
    return models.compare(ctx, _ref(name, a), _ref(name, b), project=project)


@router.delete("/{name}/versions/{version}", operation_id="deleteModel", status_code=204)
def delete_model(name: Name, version: Version, ctx: Writer, project: ModelProject = None) -> Response:
    models.delete(ctx, _ref(name, version), project=project)
    return Response(status_code=204)


def _ref(model: str, version: int) -> str:
    return f"{checked_name(model)}:{version}"
