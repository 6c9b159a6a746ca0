"""Stored artifacts (upload streamed to disk, download verified first) and the datasets jobs read."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from shipyard.api.deps import ProjectQuery, Reader, Served, Writer, checked_name, links, optional_name
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.errors import PayloadTooLarge
from shipyard.schemas.storage_views import StoredArtifactView
from shipyard.schemas.views import DatasetView
from shipyard.services.storage import admission, datasets, storage

router = APIRouter(prefix="/api/v1", tags=["artifacts"], responses=PROBLEM_RESPONSES)
ARTIFACT_LINKS = links(
    201, {"project": "project", "name": "name"}, "getArtifact", "downloadArtifact", "deleteArtifact"
)
BINARY_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
BINARY_ANSWER: dict[int | str, dict[str, Any]] = {200: {"content": {"application/octet-stream": {}}}}


@router.get("/datasets", operation_id="listDatasets", response_model=list[DatasetView])
def list_datasets(ctx: Reader, project: ProjectQuery = None) -> list[DatasetView]:
    """Stored datasets jobs trained on: the content each attempt read, the models that came of it."""
    return datasets.list_datasets(ctx, optional_name(project))


@router.get("/artifacts", operation_id="listArtifacts", response_model=list[StoredArtifactView])
def list_artifacts(
    ctx: Reader, project: ProjectQuery = None, prefix: Annotated[str, Query(max_length=255)] = ""
) -> list[StoredArtifactView]:
    return storage.list_artifacts(ctx, optional_name(project), prefix)


@router.put(
    "/artifacts/{project}/{name:path}",
    operation_id="uploadArtifact",
    response_model=StoredArtifactView,
    status_code=201,
    responses=ARTIFACT_LINKS,
    openapi_extra=BINARY_BODY,
)
async def upload_artifact(
    project: str,
    name: str,
    request: Request,
    ctx: Writer,
    served: Served,
    replicas: Annotated[int | None, Query(ge=1, le=16)] = None,
    encrypt: bool | None = None,
) -> StoredArtifactView:
    """The body is the file; it is streamed to disk and refused past the upload limit. Who may
    write, the name and the project's quota are checked before the first byte is read."""
    limit = ctx.settings.max_upload_bytes
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else None
    if size is not None and size > limit:
        raise _too_large(size, limit)
    project = checked_name(project)
    await run_in_threadpool(admission.check_upload, ctx, name, project=project, size_bytes=size)
    with served.uploads.hold(ctx.actor.name):
        uploads = ctx.settings.home / "uploads"
        uploads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=uploads) as staging:
            path = Path(staging) / "body"
            size = 0
            with open(path, "wb") as sink:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(size, limit)
                    sink.write(chunk)
            return await run_in_threadpool(
                storage.put,
                ctx,
                path,
                name,
                project=project,
                replicas=replicas,
                encrypt=encrypt,
                file_name=name.rsplit("/", 1)[-1],
            )


@router.get("/artifacts/{project}/{name:path}", operation_id="getArtifact", response_model=StoredArtifactView)
def get_artifact(project: str, name: str, ctx: Reader) -> StoredArtifactView:
    return storage.stat(ctx, name, checked_name(project))


@router.delete("/artifacts/{project}/{name:path}", operation_id="deleteArtifact", status_code=204)
def delete_artifact(project: str, name: str, ctx: Writer) -> Response:
    storage.delete(ctx, name, checked_name(project))
    return Response(status_code=204)


@router.get(
    "/downloads/{project}/{name:path}",
    operation_id="downloadArtifact",
    response_class=FileResponse,
    responses=BINARY_ANSWER,
)
def download_artifact(
    project: str, name: str, ctx: Reader, file: Annotated[str | None, Query(max_length=4096)] = None
) -> FileResponse:
    """A file of an artifact (``file``: its path inside a folder artifact), verified before
    the first byte is sent."""
    staging = Path(tempfile.mkdtemp(dir=ctx.settings.home))
    try:
        inside = storage.get_file(ctx, name, file, staging / "file", project=checked_name(project))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return FileResponse(
        staging / "file",
        media_type="application/octet-stream",
        filename=inside.rsplit("/", 1)[-1],
        background=BackgroundTask(shutil.rmtree, staging, ignore_errors=True),
    )


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the upload is {size / 2**20:.1f} MiB or more; this server accepts at most {limit / 2**20:.0f} MiB",
        hint="store large checkpoints from the training node (`shipyard storage put`), "
        "or raise SHIPYARD_MAX_UPLOAD_MB",
    )
