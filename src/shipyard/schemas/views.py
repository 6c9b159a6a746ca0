"""What read use cases return: one shape for the CLI's tables, its ``--json`` and (later) the API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class AttemptView(_View):
    number: int
    state: str
    accelerator_type: str
    device_ids: list[int]
    threads_per_process: int
    pid: int | None
    exit_code: int | None
    exit_reason: str | None
    log_path: str
    started_at: datetime
    finished_at: datetime | None


class JobView(_View):
    id: str
    name: str
    project: str
    queue: str
    priority: int
    state: str
    pending_reason: str | None = None
    """Why a queued job is not running yet."""
    devices: int
    accelerator_types: list[str]
    step: int = 0
    total_steps: int
    loss: float | None = None
    eval_loss: float | None = None
    tokens_per_s: float | None = None
    exit_reason: str | None
    message: str | None
    hint: str | None
    run_dir: str
    resume_from: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ArtifactView(_View):
    kind: str
    path: str
    step: int
    size_bytes: int


class JobDetail(JobView):
    attempts: list[AttemptView]
    artifacts: list[ArtifactView]
    spec: dict[str, Any]
    summary: dict[str, float]
    """Start/end losses, median tokens/s, MFU and wall time of the training."""
    estimate: dict[str, Any] = {}
    """The planner's prediction at submit time (empty for jobs submitted before it existed)."""


class ModelVersionView(_View):
    name: str
    version: int
    project: str
    job_id: str
    step: int
    path: str
    size_bytes: int
    metrics: dict[str, Any]
    created_at: datetime
    stage: str = "none"


class DeviceView(_View):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    accelerator_type: str
    index: int
    name: str
    vendor: str
    memory_gib: float
    peak_bf16_tflops: float
    peak_fp32_tflops: float
    cores: int
    nvlink_peers: tuple[int, ...]


class Completion(_View):
    model: str
    prompt: str
    completion: str
    tokens: int


class StoredFileView(_View):
    path: str
    size_bytes: int
    digest: str
    """Block SHA-256 of the file's bytes (see ``shipyard.storage.digests``)."""


class StoredArtifactView(_View):
    project: str
    name: str
    kind: str
    """``file`` or ``folder``."""
    size_bytes: int
    files: int
    replicas: int
    encrypted: bool
    created_by: str
    created_at: datetime
    entries: list[StoredFileView] = []
    warnings: list[str] = []
    """Replicas a write could not place although its quorum was met (put only)."""


class ScrubReport(_View):
    checked: int
    corrupt: int
    missing: int
    repaired: int
    lost: int
    bytes_verified: int
    seconds: float
    lost_artifacts: list[str] = []
    """``project/name`` of every artifact holding a lost blob."""


class GcReport(_View):
    blobs_removed: int
    bytes_freed: int
    orphans_removed: int


class StorageStatus(_View):
    backend: str
    roots: list[dict[str, Any]]
    """Each root with its failure domains and free bytes (or the S3 endpoint and bucket)."""
    default_replicas: int
    artifacts: int
    blobs: int
    bytes: int
    """Bytes of all artifacts as users see them (a blob shared by two counts twice)."""
    stored_bytes: int
    """Bytes of the distinct blobs, before replication."""
    encrypted_blobs: int
    active_key: str | None
