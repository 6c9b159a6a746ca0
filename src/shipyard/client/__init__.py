"""Typed Python SDK of the Shipyard API (httpx). Problem JSON comes back as the same exception
classes the service layer raises, so callers handle one error tree whether embedded or remote."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from shipyard import errors
from shipyard.domain.paths import refuse_overwrite
from shipyard.schemas.queues import ClusterQueueSpec, QueueConfig
from shipyard.schemas.storage_views import StoredArtifactView
from shipyard.schemas.views import (
    AuditRecordView,
    AuditVerdictView,
    CallerView,
    DatasetView,
    DeviceSeriesView,
    DeviceView,
    HardwareAdviceView,
    IssuedTokenView,
    JobDetail,
    JobView,
    LogChunkView,
    MetricNamesView,
    MetricSeriesView,
    ModelComparisonView,
    ModelLineageView,
    ModelVersionView,
    NodeView,
    PointSeriesView,
    QueueChangeView,
    QueueSettingsView,
    QueueStatusView,
    TokenView,
    UsageView,
    UserView,
)

View = TypeVar("View", bound=BaseModel)

_BY_CODE: dict[str, type[errors.ShipyardError]] = {
    cls.code: cls
    for cls in (
        errors.InvalidSpec,
        errors.DatasetError,
        errors.NotFound,
        errors.Conflict,
        errors.Unschedulable,
        errors.Unauthenticated,
        errors.Forbidden,
        errors.AuditChainBroken,
        errors.PayloadTooLarge,
    )
}
_BY_CODE["invalid_request"] = errors.InvalidSpec  # the API's own validation of a request

IDEMPOTENCY_HEADER = "Idempotency-Key"
KEEPALIVE_S = 2.0
"""How long the SDK keeps an idle connection: less than the server keeps it open."""
SUBMIT_TRIES = 4
SUBMIT_BACKOFF_S = 0.5


class Client:
    """One server, one token. ``Client.login(url, user, password)`` gets a token first."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        on_request: Callable[[httpx.Request], None] | None = None,
    ) -> None:
        """``on_request``: called with each request before it is sent (to log or trace them)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        hooks = {"request": [on_request]} if on_request else {}
        # An idle connection is dropped well before the server's keep-alive (uvicorn's: 5 s,
        # httpx's own default is the same 5 s): reused at the moment the server closes it, a
        # request fails with "Server disconnected without sending a response".
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, event_hooks=hooks, limits=limits
        )

    @classmethod
    def login(cls, url: str, username: str, password: str) -> tuple[Client, IssuedTokenView]:
        with cls(url) as anonymous:
            body = {"username": username, "password": password}
            issued = anonymous._get(IssuedTokenView, "POST", "/api/v1/auth/token", json=body)
        return cls(url, issued.token), issued

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.ExecutorError(
                f"cannot reach the Shipyard server at {self._http.base_url}: {exc}",
                hint="is `shipyard server` running there? check SHIPYARD_URL",
            ) from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json() if response.content else None

    def _get(self, view: type[View], method: str, path: str, **kwargs: Any) -> View:
        """One call whose answer is ``view``."""
        return view.model_validate(self._call(method, path, **kwargs))

    def _list(self, view: type[View], path: str, **kwargs: Any) -> list[View]:
        """A GET whose answer is a list of ``view``."""
        return TypeAdapter(list[view]).validate_python(self._call("GET", path, **kwargs))  # type: ignore[valid-type]

    def list_users(self) -> list[UserView]:
        return self._list(UserView, "/api/v1/users")

    def list_tokens(self) -> list[TokenView]:
        return self._list(TokenView, "/api/v1/tokens")

    def whoami(self) -> CallerView:
        return self._get(CallerView, "GET", "/api/v1/users/me")

    def list_jobs(
        self, state: str | None = None, limit: int = 50, *, offset: int = 0, **where: str
    ) -> list[JobView]:
        """Newest first; ``where`` filters by ``project``, ``queue``, ``owner``, ``accelerator_type``."""
        params: dict[str, Any] = {"limit": limit, "offset": offset, **({"state": state} if state else {})}
        return self._list(JobView, "/api/v1/jobs", params={**params, **where})

    def job_metrics(
        self, job_id: str, kind: str = "train", *, max_points: int = 2000, after_step: int = -1
    ) -> MetricSeriesView:
        """The job's metrics by step as columns, downsampled to ``max_points``."""
        params = {"kind": kind, "max_points": max_points, "after_step": after_step}
        return self._get(MetricSeriesView, "GET", f"/api/v1/jobs/{job_id}/metrics", params=params)

    def metric_series(
        self, job_ids: list[str], names: list[str], *, max_points: int = 1000, after_step: int = -1
    ) -> list[PointSeriesView]:
        """Each named series (``loss``, ``lr``, ``grad_norm``, ``eval_loss``…) of each job, at most
        ``max_points`` points each; past that, every point carries its bucket's ``low``/``high``."""
        params = {"job": job_ids, "name": names, "max_points": max_points, "after_step": after_step}
        return self._list(PointSeriesView, "/api/v1/series", params=params)

    def metric_names(self, job_ids: list[str]) -> list[MetricNamesView]:
        """The names of the series each job logged."""
        return self._list(MetricNamesView, "/api/v1/series/names", params={"job": job_ids})

    def get_job(self, job_id: str) -> JobDetail:
        return self._get(JobDetail, "GET", f"/api/v1/jobs/{job_id}")

    def submit_job(
        self,
        spec: dict[str, Any],
        *,
        resume: bool = False,
        resume_from: str | None = None,
        idempotency_key: str | None = None,
    ) -> JobView:
        """Queue a job. The request carries an idempotency key (a new one unless given) and is
        sent again when the connection fails before the answer: the server creates the job
        once however many times it arrives."""
        body = {"spec": spec, "resume": resume, "resume_from": resume_from}
        headers = {IDEMPOTENCY_HEADER: idempotency_key or uuid.uuid4().hex}
        tries = 0
        while True:
            try:
                return self._get(JobView, "POST", "/api/v1/jobs", json=body, headers=headers)
            except errors.ExecutorError:  # unreachable, or the answer was lost on the way
                tries += 1
                if tries == SUBMIT_TRIES:
                    raise
                time.sleep(SUBMIT_BACKOFF_S * 2 ** (tries - 1))

    def cancel_job(self, job_id: str) -> JobView:
        return self._get(JobView, "POST", f"/api/v1/jobs/{job_id}/cancel")

    def job_logs(self, job_id: str, offset: int = 0, *, attempt: int | None = None) -> LogChunkView:
        """A chunk of the newest attempt's log (``attempt``: that attempt's) from ``offset`` on."""
        params = {"offset": offset, **({"attempt": attempt} if attempt else {})}
        return self._get(LogChunkView, "GET", f"/api/v1/jobs/{job_id}/logs", params=params)

    def follow_logs(self, job_id: str, offset: int = 0) -> Iterator[bytes]:
        """The job's log from ``offset`` on, as it is written, until the job ends."""
        url = f"/api/v1/jobs/{job_id}/logs/stream"
        with self._http.stream(
            "GET", url, params={"offset": offset}, timeout=httpx.Timeout(30, read=None)
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            yield from response.iter_bytes()

    def queues(self) -> QueueStatusView:
        """Status jobs (of the projects the caller reads) with reasons; quota and usage per queue."""
        return self._get(QueueStatusView, "GET", "/api/v1/queues")

    def queue_config(self) -> QueueSettingsView:
        """The queue configuration in force, its version and source."""
        return self._get(QueueSettingsView, "GET", "/api/v1/queue-config")

    def apply_queue_config(self, config: QueueConfig) -> QueueChangeView:
        return self._get(QueueChangeView, "PUT", "/api/v1/queue-config", json=config.document())

    def set_queue(self, queue: ClusterQueueSpec, local_queues: list[str]) -> QueueChangeView:
        body = {**queue.model_dump(by_alias=True, exclude_none=True), "localQueues": local_queues}
        del body["name"]
        return self._get(QueueChangeView, "PUT", f"/api/v1/queues/{queue.name}", json=body)

    def remove_queue(self, name: str) -> QueueChangeView:
        return self._get(QueueChangeView, "DELETE", f"/api/v1/queues/{name}")

    def usage(
        self, by: str = "project", *, since: datetime | None = None, until: datetime | None = None
    ) -> UsageView:
        """Device-hours and cost per project, queue, user or type (``by``) and per day."""
        params = {key: value.isoformat() for key, value in (("since", since), ("until", until)) if value}
        return self._get(UsageView, "GET", "/api/v1/usage", params={"by": by, **params})

    def node_telemetry(
        self, node: str, *, hours: float = 1.0, max_points: int = 300
    ) -> list[DeviceSeriesView]:
        """Each device of ``node`` over the last ``hours``, averaged into at most ``max_points``."""
        params = {"hours": hours, "max_points": max_points}
        return self._list(DeviceSeriesView, f"/api/v1/nodes/{node}/telemetry", params=params)

    def job_telemetry(self, job_id: str, *, max_points: int = 300) -> list[DeviceSeriesView]:
        """The devices each attempt of the job held, over its run."""
        return self._list(
            DeviceSeriesView, f"/api/v1/jobs/{job_id}/telemetry", params={"max_points": max_points}
        )

    def compare_hardware(
        self,
        params_b: float,
        tokens_b: float,
        *,
        devices: int = 8,
        workload: str = "pretrain",
        rank_by: str = "cost",
    ) -> HardwareAdviceView:
        """Every accelerator type planned for the workload and ranked, as the planner page shows it."""
        params = {"params_b": params_b, "tokens_b": tokens_b, "devices": devices, "workload": workload}
        return self._get(
            HardwareAdviceView, "GET", "/api/v1/planner/compare", params={**params, "rank_by": rank_by}
        )

    def nodes(self) -> list[DeviceView]:
        return self._list(DeviceView, "/api/v1/nodes")

    def cluster_nodes(self) -> list[NodeView]:
        return self._list(NodeView, "/api/v1/nodes/status")

    def list_models(self, name: str | None = None, project: str | None = None) -> list[ModelVersionView]:
        params = {k: v for k, v in (("name", name), ("project", project)) if v}
        return self._list(ModelVersionView, "/api/v1/models", params=params)

    def register_model(self, job_id: str, name: str) -> ModelVersionView:
        """Publish a finished job's export as the next version of model ``name`` of its project."""
        body = {"job_id": job_id}
        return self._get(ModelVersionView, "POST", f"/api/v1/models/{name}/versions", json=body)

    def promote_model(
        self, name: str, version: int, stage: str, *, project: str | None = None
    ) -> ModelVersionView:
        """``project``: the model's, needed only when several projects you see have ``name``."""
        path = f"/api/v1/models/{name}/versions/{version}/stage"
        return self._get(ModelVersionView, "POST", path, json={"stage": stage}, params=_project(project))

    def download_model_file(
        self,
        name: str,
        version: int,
        file: str,
        out: Path,
        *,
        force: bool = False,
        project: str | None = None,
    ) -> int:
        """Stream one file of a model version to ``out`` (written atomically; an existing file
        only with ``force``); returns its size."""
        path = f"/api/v1/models/{name}/versions/{version}/files/{file}"
        return self._download(path, out, _project(project), force=force)

    def list_datasets(self, project: str | None = None) -> list[DatasetView]:
        """Stored datasets jobs trained on, with who read which content and the models made."""
        return self._list(DatasetView, "/api/v1/datasets", params={"project": project} if project else {})

    def list_artifacts(self, project: str | None = None, prefix: str = "") -> list[StoredArtifactView]:
        params = {"prefix": prefix, **({"project": project} if project else {})}
        return self._list(StoredArtifactView, "/api/v1/artifacts", params=params)

    def upload_artifact(
        self, path: Path, project: str, name: str, *, replicas: int | None = None, encrypt: bool | None = None
    ) -> StoredArtifactView:
        """Store one file as artifact ``project/name`` (streamed, not read into memory)."""
        params = {k: v for k, v in {"replicas": replicas, "encrypt": encrypt}.items() if v is not None}
        with open(path, "rb") as body:
            stored = self._call(
                "PUT",
                f"/api/v1/artifacts/{project}/{name}",
                params=params,
                content=body,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(path.stat().st_size),
                },
            )
        return StoredArtifactView.model_validate(stored)

    def stat_artifact(self, project: str, name: str) -> StoredArtifactView:
        return self._get(StoredArtifactView, "GET", f"/api/v1/artifacts/{project}/{name}")

    def delete_artifact(self, project: str, name: str) -> None:
        self._call("DELETE", f"/api/v1/artifacts/{project}/{name}")

    def fetch_artifact(
        self, project: str, name: str, out: Path, *, force: bool = False
    ) -> StoredArtifactView:
        """Write artifact ``project/name`` to ``out`` as ``shipyard storage get`` does: a file (into
        ``out`` when that is a folder; over an existing file only with ``force``), or a folder that
        appears whole once every file is in."""
        found = self.stat_artifact(project, name)
        if found.kind == "file":
            target = out / found.entries[0].path if out.is_dir() else out
            self.download_artifact(project, name, target, force=force)
            return found
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise errors.Conflict(
                f"{out} exists and is not an empty folder", hint="give a new path for the folder"
            )
        staging = out.with_name(f".{out.name}.part")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for entry in found.entries:
                (staging / entry.path).parent.mkdir(parents=True, exist_ok=True)
                self.download_artifact(project, name, staging / entry.path, file=entry.path)
            if out.exists():
                out.rmdir()
            staging.rename(out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return found

    def download_artifact(
        self, project: str, name: str, out: Path, file: str | None = None, *, force: bool = False
    ) -> int:
        return self._download(
            f"/api/v1/downloads/{project}/{name}", out, params={"file": file} if file else None, force=force
        )

    def _download(
        self, path: str, out: Path, params: dict[str, str] | None = None, *, force: bool = False
    ) -> int:
        refuse_overwrite(out, force=force)
        staged = out.with_name(f".{out.name}.partial")
        try:
            with self._http.stream("GET", path, params=params) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                with open(staged, "wb") as handle:
                    for chunk in response.iter_bytes(1 << 20):
                        handle.write(chunk)
            staged.replace(out)
        finally:
            staged.unlink(missing_ok=True)
        return out.stat().st_size

    def model_lineage(self, name: str, version: int, *, project: str | None = None) -> ModelLineageView:
        path = f"/api/v1/models/{name}/versions/{version}/lineage"
        return self._get(ModelLineageView, "GET", path, params=_project(project))

    def compare_models(self, name: str, a: int, b: int, *, project: str | None = None) -> ModelComparisonView:
        path = f"/api/v1/models/{name}/compare"
        return self._get(ModelComparisonView, "GET", path, params={"a": a, "b": b, **_project(project)})

    def delete_model(self, name: str, version: int, *, project: str | None = None) -> None:
        self._call("DELETE", f"/api/v1/models/{name}/versions/{version}", params=_project(project))

    def audit(self, since: str | None = None, limit: int = 1000) -> list[AuditRecordView]:
        params: dict[str, Any] = {"limit": limit, **({"since": since} if since else {})}
        return self._list(AuditRecordView, "/api/v1/audit", params=params)

    def verify_audit(self) -> AuditVerdictView:
        return self._get(AuditVerdictView, "GET", "/api/v1/audit/verify")

    def create_user(
        self, name: str, password: str | None, *, admin: bool = False, service: bool = False
    ) -> UserView:
        body = {"name": name, "password": password, "admin": admin, "service": service}
        return self._get(UserView, "POST", "/api/v1/users", json=body)

    def issue_token(
        self, name: str, scopes: list[str] | None = None, days: float | None = 30.0, user: str | None = None
    ) -> IssuedTokenView:
        body = {"name": name, "scopes": scopes, "days": days, "user": user}
        return self._get(IssuedTokenView, "POST", "/api/v1/tokens", json=body)

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", f"/api/v1/tokens/{token_id}")

    def set_role(self, project: str, user: str, role: str | None) -> None:
        if role is None:
            self._call("DELETE", f"/api/v1/projects/{project}/members/{user}")
        else:
            self._call("PUT", f"/api/v1/projects/{project}/members/{user}", json={"role": role})


def _error(response: httpx.Response) -> errors.ShipyardError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = body.get("detail") or f"HTTP {response.status_code}"
    if response.status_code in (429, 503):
        wait = response.headers.get("retry-after", "")
        retry_after_s = float(wait) if wait.isdigit() else 1.0
        waits = errors.Overloaded if response.status_code == 503 else errors.Throttled
        error: errors.ShipyardError = waits(str(detail), retry_after_s=retry_after_s, hint=body.get("hint"))
    else:
        cls = _BY_CODE.get(body.get("code", ""), errors.ShipyardError)
        error = cls(str(detail), hint=body.get("hint"))
    error.http_status = response.status_code
    return error


def _project(project: str | None) -> dict[str, str]:
    """The query naming a model's project, when one is named."""
    return {"project": project} if project else {}
