"""What read use cases return: one shape for the CLI's tables, its ``--json`` and (later) the API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from shipyard.schemas.estimate import Estimate


class View(BaseModel):
    model_config = ConfigDict(frozen=True)


class AttemptView(View):
    number: int
    state: str
    accelerator_type: str
    device_ids: list[int]
    threads_per_process: int
    pid: int | None
    node: str | None = None
    """The node it ran on (None for attempts recorded before nodes were)."""
    exit_code: int | None
    exit_reason: str | None
    log_path: str
    started_at: datetime
    finished_at: datetime | None
    micro_batch_size: int | None = None
    """Sequences per forward pass (None: the spec's; smaller after an out-of-memory)."""
    world_size: int | None = None
    """Processes of its gang over all its nodes (an elastic job's differ from one to the next)."""
    message: str | None = None
    """Why the scheduler ended it, where it did (an elastic job's resize)."""
    health: dict[str, Any] | None = None
    """From its heartbeats: ``compute_s`` per rank (median seconds of compute per step),
    ``stragglers`` (ranks at 1.5 times the median or more, with their ratio) and, for an attempt
    stopped as hung, ``hang`` (why), ``silent_s`` (the silence it was stopped after, on the
    agent's clock) and ``limit_s`` (what its restart policy allowed)."""


class JobView(View):
    id: str
    name: str
    project: str
    queue: str
    priority: int
    state: str
    pending_reason: str | None = None
    """Why a queued job is not running yet."""
    pending_code: str | None = None
    """The stable code of that reason (``shipyard.scheduling.status.Reason``)."""
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
    warnings: list[str] = []
    """In the answer to a submission: what the spec allows but probably does not mean."""


class ArtifactView(View):
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
    estimate: Estimate | None = None
    """The planner's prediction at submit time (none where no node had the job's types)."""
    plan_gaps: list[str] = []
    """Where a measured figure is more than twice off the plan: which assumption was off."""


class ModelVersionView(View):
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


class DeviceView(View):
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
    node: str = ""
    """The node (machine) the device belongs to."""


class NodeView(View):
    """One node of the cluster: what it has, what running attempts use, where it sits, its jobs."""

    id: str
    up: bool
    """False while the cluster has lost it (its devices are out of the inventory), or while its
    state is ``unknown``."""
    unknown: str | None = None
    """Why its state is not known now (the agent that records the cluster for the server has not
    reached it for a while: its head away); what is shown is the last record."""
    capacity: dict[str, int]
    """Devices per accelerator type (cores for ``cpu``)."""
    used: dict[str, int]
    memory_gib: dict[str, float]
    """Memory per device of each type."""
    labels: dict[str, str]
    """Failure and topology domains: rack, switch, NVLink island, InfiniBand fabric."""
    jobs: list[str]
    problems: list[str] = []
    """Why it is cordoned, as its agent last saw it (low disk, a failing GPU); empty: fit."""
    host_op_us: float | None = None
    """What one tensor operation cost its host when it joined (``hardware.probe``): how fast it
    queues a GPU's kernels, which the estimates plan it with; null where it did not measure."""


class LogChunkView(View):
    data: str
    """The bytes from the offset on, decoded as UTF-8 (undecodable bytes replaced)."""
    next_offset: int
    job_ended: bool


class Completion(View):
    model: str
    prompt: str
    completion: str
    tokens: int


# --- accounts ------------------------------------------------------------------------------------


class HealthView(View):
    status: str
    version: str


class HardwareAdviceView(View):
    """Every accelerator type planned for one workload, ranked: each row as ``plan compare --json``
    gives it (time, cost and energy with their 80 % ranges, ``rank``, ``tied``, the plan with its
    evidence and price)."""

    rank_by: str
    rows: list[dict[str, Any]]
    price_caveat: str | None = None
    """Set where a purchase price is compared with rentals."""


class IssuedTokenView(View):
    id: str
    token: str
    """The secret: shown this once, never stored."""
    expires_at: str | None


class CallerView(View):
    """Who a token acts for."""

    name: str
    admin: bool
    scopes: list[str]


class UserView(View):
    name: str
    admin: bool
    service: bool
    disabled: bool


class TokenView(View):
    """A token without its secret."""

    id: str
    user: str
    name: str
    scopes: list[str]
    created_at: str
    expires_at: str | None
    last_used_at: str | None
    revoked: bool


# --- queues --------------------------------------------------------------------------------------


class PendingJobView(View):
    id: str
    project: str
    queue: str
    priority: int
    devices: int
    accelerator_types: list[str]
    submitted_at: str
    reason: str
    reason_code: str
    """``shipyard.scheduling.status.Reason``: what a program matches on."""


class QueueUsageView(View):
    name: str
    cohort: str | None
    nominal: dict[str, int]
    """Devices per type it is guaranteed (a type without a limit is left out)."""
    used: dict[str, int]
    borrowed: dict[str, int]
    local_queues: list[str]


class QueueStatusView(View):
    pending: list[PendingJobView]
    queues: list[QueueUsageView]


class QueueSettingsView(View):
    version: int | None
    """The applied version in force (None when read from the file, or when there is none)."""
    source: str
    config: dict[str, Any] | None
    """The configuration as the queues YAML has it."""


class QueueChangeView(QueueSettingsView):
    replaced: str
    """Where the configuration in force came from before the change."""
    changes: dict[str, Any]
    """``added``, ``removed`` and ``changed`` cluster queues (and ``local_queues`` if they moved)."""


# --- lineage and audit ---------------------------------------------------------------------------


class DatasetReadView(View):
    job: str
    attempt: int
    digest: str | None


class DatasetView(View):
    project: str
    name: str
    digest: str | None
    """The content digest now (None once the artifact is deleted)."""
    size_bytes: int | None
    read_by: list[DatasetReadView]
    models: list[str]
    """``name:version`` of the model versions trained on it."""


class ModelLineageView(View):
    model: str
    project: str
    stage: str
    created_at: str
    job: str
    owner: str | None
    attempts: int
    accelerator_type: str | None
    checkpoint_step: int
    base_model: str | None
    base_model_digest: str | None = None
    """The content digest of the base model's folder when the version was trained from it."""
    method: str | None = None
    """``full``, ``lora`` or ``qlora`` for a fine-tuned model; None for one trained from scratch."""
    adapter: dict[str, Any] | None = None
    """The adapters' settings (rank, alpha, dropout, target modules, DoRA)."""
    dataset_digest: str | None = None
    """The content digest of the data files it was trained on."""
    dataset: list[dict[str, Any]]
    stored_as: str | None
    metrics: dict[str, Any]
    estimate: Estimate | None


class ModelComparisonView(View):
    a: ModelLineageView
    b: ModelLineageView
    differences: dict[str, list[Any]]
    """Dotted field -> [value in a, value in b], for the fields that differ."""


class AuditRecordView(View):
    seq: int
    at: str
    actor: str
    action: str
    resource: str
    source: str | None
    outcome: str
    detail: dict[str, Any] | None
    prev_hash: str
    hash: str


class AuditVerdictView(View):
    ok: bool
    records: int
    head_seq: int
    first_bad: int | None = None
    problem: str | None = None


class MetricSeriesView(View):
    """One kind of a job's metrics as columns (what a chart draws), downsampled for long runs:
    every ``stride``-th logged step, and always the newest."""

    job_id: str
    kind: str
    """``train`` or ``eval``."""
    step: list[int]
    loss: list[float | None]
    tokens_per_s: list[float | None]
    mfu: list[float | None]
    mem_gib: list[float | None]
    stride: int
    """Steps between two points returned (the logging interval when nothing was left out)."""
    last_step: int | None
    """The newest step returned: ask again with ``after_step`` set to it for what follows."""


class MetricNamesView(View):
    """The series one job logged."""

    job_id: str
    job_name: str
    state: str
    names: list[str]
    tokens_per_step: int | None
    """Tokens each step trains on (the spec's global batch): a step axis times this is a tokens axis."""


class PointSeriesView(View):
    """One named series of one job as columns. Downsampled past ``max_points``: the steps are cut
    into buckets of ``bucket_steps``, each keeping its first and last point, and ``low``/``high``
    hold the lowest and highest value of each point's bucket (absent when nothing was left out)."""

    job_id: str
    name: str
    step: list[int]
    value: list[float]
    at: list[float]
    """When each point was logged, seconds since the epoch."""
    low: list[float] | None = None
    high: list[float] | None = None
    bucket_steps: int
    last_step: int | None
    """The newest step returned: ask again with ``after_step`` set to it for what follows."""


class UsageRowView(View):
    key: str
    """The project, queue, user or accelerator type."""
    device_hours: float
    """Devices held × hours (a CPU job's devices are its cores)."""
    cost_usd: float | None
    """Device-hours × the type's hourly price; None for a type without a price."""
    attempts: int
    by_day: list[float]
    """Device-hours on each of ``UsageView.days``."""


class UsageView(View):
    """Device-hours and cost between ``since`` and ``until``, grouped ``by`` one of project, queue,
    user or type, from the attempts' real start and end (running ones up to now)."""

    by: str
    since: datetime
    until: datetime
    days: list[str]
    """The UTC days of the window, oldest first."""
    rows: list[UsageRowView]
    device_hours: float
    cost_usd: float
    """The priced part; the types in ``unpriced_types`` add device-hours but no cost."""
    unpriced_types: list[str]
    """Types used without a price in the catalog or ``hardware.yaml`` (add ``price_usd_per_h``)."""


class DeviceSeriesView(View):
    """One device's telemetry as columns, each point the average of a ``bucket_s`` bucket of samples
    (None where the device reports no such figure)."""

    node: str
    device: str
    """``cpu`` (the host), or the accelerator's index."""
    attempt: int | None
    """The job's attempt that held it over this span (a job's telemetry), else None."""
    bucket_s: float
    at: list[float]
    """Seconds since the epoch."""
    utilization: list[float | None]
    """Busy fraction 0..1."""
    memory_gib: list[float | None]
    power_w: list[float | None]
    temperature_c: list[float | None]
    clock_mhz: list[float | None]
    io_mib_s: list[float | None]
    throttle: list[str | None]
    """What slowed the device in the bucket, in words, where something did."""
