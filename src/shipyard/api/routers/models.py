"""Registered model versions: publish, promote, download, lineage, compare, delete."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import FileResponse

from shipyard.api.deps import (
    Caller,
    Name,
    ProjectQuery,
    Version,
    VersionQuery,
    checked_name,
    links,
    optional_name,
)
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.api.routers.artifacts import BINARY_ANSWER
from shipyard.errors import InvalidSpec
from shipyard.schemas.requests import Registration, StageChange
from shipyard.schemas.views import ModelComparisonView, ModelLineageView, ModelVersionView
from shipyard.services import models

router = APIRouter(prefix="/api/v1/models", tags=["models"], responses=PROBLEM_RESPONSES)
MODEL_LINKS = links(
    201, {"name": "name", "version": "version"}, "promoteModel", "modelLineage", "deleteModel"
)


@router.get("", operation_id="listModels", response_model=list[ModelVersionView])
def list_models(ctx: Caller, name: ProjectQuery = None) -> list[ModelVersionView]:
    return models.list_versions(ctx, optional_name(name))


@router.post(
    "/{name}/versions",
    operation_id="registerModel",
    response_model=ModelVersionView,
    status_code=201,
    responses=MODEL_LINKS,
)
def register_model(name: Name, body: Registration, ctx: Caller) -> ModelVersionView:
    """Publish a finished job's export as the next version of ``name`` (maintainers and up)."""
    return models.register(ctx, checked_name(body.job_id), checked_name(name))


@router.post("/{name}/versions/{version}/stage", operation_id="promoteModel", response_model=ModelVersionView)
def promote_model(name: Name, version: Version, body: StageChange, ctx: Caller) -> ModelVersionView:
    return models.promote(ctx, _ref(name, version), body.stage)


@router.get(
    "/{name}/versions/{version}/files/{file:path}",
    operation_id="downloadModelFile",
    response_class=FileResponse,
    responses=BINARY_ANSWER,
)
def download_model_file(name: Name, version: Version, file: str, ctx: Caller) -> FileResponse:
    if file.startswith("/") or ".." in file.split("/"):
        raise InvalidSpec(
            f"{file!r} is not a file of a model", hint="give a path inside the model, e.g. config.json"
        )
    path = models.download(ctx, _ref(name, version), file)
    return FileResponse(path, media_type="application/octet-stream", filename=path.name)


@router.get(
    "/{name}/versions/{version}/lineage", operation_id="modelLineage", response_model=ModelLineageView
)
def model_lineage(name: Name, version: Version, ctx: Caller) -> ModelLineageView:
    return models.lineage(ctx, _ref(name, version))


@router.get("/{name}/compare", operation_id="compareModels", response_model=ModelComparisonView)
def compare_models(name: Name, ctx: Caller, a: VersionQuery, b: VersionQuery) -> ModelComparisonView:
    """Two versions' lineage side by side, and the fields that differ."""
    return models.compare(ctx, _ref(name, a), _ref(name, b))


@router.delete("/{name}/versions/{version}", operation_id="deleteModel", status_code=204)
def delete_model(name: Name, version: Version, ctx: Caller) -> Response:
    models.delete(ctx, _ref(name, version))
    return Response(status_code=204)


def _ref(model: str, version: int) -> str:
    return f"{checked_name(model)}:{version}"
