"""FastAPI app factory. Routes are thin: authenticate, call one use case, return its view.

Every permission check lives in the service layer (so the CLI and the API share them); this
module only turns a bearer token into the caller. Errors become problem JSON in ``errors``,
bodies are bounded in ``limits``, requests are counted in ``metrics``.
"""

import asyncio
import logging
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from shipyard import __version__
from shipyard.api.errors import PROBLEM, Problem, install_error_handlers
from shipyard.api.limits import LimitBodies
from shipyard.api.metrics import MeasureRequests, Metrics
from shipyard.errors import InvalidSpec, PayloadTooLarge, Unauthenticated
from shipyard.schemas.documents import PATTERN_WORDS
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.queues import QUEUE_NAME_PATTERN, ClusterQueueSpec, Devices, QueueConfig, QueueName
from shipyard.schemas.views import DeviceView, JobDetail, JobView, ModelVersionView, StoredArtifactView
from shipyard.services import accounts, audit, auditing, datasets, models, rbac, storage, telemetry
from shipyard.services import jobs as job_service
from shipyard.services import queues as queue_settings
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.devices import list_devices
from shipyard.services.scheduler import queue_status
from shipyard.services.verified_tokens import VerifiedTokens
from shipyard.settings import Settings
from shipyard.storage.names import check_name

log = logging.getLogger("shipyard.api")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""Ids and names in paths: no slashes, no dots first, so nothing can walk out of a folder."""
PATTERN_WORDS[ID_PATTERN] = (
    "a valid name: 1-128 letters, digits, '.', '_', ':' and '-', starting with a letter or digit"
)
LOG_POLL_S = 0.5
"""How often a log stream looks for new bytes."""
MAX_VERSION = 2**31 - 1
"""Version numbers are 32-bit integers in the database; a larger one is a 422, not an overflow."""
Version = Annotated[int, PathParam(ge=1, le=MAX_VERSION)]
LogOffset = Annotated[int, Query(ge=0, le=job_service.MAX_OFFSET)]
Name = Annotated[str, PathParam(pattern=ID_PATTERN)]
"""A path segment that names a job, token, user, project or model."""


# --- request and response bodies ----------------------------------------------------------------


class LoginRequest(BaseModel):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class TokenResponse(BaseModel):
    id: str
    token: str
    expires_at: str | None


class NewToken(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    scopes: list[Literal["read", "write", "admin"]] | None = Field(default=None, min_length=1, max_length=3)
    days: float | None = Field(default=accounts.DEFAULT_TOKEN_DAYS, gt=0, le=accounts.MAX_TOKEN_DAYS)
    user: str | None = None
    """For another user (admins only); default: the caller."""


class NewUser(BaseModel):
    name: str = Field(pattern=accounts.NAME.pattern)
    password: str | None = Field(default=None, min_length=accounts.MIN_PASSWORD, max_length=1024)
    admin: bool = False
    service: bool = False


class RoleBinding(BaseModel):
    role: Literal["viewer", "member", "maintainer", "owner"]


class Registration(BaseModel):
    job_id: str = Field(min_length=1, max_length=64)
    """A job that succeeded with an export."""


class StageChange(BaseModel):
    stage: Literal["none", "staging", "production", "archived"]


class Submission(BaseModel):
    spec: dict[str, Any]
    resume: bool = False
    resume_from: str | None = Field(default=None, max_length=4096)


class QueueUpdate(BaseModel):
    """One cluster queue's quota; its name is in the path."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    nominal: dict[QueueName, Devices] = Field(default_factory=dict)
    cohort: QueueName | None = None
    borrowing_limit: dict[QueueName, Devices] | None = Field(default=None, alias="borrowingLimit")
    local_queues: list[QueueName] = Field(default_factory=list, alias="localQueues", max_length=100)
    """Local queues (the names jobs give) to point at this queue."""


QueuePath = Annotated[str, PathParam(pattern=QUEUE_NAME_PATTERN)]


class LogChunkView(BaseModel):
    data: str
    next_offset: int
    job_ended: bool


# --- links between operations (OpenAPI), which stateful clients and fuzzers follow -------------


def _links(status: int, parameters: dict[str, str], *operation_ids: str) -> dict[int | str, Any]:
    """``responses`` of a route whose answer names a resource the other operations take:
    ``parameters`` maps each path parameter to the field of the answer that fills it."""
    fields = {name: f"$response.body#/{field}" for name, field in parameters.items()}
    return {status: {"links": {op: {"operationId": op, "parameters": fields} for op in operation_ids}}}


JOB_LINKS = _links(201, {"job_id": "id"}, "getJob", "cancelJob", "jobLogs", "streamJobLogs")
TOKEN_LINKS = _links(201, {"token_id": "id"}, "revokeToken")
ARTIFACT_LINKS = _links(
    201, {"project": "project", "name": "name"}, "getArtifact", "downloadArtifact", "deleteArtifact"
)
MODEL_LINKS = _links(
    201, {"name": "name", "version": "version"}, "promoteModel", "modelLineage", "deleteModel"
)


# --- the app ------------------------------------------------------------------------------------


NO_AGENT_ENV = "SHIPYARD_NO_AGENT"
"""Set to 1 (``shipyard server --no-agent``): the server queues jobs but starts no agent."""


def create_app(
    settings: Settings | None = None, *, init_admin: str | None = None, run_agent: bool | None = None
) -> FastAPI:
    """The API over the platform at ``settings`` (default: the environment). ``run_agent``: start
    this home's agent when jobs are submitted, so they train on this host (default: unless
    ``SHIPYARD_NO_AGENT=1``)."""
    if run_agent is None:
        run_agent = os.environ.get(NO_AGENT_ENV) != "1"
    holder: dict[str, Any] = {}
    """The platform (``ctx``) and this process's submission writer, made at start."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ctx = open_context(settings, verified_tokens=VerifiedTokens(), autostart_agent=run_agent)
        if init_admin:
            accounts.ensure_initial_admin(ctx, init_admin)
        ctx.executor  # noqa: B018 - discover devices now (may import torch), not in the first request
        holder["ctx"] = ctx
        writer = holder["writer"] = job_service.SubmissionWriter(ctx.db)
        yield
        writer.close()
        ctx.close()

    app = FastAPI(
        title="Shipyard",
        version=__version__,
        lifespan=lifespan,
        responses={
            status: {
                "model": Problem,
                "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
            }
            for status in (400, 401, 403, 404, 409, 413, 422, 429, 507)
        },
    )
    install_error_handlers(app)

    app.add_middleware(LimitBodies)
    app.add_middleware(MeasureRequests, metrics=metrics)

    async def caller(request: Request) -> ServiceContext:
        # In the event loop, not a worker thread: a token read a moment ago is checked without
        # the database; only a token to read goes to a thread (one hop fewer on each request).
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("this request needs a bearer token", hint="POST /api/v1/auth/token first")
        ctx: ServiceContext = holder["ctx"]
        source = request.client.host if request.client else "unknown"
        actor = accounts.authenticate_cached(ctx, token.strip(), source)
        if actor is None:
            actor = await run_in_threadpool(accounts.authenticate, ctx, token.strip(), source)
        if request.method not in ("GET", "HEAD") and "write" not in actor.scopes:
            raise Unauthenticated("this token is read-only", hint="use a token with the write scope")
        return ctx.acting_as(actor)

    Caller = Annotated[ServiceContext, Depends(caller)]

    @app.get("/healthz", operation_id="health")
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
    def prometheus() -> Response:
        metrics.observe(telemetry.cluster_metrics(holder["ctx"]))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/api/v1/auth/token", operation_id="login", response_model=TokenResponse)
    def login(body: LoginRequest, request: Request) -> TokenResponse:
        ctx = holder["ctx"]
        source = request.client.host if request.client else "unknown"
        anonymous = ctx.acting_as(audit.Actor(name=body.username, source=source))
        issued = accounts.login(anonymous, body.username, body.password)
        return TokenResponse(**issued.to_dict())

    @app.get("/api/v1/users/me", operation_id="whoami")
    def whoami(ctx: Caller) -> dict[str, Any]:
        return {"name": ctx.actor.name, "admin": ctx.actor.is_admin, "scopes": sorted(ctx.actor.scopes)}

    @app.get("/api/v1/users", operation_id="listUsers")
    def list_users(ctx: Caller) -> list[dict[str, Any]]:
        return accounts.list_users(ctx)

    @app.post("/api/v1/users", operation_id="createUser", status_code=201)
    def create_user(body: NewUser, ctx: Caller) -> dict[str, Any]:
        return accounts.create_user(ctx, body.name, body.password, admin=body.admin, service=body.service)

    @app.get("/api/v1/tokens", operation_id="listTokens")
    def list_tokens(ctx: Caller) -> list[dict[str, Any]]:
        return accounts.list_tokens(ctx)

    @app.post(
        "/api/v1/tokens",
        operation_id="issueToken",
        response_model=TokenResponse,
        status_code=201,
        responses=TOKEN_LINKS,
    )
    def issue_token(body: NewToken, ctx: Caller) -> TokenResponse:
        scopes = [str(scope) for scope in body.scopes] if body.scopes is not None else None
        issued = accounts.issue_token(ctx, body.user or ctx.actor.name, body.name, scopes, days=body.days)
        return TokenResponse(**issued.to_dict())

    @app.delete("/api/v1/tokens/{token_id}", operation_id="revokeToken", status_code=204)
    def revoke_token(token_id: Name, ctx: Caller) -> Response:
        accounts.revoke_token(ctx, _name(token_id))
        return Response(status_code=204)

    @app.put("/api/v1/projects/{project}/members/{user}", operation_id="setRole", status_code=204)
    def set_role(project: Name, user: Name, body: RoleBinding, ctx: Caller) -> Response:
        rbac.grant(ctx, _name(project), _name(user), body.role)
        return Response(status_code=204)

    @app.delete("/api/v1/projects/{project}/members/{user}", operation_id="removeRole", status_code=204)
    def remove_role(project: Name, user: Name, ctx: Caller) -> Response:
        rbac.grant(ctx, _name(project), _name(user), None)
        return Response(status_code=204)

    @app.get("/api/v1/jobs", operation_id="listJobs", response_model=list[JobView])
    def list_jobs(
        ctx: Caller,
        state: Annotated[str | None, Query(max_length=16)] = None,
        limit: Annotated[int, Query(ge=1, le=job_service.MAX_LISTED)] = 50,
    ) -> list[JobView]:
        return job_service.list_jobs(ctx, state=state, limit=limit)

    @app.post(
        "/api/v1/jobs", operation_id="submitJob", response_model=JobView, status_code=201, responses=JOB_LINKS
    )
    async def submit_job(body: Submission, ctx: Caller) -> JobView:
        # Checked and written by the process's submission writer, in its own thread.
        submission = job_service.Submission(ctx, validate_job_spec(body.spec), body.resume, body.resume_from)
        return await asyncio.wrap_future(holder["writer"].submit(submission))

    @app.get("/api/v1/jobs/{job_id}", operation_id="getJob", response_model=JobDetail)
    def get_job(job_id: Name, ctx: Caller) -> JobDetail:
        return job_service.get(ctx, _name(job_id))

    @app.post("/api/v1/jobs/{job_id}/cancel", operation_id="cancelJob", response_model=JobView)
    def cancel_job(job_id: Name, ctx: Caller) -> JobView:
        return job_service.cancel(ctx, _name(job_id))

    @app.get("/api/v1/jobs/{job_id}/logs", operation_id="jobLogs", response_model=LogChunkView)
    def job_logs(job_id: Name, ctx: Caller, offset: LogOffset = 0) -> LogChunkView:
        chunk = job_service.read_log(ctx, _name(job_id), offset, must_exist=False)
        return LogChunkView(
            data=chunk.data.decode("utf-8", "replace"),
            next_offset=chunk.next_offset,
            job_ended=chunk.job_ended,
        )

    @app.get(
        "/api/v1/jobs/{job_id}/logs/stream",
        operation_id="streamJobLogs",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/plain": {}}}},
    )
    async def stream_job_logs(job_id: Name, ctx: Caller, offset: LogOffset = 0) -> StreamingResponse:
        """The log from ``offset`` on as it is written, until the job ends (``curl -N``). The
        permission and the job's existence are checked before the first byte."""
        first = await run_in_threadpool(job_service.read_log, ctx, _name(job_id), offset, must_exist=False)

        async def tail() -> AsyncIterator[bytes]:
            chunk = first
            while True:
                if chunk.data:
                    yield chunk.data
                if chunk.job_ended:
                    return
                await asyncio.sleep(LOG_POLL_S)
                chunk = await run_in_threadpool(
                    job_service.read_log, ctx, job_id, chunk.next_offset, must_exist=False
                )

        return StreamingResponse(tail(), media_type="text/plain; charset=utf-8")

    @app.get("/api/v1/queues", operation_id="queueStatus")
    def queue_state(ctx: Caller) -> dict[str, Any]:
        """Pending jobs with why each waits, and every queue's quota, usage and borrowing."""
        return queue_status(ctx)

    @app.get("/api/v1/queue-config", operation_id="getQueueConfig")
    def get_queue_config(ctx: Caller) -> dict[str, Any]:
        """The queue configuration in force (cluster queues, quotas, local queues) and its source."""
        return queue_settings.show(ctx)

    @app.put("/api/v1/queue-config", operation_id="applyQueueConfig")
    def apply_queue_config(config: QueueConfig, ctx: Caller) -> dict[str, Any]:
        """Replace the whole configuration (cluster admins); audited as ``quota.change``."""
        return queue_settings.apply(ctx, config)

    @app.put("/api/v1/queues/{name}", operation_id="setQueue")
    def set_queue(name: QueuePath, body: QueueUpdate, ctx: Caller) -> dict[str, Any]:
        """Add one cluster queue or replace its quota (cluster admins); audited."""
        queue = ClusterQueueSpec(
            name=name, nominal=body.nominal, cohort=body.cohort, borrowing_limit=body.borrowing_limit
        )
        return queue_settings.set_queue(ctx, queue, body.local_queues)

    @app.delete("/api/v1/queues/{name}", operation_id="removeQueue")
    def remove_queue(name: QueuePath, ctx: Caller) -> dict[str, Any]:
        """Remove a cluster queue and the local queues naming it (cluster admins); audited."""
        return queue_settings.remove_queue(ctx, name)

    @app.get("/api/v1/nodes", operation_id="listDevices", response_model=list[DeviceView])
    def list_nodes(ctx: Caller) -> list[DeviceView]:
        """The devices of the node this server runs on, each with its accelerator type."""
        return list_devices(ctx)

    @app.get("/api/v1/models", operation_id="listModels", response_model=list[ModelVersionView])
    def list_models(
        ctx: Caller, name: Annotated[str | None, Query(max_length=64)] = None
    ) -> list[ModelVersionView]:
        return models.list_versions(ctx, _name(name) if name else None)

    @app.post(
        "/api/v1/models/{name}/versions",
        operation_id="registerModel",
        response_model=ModelVersionView,
        status_code=201,
        responses=MODEL_LINKS,
    )
    def register_model(name: Name, body: Registration, ctx: Caller) -> ModelVersionView:
        """Publish a finished job's export as the next version of ``name`` (maintainers and up)."""
        return models.register(ctx, _name(body.job_id), _name(name))

    @app.post(
        "/api/v1/models/{name}/versions/{version}/stage",
        operation_id="promoteModel",
        response_model=ModelVersionView,
    )
    def promote_model(name: Name, version: Version, body: StageChange, ctx: Caller) -> ModelVersionView:
        return models.promote(ctx, f"{_name(name)}:{version}", body.stage)

    @app.get(
        "/api/v1/models/{name}/versions/{version}/files/{file:path}",
        operation_id="downloadModelFile",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def download_model_file(name: Name, version: Version, file: str, ctx: Caller) -> FileResponse:
        if file.startswith("/") or ".." in file.split("/"):
            raise InvalidSpec(
                f"{file!r} is not a file of a model", hint="give a path inside the model, e.g. config.json"
            )
        path = models.download(ctx, f"{_name(name)}:{version}", file)
        return FileResponse(path, media_type="application/octet-stream", filename=path.name)

    @app.get("/api/v1/models/{name}/versions/{version}/lineage", operation_id="modelLineage")
    def model_lineage(name: Name, version: Version, ctx: Caller) -> dict[str, Any]:
        return models.lineage(ctx, f"{_name(name)}:{version}")

    @app.get("/api/v1/models/{name}/compare", operation_id="compareModels")
    def compare_models(
        name: Name,
        ctx: Caller,
        a: Annotated[int, Query(ge=1, le=MAX_VERSION)],
        b: Annotated[int, Query(ge=1, le=MAX_VERSION)],
    ) -> dict[str, Any]:
        """Two versions' lineage side by side, and the fields that differ."""
        return models.compare(ctx, f"{_name(name)}:{a}", f"{_name(name)}:{b}")

    @app.delete("/api/v1/models/{name}/versions/{version}", operation_id="deleteModel", status_code=204)
    def delete_model(name: Name, version: Version, ctx: Caller) -> Response:
        models.delete(ctx, f"{_name(name)}:{version}")
        return Response(status_code=204)

    @app.get("/api/v1/datasets", operation_id="listDatasets")
    def list_datasets(
        ctx: Caller, project: Annotated[str | None, Query(max_length=64)] = None
    ) -> list[dict[str, Any]]:
        """Stored datasets jobs trained on: the content each attempt read, the models that came of it."""
        return datasets.list_datasets(ctx, _name(project) if project else None)

    @app.get("/api/v1/artifacts", operation_id="listArtifacts", response_model=list[StoredArtifactView])
    def list_artifacts(
        ctx: Caller,
        project: Annotated[str | None, Query(max_length=64)] = None,
        prefix: Annotated[str, Query(max_length=255)] = "",
    ) -> list[StoredArtifactView]:
        return storage.list_artifacts(ctx, _name(project) if project else None, prefix)

    @app.put(
        "/api/v1/artifacts/{project}/{name:path}",
        operation_id="uploadArtifact",
        response_model=StoredArtifactView,
        status_code=201,
        responses=ARTIFACT_LINKS,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def upload_artifact(
        project: str,
        name: str,
        request: Request,
        ctx: Caller,
        replicas: Annotated[int | None, Query(ge=1, le=16)] = None,
        encrypt: bool | None = None,
    ) -> StoredArtifactView:
        """The body is the file; it is streamed to disk and refused past the upload limit."""
        check_name(name)
        limit = ctx.settings.max_upload_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
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
                project=_name(project),
                replicas=replicas,
                encrypt=encrypt,
                file_name=name.rsplit("/", 1)[-1],
            )

    @app.get(
        "/api/v1/artifacts/{project}/{name:path}",
        operation_id="getArtifact",
        response_model=StoredArtifactView,
    )
    def get_artifact(project: str, name: str, ctx: Caller) -> StoredArtifactView:
        return storage.stat(ctx, name, _name(project))

    @app.delete("/api/v1/artifacts/{project}/{name:path}", operation_id="deleteArtifact", status_code=204)
    def delete_artifact(project: str, name: str, ctx: Caller) -> Response:
        storage.delete(ctx, name, _name(project))
        return Response(status_code=204)

    @app.get(
        "/api/v1/downloads/{project}/{name:path}",
        operation_id="downloadArtifact",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def download_artifact(
        project: str, name: str, ctx: Caller, file: Annotated[str | None, Query(max_length=4096)] = None
    ) -> FileResponse:
        """A file of an artifact (``file``: its path inside a folder artifact), verified before
        the first byte is sent."""
        staging = Path(tempfile.mkdtemp(dir=ctx.settings.home))
        try:
            inside = storage.get_file(ctx, name, file, staging / "file", project=_name(project))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return FileResponse(
            staging / "file",
            media_type="application/octet-stream",
            filename=inside.rsplit("/", 1)[-1],
            background=BackgroundTask(shutil.rmtree, staging, ignore_errors=True),
        )

    @app.get("/api/v1/audit", operation_id="listAudit")
    def list_audit(
        ctx: Caller,
        since: Annotated[str | None, Query(max_length=40)] = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    ) -> list[dict[str, Any]]:
        return auditing.read_log(ctx, audit.parse_since(since) if since else None, limit)

    @app.get("/api/v1/audit/verify", operation_id="verifyAudit")
    def verify_audit(ctx: Caller) -> dict[str, Any]:
        return auditing.verify(ctx).to_dict()

    return app


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the upload is {size / 2**20:.1f} MiB or more; this server accepts at most {limit / 2**20:.0f} MiB",
        hint="store large checkpoints from the training node (`shipyard storage put`), "
        "or raise SHIPYARD_MAX_UPLOAD_MB",
    )


def _name(value: str) -> str:
    """A path segment that names something: refuse traversal and separators with a 400."""
    if not re.match(ID_PATTERN, value) or ".." in value:
        raise InvalidSpec(
            f"{value!r} is not a valid name",
            hint="names are letters, digits, '.', '_', ':' and '-', without '/', '..' or a leading dot",
        )
    return value
