"""Where Shipyard keeps its state, read from the environment when asked (never at import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    home: Path
    """``$SHIPYARD_HOME``, default ``~/.shipyard``: database, runs, caches, agent state."""
    db_url: str
    agent_poll_s: float = 0.5
    agent_max_poll_s: float = 2.0
    """While no job changes state the agent backs off to this interval."""
    agent_idle_exit_s: float = 30.0
    """The embedded agent exits after this long with nothing queued or running."""
    cancel_grace_s: float = 60.0
    """Time a job has to checkpoint after SIGTERM before it is killed."""
    round_s: float = 300.0
    """Least time a job keeps its devices before the scheduler may preempt it."""
    policy: str = "shortest_remaining_fluid"
    """The scheduling policy the agent runs (`shipyard sim policies` lists them)."""
    resize_cost_s: float = 60.0
    """What a resize of an elastic job is taken to cost (checkpoint, restart, reload) until the
    job has measured its own (``SHIPYARD_RESIZE_COST_S``)."""
    sizing: str = "remaining"
    """How elastic jobs get their sizes: ``remaining`` (one program sizes them all together,
    shorter jobs first) or ``greedy`` (grown one device at a time from the policy's gang)
    (``SHIPYARD_SIZING``)."""
    placement: str = "topology"
    """The scheduling framework's placer: ``topology`` (a gang over the fewest racks, by the
    nodes' ``rack``/``switch`` labels) or ``pack`` (the fewest nodes, racks unseen)."""
    audit_key: str | None = None
    """Key of the audit log's MACs; default: a key file made once in ``home``."""
    max_upload_bytes: int = 2 << 30
    """Largest artifact the API server accepts in one upload (``SHIPYARD_MAX_UPLOAD_MB``)."""
    executor: str = "local"
    """Where attempts run: ``local`` (this machine), ``ray`` (a Ray cluster) or ``slurm``."""
    ray_address: str = "auto"
    """The Ray head's ``HOST:PORT`` for ``executor: ray`` (``auto``: the node this runs on)."""
    slurm_gres_types: str = ""
    """``GRES=CATALOG,...``: a Slurm site's GPU type names as catalog types (``a100=a100-80gb``)."""
    slurm_queues: str = ""
    """``QUEUE=PARTITION[:ACCOUNT[:QOS]],...``: where each Shipyard queue's jobs go in Slurm
    (``*`` for every queue not named; none: Slurm's default partition and the submitter's account)."""
    slurm_time_limit_min: float | None = None
    """Every Slurm allocation's time limit, where a site fixes one; default: the planner's estimate
    of the attempt with margin."""
    slurm_emulated_gpus: bool = False
    """The Slurm nodes' GPUs are GRES entries over device files that are not GPUs (a test
    cluster): their attempts run on the CPU. The seam for hardware a machine lacks."""
    min_free_disk_gib: float = 5.0
    """Below this much free disk under the run folders the node is cordoned (no new attempts)."""
    telemetry_interval_s: float = 5.0
    """How often the agent samples its node's devices (0: never)."""
    telemetry_retention_days: float = 30.0
    """Device samples older than this are deleted."""
    unhealthy_node: str = "finish"
    """What becomes of the attempts running on a node that is cordoned: ``finish`` there, or
    ``drain`` (checkpoint, stop and requeue, to resume elsewhere or once the node is well)."""

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings an environment names (a child process's, for a caller that starts one)."""
        home = Path(environ.get("SHIPYARD_HOME", "~/.shipyard")).expanduser().resolve()
        db_url = environ.get("SHIPYARD_DB_URL") or f"sqlite:///{home / 'shipyard.db'}"
        return cls(
            home=home,
            db_url=db_url,
            agent_poll_s=float(environ.get("SHIPYARD_AGENT_POLL_S", "0.5")),
            agent_max_poll_s=float(environ.get("SHIPYARD_AGENT_MAX_POLL_S", "2.0")),
            agent_idle_exit_s=float(environ.get("SHIPYARD_AGENT_IDLE_EXIT_S", "30")),
            cancel_grace_s=float(environ.get("SHIPYARD_CANCEL_GRACE_S", "60")),
            round_s=float(environ.get("SHIPYARD_ROUND_S", "300")),
            policy=environ.get("SHIPYARD_POLICY", "shortest_remaining_fluid"),
            placement=environ.get("SHIPYARD_PLACEMENT", "topology"),
            sizing=environ.get("SHIPYARD_SIZING", "remaining"),
            resize_cost_s=float(environ.get("SHIPYARD_RESIZE_COST_S", "60")),
            audit_key=environ.get("SHIPYARD_AUDIT_KEY") or None,
            max_upload_bytes=int(float(environ.get("SHIPYARD_MAX_UPLOAD_MB", "2048")) * 2**20),
            executor=environ.get("SHIPYARD_EXECUTOR", "local"),
            ray_address=environ.get("SHIPYARD_RAY_ADDRESS", "auto"),
            slurm_gres_types=environ.get("SHIPYARD_SLURM_GRES_TYPES", ""),
            slurm_queues=environ.get("SHIPYARD_SLURM_QUEUES", ""),
            slurm_time_limit_min=float(limit)
            if (limit := environ.get("SHIPYARD_SLURM_TIME_LIMIT_MIN"))
            else None,
            slurm_emulated_gpus=environ.get("SHIPYARD_SLURM_EMULATED_GPUS", "") == "1",
            min_free_disk_gib=float(environ.get("SHIPYARD_MIN_FREE_DISK_GIB", "5")),
            unhealthy_node=environ.get("SHIPYARD_UNHEALTHY_NODE", "finish"),
            telemetry_interval_s=float(environ.get("SHIPYARD_TELEMETRY_INTERVAL_S", "5")),
            telemetry_retention_days=float(environ.get("SHIPYARD_TELEMETRY_RETENTION_DAYS", "30")),
        )
