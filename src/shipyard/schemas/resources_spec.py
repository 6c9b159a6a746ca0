"""The job spec's sections on where a job runs and how it survives: its resources (accelerator
types, devices or an elastic range of them, nodes), its checkpoints and its restart policy."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from shipyard.hardware.catalog import catalog, unknown_key_hint
from shipyard.schemas.spec_base import Section, Steps


class ResourcesSection(Section):
    """What the job runs on: the scheduler picks the listed type that is free and fastest."""

    accelerator: list[Annotated[str, Field(max_length=64)]] = Field(default=["cpu"], max_length=32)
    """One accelerator type or an any-of list in order of preference, e.g. ``[h100-sxm, a800, cpu]``."""
    devices: Annotated[int, Field(gt=0, le=1024)] = 1
    """Devices per node (one training process each); ``{min: 2, max: 8}`` makes the job elastic
    (read as ``devices: 8, min_devices: 2``)."""
    min_devices: Annotated[int, Field(gt=0, le=1024)] | None = None
    """Elastic: the fewest devices per node the job runs on. It is admitted and placed at this
    size and grows toward ``devices`` into devices nobody else needs, shrinking back when they
    are; each change is a restart from a checkpoint, and the global batch, data order and
    learning-rate schedule stay the spec's at every size. None: always ``devices``."""
    nodes: Annotated[int, Field(gt=0, le=100_000)] = 1
    """Machines of a cluster the job spans, each with ``devices`` devices, placed all at once;
    ``{min: 1, max: 4}`` makes the job elastic over nodes (read as ``nodes: 4, min_nodes: 1``)."""
    min_nodes: Annotated[int, Field(gt=0, le=100_000)] | None = None
    """Elastic: the fewest nodes the job runs on. With ``min_devices`` or alone, the job's size
    is its devices in all, from ``min_nodes`` x ``min_devices`` to ``nodes`` x ``devices``: the
    scheduler places a size on one node where it fits, else on whole nodes. None: always ``nodes``."""
    cpus_per_device: Annotated[int, Field(gt=0, le=4096)] | None = None
    """CPU threads per process; default: the node's cores shared evenly by a CPU job's processes."""
    min_memory_gib: Annotated[float, Field(gt=0, le=1 << 20)] | None = None
    """Memory each device must have, GiB (on the CPU, the host memory shared by its processes)."""

    @field_validator("accelerator", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _ranges(cls, value: Any) -> Any:
        """``devices: {min, max}`` as ``devices: max, min_devices: min``; ``nodes`` likewise."""
        if not isinstance(value, dict):
            return value
        for key in ("devices", "nodes"):
            if isinstance(value.get(key), dict):
                given = dict(value[key])
                if set(given) != {"min", "max"}:
                    raise ValueError(f"resources.{key} as a range takes min and max, not {sorted(given)}")
                value = {**value, key: given["max"], f"min_{key}": given["min"]}
        return value

    @model_validator(mode="after")
    def _range_in_order(self) -> Self:
        for key, fewest, most in (
            ("devices", self.min_devices, self.devices),
            ("nodes", self.min_nodes, self.nodes),
        ):
            if fewest is not None and fewest > most:
                raise ValueError(
                    f"resources.min_{key} {fewest} is more than {key} {most}; "
                    f"give the fewest {key} the job runs on, at most {key}"
                )
        return self

    @property
    def elastic(self) -> bool:
        return self.fewest_devices < self.devices or self.fewest_nodes < self.nodes

    @property
    def fewest_devices(self) -> int:
        """Devices per node at the job's smallest size (``devices`` unless elastic)."""
        return self.devices if self.min_devices is None else self.min_devices

    @property
    def fewest_nodes(self) -> int:
        """Nodes at the job's smallest size (``nodes`` unless elastic over nodes)."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    @field_validator("accelerator")
    @classmethod
    def _known_types(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one accelerator type")
        unknown = [v for v in value if v not in catalog()]
        if unknown:
            raise ValueError(
                f"unknown accelerator type {unknown[0]!r}; {unknown_key_hint(unknown[0], catalog())}"
            )
        return value


class CheckpointSection(Section):
    """Sharded checkpoints, written in the background: what restarts and ``--resume`` start from."""

    interval: Steps = 0
    """Steps between checkpoints; 0 checkpoints only at the end and when stopped."""
    keep: Annotated[int, Field(gt=0, le=1000)] = 2
    """How many recent checkpoints to keep on disk."""


RetriedFailure = Literal["signal", "lost", "node_lost", "collective", "hang", "oom", "error"]
RETRIED_FAILURES: tuple[RetriedFailure, ...] = ("signal", "lost", "node_lost", "collective", "hang", "oom")
"""Failures that are the machine's, not the job's: retried by default, whatever step they hit,
up to ``restarts.max``. An exception of the job's own (``error``) is retried only when listed,
and never twice at the same step: it would fail the same way again."""


class RestartsSection(Section):
    """What Shipyard does by itself when an attempt fails: each retry resumes from the job's
    newest checkpoint (in the run folder, else in the artifact store)."""

    max: Annotated[int, Field(ge=0, le=100)] = 3
    """Attempts started again after a failure, at most; 0 never retries."""
    backoff_s: Annotated[float, Field(ge=0, le=86_400)] = 10.0
    """Seconds before the first retry; doubled for each one after, up to an hour."""
    on: list[RetriedFailure] = Field(default=list(RETRIED_FAILURES), max_length=len(RETRIED_FAILURES) + 1)
    """Which failures are retried: ``signal`` (killed by a signal), ``lost`` (the process vanished
    while no agent watched), ``node_lost``, ``collective`` (an NCCL or gloo error), ``hang`` (no
    step for ``hang_factor`` median steps), ``oom`` (out of memory: retried with half the
    micro-batch and twice the gradient accumulation, so the global batch stays the same); these
    are the machine's, retried whatever step they hit. ``error`` (an exception of the job's own:
    a flaky read, a NaN check) is off by default, and given up when it recurs at the same step."""
    hang_factor: Annotated[float, Field(ge=2, le=10_000)] = 10.0
    """An attempt with no step for this many times its median step time is hung."""
    startup_grace_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    """Never call an attempt hung sooner than this after its start or its last step (loading the
    model, tokenizing data, writing a checkpoint or an eval all pause the steps)."""

    @model_validator(mode="after")
    def _can_retry(self) -> Self:
        if self.max == 0 and self.on:
            raise ValueError(
                f"max is 0, so the failures `on` lists ({', '.join(self.on)}) would never be retried; "
                "give max of 1 or more, or `on: []` to never retry"
            )
        return self
