"""Tables of jobs and their attempts, metrics, models, planner measurements and the cluster. Every
change to them ships with an Alembic migration in ``migrations/versions``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from shipyard.db.base import Base, utcnow
from shipyard.domain import JobState
from shipyard.domain.transitions import job_transition


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    project: Mapped[str] = mapped_column(String(64), index=True)
    queue: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]]
    """The validated spec, with data paths made absolute."""
    devices: Mapped[int] = mapped_column(Integer)
    accelerator_types: Mapped[list[Any]]
    """The any-of list from the spec, in order of preference."""
    run_dir: Mapped[str] = mapped_column(Text)
    resume_from: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    preempt_requested: Mapped[bool] = mapped_column(default=False)
    resize_message: Mapped[str | None] = mapped_column(Text)
    """The scheduler's resize of this running elastic job (what, and why), until its attempt ends
    with the kind ``resized``; ``preempt_requested`` is set with it."""
    owner: Mapped[str | None] = mapped_column(String(64), index=True)
    """Who submitted it (``local:USER`` on the embedded platform)."""
    """The scheduler asked the running attempt to checkpoint and stop; the job is requeued."""
    pending_reason: Mapped[str | None] = mapped_column(Text)
    pending_code: Mapped[str | None] = mapped_column(String(32))
    """The stable code of ``pending_reason`` (``shipyard.scheduling.status.Reason``)."""
    estimate: Mapped[dict[str, Any] | None]
    """The planner's prediction at submit time (memory, tokens/s, step time), shown beside the
    measured figures."""
    """Why the agent could not start this queued job at its last look."""
    exit_reason: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)
    hint: Mapped[str | None] = mapped_column(Text)
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    """The micro-batch of its next attempt where it differs from the spec's (after an attempt
    ran out of memory: half of it, with twice the gradient accumulation)."""
    restart_at: Mapped[datetime | None]
    """A job the restart policy requeued waits until then (its backoff)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    """The client's key for the submission that created it: a retried request finds this job."""

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.number", cascade="all, delete-orphan"
    )

    def move(self, after: JobState, **details: Any) -> None:
        """Move to ``after`` (``domain.transitions``: the moves that exist, what each sets)."""
        for column, value in job_transition(self.state, after, at=utcnow(), **details).items():
            setattr(self, column, value)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    accelerator_type: Mapped[str] = mapped_column(String(32))
    device_ids: Mapped[list[Any]]
    """Device indices (GPUs) or CPU core ids given to this attempt."""
    threads_per_process: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(128))
    """The node it runs on (None: before nodes were recorded, the agent's own machine)."""
    handle: Mapped[str | None] = mapped_column(String(256))
    """The executor's name for it (the local executor's: the process id)."""
    agent_id: Mapped[str | None] = mapped_column(String(64))
    """The agent process that launched it (a restarted agent cannot wait on it)."""
    log_path: Mapped[str] = mapped_column(Text)
    metrics_offset: Mapped[int] = mapped_column(Integer, default=0)
    """Bytes of metrics.jsonl already copied into the metrics table."""
    exit_code: Mapped[int | None] = mapped_column(Integer)
    exit_reason: Mapped[str | None] = mapped_column(String(16))
    signalled_at: Mapped[datetime | None]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    """Sequences per forward pass it ran with (None: the spec's)."""
    world_size: Mapped[int | None] = mapped_column(Integer)
    """Processes of its gang over all its nodes (None: recorded before elastic jobs, the spec's)."""
    message: Mapped[str | None] = mapped_column(Text)
    """Why the scheduler ended it, in words (an elastic job's resize: from what size to what, and
    why); None for the other endings, which the job's own message tells."""
    health: Mapped[dict[str, Any] | None]
    """What its heartbeats showed: each rank's compute time per step and its stragglers."""
    inputs: Mapped[dict[str, Any] | None]
    """Stored datasets it read (``store:NAME``) -> their content digest at launch: the lineage of
    what it trained on, even if the artifact is replaced later."""

    job: Mapped[Job] = relationship(back_populates="attempts")


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_kind_step", "job_id", "kind", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    """``start``, ``train``, ``eval`` or ``checkpoint``."""
    step: Mapped[int] = mapped_column(Integer, default=0)
    loss: Mapped[float | None]
    tokens_per_s: Mapped[float | None]
    mfu: Mapped[float | None]
    values: Mapped[dict[str, Any]]
    """The whole record as the runtime wrote it."""


class MetricPoint(Base):
    """One scalar the runtime logged, at its step: the time series charts and the metrics API read.
    Every number of every record becomes one (``loss``, ``lr``, ``grad_norm``, a fine-tuning
    method's own figures…); those of a record that is not a training step are named with its
    kind in front (``eval_loss``)."""

    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_job_name_step", "job_id", "name", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float]
    at: Mapped[float]
    """When it was logged, seconds since the epoch (the wall-time axis)."""


class DeviceSample(Base):
    """What one device of a node was doing at a moment, as its agent sampled it: vendor counters for
    an accelerator (None where the vendor reports no such figure), ``/proc`` for the CPU."""

    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_node_device_at", "node", "device", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(255))
    device: Mapped[str] = mapped_column(String(32))
    """``cpu``, or the accelerator's index as a string."""
    at: Mapped[float]
    """Seconds since the epoch."""
    utilization: Mapped[float | None]
    """Busy fraction 0..1."""
    memory_gib: Mapped[float | None]
    """Memory in use (the host's, for ``cpu``)."""
    power_w: Mapped[float | None]
    temperature_c: Mapped[float | None]
    clock_mhz: Mapped[float | None]
    io_mib_s: Mapped[float | None]
    """Disk reads and writes (``cpu``: the host's), MiB/s since the previous sample."""
    throttle: Mapped[str | None] = mapped_column(String(128))
    """Why the vendor says the device runs slower than it could (None: it does not)."""


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    """``checkpoint`` or ``export``."""
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    stored_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    """Its name in the artifact store (project: the job's) once committed there; ``""`` when the
    folder was gone before it could be; None while not yet committed."""
    lineage: Mapped[dict[str, Any] | None]
    """An export's origin as the runtime recorded it: the digests of its base model and data,
    the fine-tuning method and its settings."""
    written: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    """A checkpoint its nodes wrote into the store themselves: its files' records (blob names,
    digests, sizes, keys wrapped), from which the catalog commits it and a relaunch reads it."""


class ShapeMeasurement(Base):
    """What an attempt of a shape of job (model, method, batch, layout, threads) last measured on
    an accelerator type, beside what the planner had predicted: later estimates of the same shape
    take the measured figures, and ``shipyard plan calibrate`` fits this cluster's efficiency
    from the pairs."""

    __tablename__ = "shape_measurements"

    shape: Mapped[str] = mapped_column(String(64), primary_key=True)
    accelerator_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    planned_gib: Mapped[float | None]
    measured_gib: Mapped[float | None]
    planned_tokens_per_s: Mapped[float | None]
    measured_tokens_per_s: Mapped[float | None]
    planned_efficiency: Mapped[float] = mapped_column(default=1.0)
    """The cluster's efficiency factor on the type that the planned figures were made with."""
    job_id: Mapped[str] = mapped_column(String(64))
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeviceCalibration(Base):
    """This cluster's compute efficiency on an accelerator type, as a factor on the planner's
    (fitted by ``shipyard plan calibrate`` from ``shape_measurements``)."""

    __tablename__ = "device_calibrations"

    accelerator_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    efficiency: Mapped[float]
    rows: Mapped[int]
    error_before: Mapped[float]
    """Median absolute error of planned against measured tokens/s with the catalog's efficiency."""
    error_after: Mapped[float]
    fitted_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("project", "name", "version", name="uq_model_versions_project_name_version"),
    )
    """A model's name is its project's: ``research/shared`` and ``vision/shared`` are two models."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[int] = mapped_column(Integer)
    project: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    stage: Mapped[str] = mapped_column(String(16), default="none")
    """``none``, ``staging``, ``production`` or ``archived``."""

    artifact: Mapped[Artifact] = relationship()


class QueueConfigVersion(Base):
    """One applied queue configuration (``schemas/queues.py``); the newest is in force. Kept, not
    overwritten, so each quota change can be read back beside its audit record."""

    __tablename__ = "queue_configs"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    document: Mapped[dict[str, Any]]
    applied_by: Mapped[str] = mapped_column(String(64))
    applied_at: Mapped[datetime]


class ClusterNode(Base):
    """Each node the agent's engine knows, as the agent last read it (down ones too): what the API
    server lists and checks requests against, so that it never joins the engine itself."""

    __tablename__ = "cluster_nodes"

    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    inventory: Mapped[dict[str, Any]]
    """``NodeInventory.record()``: devices, labels, up, what others use, the host's rates."""
    recorded_at: Mapped[datetime]


class AgentStatus(Base):
    """What each node's agent saw at its last pass: for ``/metrics`` and for telling a live node
    from a silent one. One row per node, overwritten by every pass."""

    __tablename__ = "agent_status"

    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(255))
    last_pass_at: Mapped[datetime]
    pass_s: Mapped[float]
    """The whole pass: metrics ingested, exits handled, the scheduling decision acted on."""
    schedule_s: Mapped[float]
    """The scheduling decision and the launches it asked for."""
    devices: Mapped[dict[str, Any]]
    """Accelerator type -> {"total": n, "in_use": m} (cpu counts cores)."""
    utilization: Mapped[dict[str, Any] | None]
    """Device index -> busy fraction 0..1 from the vendor's counters, where a vendor reports it."""
    problems: Mapped[list[Any] | None]
    """Why the node is cordoned (low disk, a GPU with ECC errors or that does not answer); None: fit."""
