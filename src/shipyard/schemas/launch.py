"""The launch plan: what an executor hands the training runtime, as ``launch.json`` in the run
directory. It is the whole contract between the platform and ``python -m shipyard.training``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from shipyard.durable import write_json_atomic
from shipyard.schemas.jobspec import JobSpec

LAUNCH_FILE = "launch.json"
RESULT_FILE = "result.json"
EXIT_FILE = "exit.json"
"""How the attempt's processes ended, written by their parent (``training.parent``), which
outlives the agent: exit code, signal, OOM kills meanwhile."""
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
EXPORT_DIR = "export"
MERGED_DIR = "merged"
"""In the export of adapters (``finetune.merge``): the base model with the adapters merged in."""
CHECKPOINT_MARKER = "checkpoint.json"
"""In a complete checkpoint folder (written last): its step, the layout that wrote it, the model
and method it holds, and a fine-tuning checkpoint's base digest; readable without torch."""
CHECKPOINT_STATE_FILE = "state.pt"
"""The whole state in one file, as an earlier Shipyard wrote its checkpoints (still read)."""
CHECKPOINT_POINTER = "latest"
CHECKPOINT_BASE_FILE = "base.json"
"""Beside an earlier Shipyard's fine-tuning checkpoint: the digest of its base weights."""

HEARTBEAT_DIR = "heartbeats"
STACKS_DIR = "stacks"
"""Where a hung attempt's stacks, read from outside it, are kept (``attempt-N.txt``)."""
"""``rank-N.json`` per rank, replaced after every step: how far it got, when, how long steps take."""
FAULTS_ENV = "SHIPYARD_FAULTS"
"""Faults to inject into attempts (``training/faults.py``): the chaos benchmark's and the tests'
way to cause an out-of-memory, a hang or a slow rank on a machine that would not have one."""

TorchDevice = Literal["cpu", "cuda", "mps", "xpu", "hpu"]
Phase = Literal["setup", "step", "eval", "checkpoint", "export"]


class Heartbeat(BaseModel):
    """One rank's progress, as the agent reads it to tell a hang and a straggler."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    step: int
    """Optimizer steps done (in this attempt or before it, when it resumed)."""
    phase: Phase
    """What the rank is doing since ``at``: a step, or a pause that is not one (eval, checkpoint)."""
    at: float
    """Unix time the rank last made progress (finished a step, entered a phase) or, before its
    first step, last said it is alive (every 2 s while it starts)."""
    median_step_s: float | None = None
    """Over its recent steps."""
    median_compute_s: float | None = None
    """Of each step, the time before its last collective: what a slow device makes slow."""

    @classmethod
    def read_all(cls, run_dir: Path) -> list[Heartbeat]:
        """Every rank's newest heartbeat (unreadable ones, mid-replace on a copy, are skipped)."""
        beats = []
        for path in sorted((run_dir / HEARTBEAT_DIR).glob("rank-*.json")):
            try:
                beats.append(cls.model_validate_json(path.read_bytes()))
            except (OSError, ValueError):
                continue
        return beats


class ExitRecord(BaseModel):
    """``exit.json``: how an attempt's processes ended, as their parent saw it."""

    parent_pid: int
    """The parent's pid: the attempt's ``pid`` (a record another attempt's parent left is not its)."""
    pid: int
    exit_code: int
    """The command's: negative for a signal (``-9``: SIGKILL)."""
    signal: str | None = None
    oom_kills: int | None = None
    """OOM kills in the parent's memory cgroup while the command ran, where the cgroup is readable."""
    ended_at: float


class LaunchPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    attempt: int
    spec: JobSpec
    run_dir: str
    cache_dir: str
    """Shared cache of tokenizers and token shards (content-addressed)."""
    accelerator_type: str
    torch_device: TorchDevice
    world_size: int
    threads_per_process: int
    peak_tflops_bf16: float
    """Per device, for MFU; 0 when unknown."""
    peak_tflops_fp32: float
    resume_from: str | None = None
    """A checkpoint directory to resume from (``--resume``), else a fresh start."""
    data_roots: list[str] | None = None
    """Folders every file the job reads must resolve inside (a job submitted through the
    server: its project's data roots and the node's cache); None: anywhere."""
    expected_s: float | None = None
    """What the planner expects the attempt to take, where it has an estimate (an engine with
    time limits, Slurm, derives the allocation's from it)."""
    stop_at_step: int | None = None
    """Checkpoint and stop after this step, as if preempted (used by tests and benchmarks)."""

    def write(self, run_dir: Path) -> None:
        write_json_atomic(run_dir / LAUNCH_FILE, self.model_dump(mode="json", by_alias=True))

    @classmethod
    def read(cls, run_dir: Path) -> LaunchPlan:
        return cls.model_validate_json((run_dir / LAUNCH_FILE).read_text())


class AttemptResult(BaseModel):
    """What the runtime reports when it ends, as ``result.json``."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["completed", "cancelled", "failed"]
    failure: Literal["oom", "collective"] | None = None
    """A failure of the machine rather than of the job, which the restart policy may retry."""
    step: int = 0
    message: str | None = None
    hint: str | None = None
    checkpoint: str | None = None
    export_dir: str | None = None
    summary: dict[str, float] = {}
    lineage: dict[str, Any] = {}
    """Digests of the base model and data, the fine-tuning method and its settings."""


STORED_ONLY_MARKER = "stored-only"
"""In the agent's run folder, a checkpoint whose files only the artifact store holds (its nodes
wrote them there): the folder keeps its ``checkpoint.json`` and this marker, never its shards."""


def is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` is a complete checkpoint (of this Shipyard or an earlier one), or the
    agent's record of one in the store."""
    return any(
        (folder / name).is_file() for name in (CHECKPOINT_MARKER, CHECKPOINT_STATE_FILE, STORED_ONLY_MARKER)
    )


def is_stored_only(folder: Path) -> bool:
    return (folder / STORED_ONLY_MARKER).is_file()


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """The newest complete checkpoint in a ``checkpoints`` directory (see training/checkpoint.py):
    the one the ``latest`` pointer names, else the highest complete ``step_*`` directory."""
    pointer = checkpoints / CHECKPOINT_POINTER
    if pointer.is_file():
        candidate = checkpoints / pointer.read_text().strip()
        if is_checkpoint(candidate):
            return candidate
    complete = sorted(p for p in checkpoints.glob("step_*") if ".tmp" not in p.name and is_checkpoint(p))
    return complete[-1] if complete else None


def checkpoint_description(checkpoint: Path) -> dict[str, Any]:
    """What a checkpoint's ``checkpoint.json`` says (empty for an earlier Shipyard's or a torn one)."""
    try:
        found = json.loads((checkpoint / CHECKPOINT_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def checkpoint_step(checkpoint: Path) -> int:
    """The step a ``step_000123`` checkpoint folder was written at."""
    return int(checkpoint.name.removeprefix("step_"))
