"""The job spec: a typed, versioned YAML document (``apiVersion: shipyard/v1``).

Every section forbids unknown fields. ``parse_job_spec`` turns pydantic's errors into one
``InvalidSpec`` that names each bad field, the value given and what would be valid.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shipyard.errors import DatasetError, InvalidSpec
from shipyard.hardware.catalog import catalog
from shipyard.schemas.documents import load_mapping, validate_document
from shipyard.schemas.presets import PRESETS

API_VERSION = "shipyard/v1"

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ModelSection(_Section):
    preset: str | None = None
    """A built-in architecture (``llama-tiny``, ``llama-12m``, ... ``llama-7b``), trained from scratch."""
    path: str | None = None
    """A local Hugging Face-format directory (LLaMA architecture) to fine-tune."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown preset; valid presets: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of `preset` or `path`")
        return self


class TokenizerSection(_Section):
    vocab_size: PositiveInt = 4096
    """Size of the byte-level BPE vocabulary trained on the data (cached by content)."""
    path: str | None = None
    """A local Hugging Face tokenizer directory (holding tokenizer.json) instead of training one."""


STORE_SCHEME = "store:"
"""A data path ``store:NAME`` names an artifact of the job's project in the artifact store."""


class DataSection(_Section):
    paths: list[str] = Field(min_length=1)
    """Files, directories or globs (``corpus/**/*.txt``), or ``store:NAME`` artifacts (fetched,
    verified, into the node's cache before launch); ``.jsonl`` files are read as JSON lines."""

    def stored(self) -> list[str]:
        """Names of the artifacts among the paths."""
        return [p.removeprefix(STORE_SCHEME) for p in self.paths if p.startswith(STORE_SCHEME)]

    text_field: str = "text"
    """The field holding the text in JSONL records."""
    tokenizer: TokenizerSection = TokenizerSection()
    eval_fraction: Annotated[float, Field(gt=0, lt=0.5)] = 0.02
    """Share of the token stream held out for eval loss."""

    def files(self) -> list[Path]:
        """Expand files, directories and globs into a sorted list of files with some content."""
        found: set[Path] = set()
        for entry in self.paths:
            if entry.startswith(STORE_SCHEME):
                continue  # checked against the store's catalog at submit, fetched at launch
            matches = [Path(m) for m in glob.glob(os.path.expanduser(entry), recursive=True)]
            if not matches:
                raise _matches_nothing(entry)
            for match in matches:
                if match.is_dir():
                    found.update(p for p in match.rglob("*") if p.is_file())
                elif match.is_file():
                    found.add(match)
        files = sorted(found)
        if self.stored():
            return files
        if not any(f.stat().st_size for f in files):
            raise DatasetError(
                f"dataset {self.paths} is empty ({len(files)} files, 0 bytes)",
                hint="point data.paths at text or JSONL files with content",
            )
        return files

    def check_content(self) -> None:
        """What ``files`` checks (every path matches something, some file has content), stopping
        at the first file with content instead of listing them all: the check of every submission."""
        has_content = bool(self.stored())
        for entry in self.paths:
            if entry.startswith(STORE_SCHEME):
                continue
            matches = glob.iglob(os.path.expanduser(entry), recursive=True)
            first = next(matches, None)
            if first is None:
                raise _matches_nothing(entry)
            has_content = has_content or any(map(_has_content, itertools.chain([first], matches)))
        if not has_content:
            self.files()  # raises, saying what it found


def _matches_nothing(entry: str) -> DatasetError:
    return DatasetError(
        f"dataset path {entry!r} does not exist or matches no file",
        hint="fix data.paths; relative paths are taken from the job spec's folder",
    )


def _has_content(path: str) -> bool:
    """A file with at least one byte, or a folder holding one at any depth."""
    try:
        if not os.path.isdir(path):
            return os.path.getsize(path) > 0
        for folder, _, names in os.walk(path):
            if any(os.path.getsize(os.path.join(folder, name)) > 0 for name in names):
                return True
    except OSError:
        return False
    return False


class OptimizerSection(_Section):
    name: Literal["adamw"] = "adamw"
    lr: Annotated[float, Field(gt=0)] = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    eps: Annotated[float, Field(gt=0)] = 1e-8
    grad_clip: Annotated[float, Field(ge=0)] = 1.0
    """Max global gradient norm; 0 turns clipping off."""


class ScheduleSection(_Section):
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The LR at the last step, as a fraction of the peak LR."""


def total_steps(steps: int | None, tokens: int | None, global_batch_tokens: int) -> int:
    """Optimizer steps of a training section that gives either ``steps`` or ``tokens``."""
    if steps is not None:
        return steps
    assert tokens is not None
    return math.ceil(tokens / global_batch_tokens)


class TrainingSection(_Section):
    steps: PositiveInt | None = None
    """Optimizer steps; give this or ``tokens``."""
    tokens: PositiveInt | None = None
    """Tokens to train on; steps = ceil(tokens / global_batch_tokens)."""
    global_batch_tokens: PositiveInt = 16384
    """Tokens per optimizer step over all devices; gradient accumulation is derived from it."""
    micro_batch_size: PositiveInt = 8
    """Sequences per device per forward/backward."""
    seq_len: PositiveInt = 256
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """``auto`` picks bf16 autocast where the device supports it, else fp32."""
    seed: int = 0
    eval_interval: Annotated[int, Field(ge=0)] = 0
    """Steps between eval-loss measurements; 0 evaluates at the start and the end only."""
    eval_batches: PositiveInt = 8
    log_interval: PositiveInt = 1
    compile: bool = False
    """Wrap the model in ``torch.compile`` (slow first step, faster after)."""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """How several devices share the work: replicated (DDP) or sharded (FSDP2 ``fully_shard``)."""

    @model_validator(mode="after")
    def _length(self) -> Self:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of `steps` or `tokens`")
        tokens_per_micro = self.micro_batch_size * self.seq_len
        if self.global_batch_tokens % tokens_per_micro:
            raise ValueError(
                f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of "
                f"micro_batch_size × seq_len ({self.micro_batch_size} × {self.seq_len} = "
                f"{tokens_per_micro})"
            )
        return self

    @property
    def total_steps(self) -> int:
        return total_steps(self.steps, self.tokens, self.global_batch_tokens)

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each device, as llm.c derives it."""
        tokens_per_fwdbwd = self.micro_batch_size * self.seq_len * world_size
        if self.global_batch_tokens % tokens_per_fwdbwd:
            raise InvalidSpec(
                f"training.global_batch_tokens ({self.global_batch_tokens}) is not a multiple of "
                f"micro_batch_size × seq_len × devices ({self.micro_batch_size} × {self.seq_len} × "
                f"{world_size} = {tokens_per_fwdbwd})",
                hint="change global_batch_tokens, micro_batch_size or resources.devices so it divides",
            )
        return self.global_batch_tokens // tokens_per_fwdbwd


class ResourcesSection(_Section):
    accelerator: list[str] = ["cpu"]
    """One accelerator type or an any-of list in order of preference, e.g. ``[h100-sxm, a800, cpu]``."""
    devices: PositiveInt = 1
    """Devices per node (one training process each)."""
    nodes: PositiveInt = 1
    cpus_per_device: PositiveInt | None = None
    """CPU threads per process; default: the node's cores shared evenly by a CPU job's processes."""
    min_memory_gib: PositiveFloat | None = None
    """Memory each device must have, GiB (on the CPU, the host memory shared by its processes)."""

    @field_validator("accelerator", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("accelerator")
    @classmethod
    def _known_types(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one accelerator type")
        unknown = [v for v in value if v not in catalog()]
        if unknown:
            raise ValueError(f"unknown accelerator type {', '.join(unknown)}; valid: {', '.join(catalog())}")
        return value


class CheckpointSection(_Section):
    interval: Annotated[int, Field(ge=0)] = 0
    """Steps between checkpoints; 0 checkpoints only at the end and when stopped."""
    keep: PositiveInt = 2
    """How many recent checkpoints to keep on disk."""


class JobSpec(_Section):
    api_version: Literal["shipyard/v1"] = Field("shipyard/v1", alias="apiVersion")
    kind: Literal["TrainingJob"] = "TrainingJob"
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    """Lower-case letters, digits and dashes; model versions are registered under this name."""
    project: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")] = "default"
    model: ModelSection
    data: DataSection
    training: TrainingSection
    resources: ResourcesSection = ResourcesSection()
    checkpoint: CheckpointSection = CheckpointSection()
    priority: int = 0
    queue: str = "default"


def parse_job_spec(text: str, *, source: str = "job spec") -> JobSpec:
    """Parse YAML text into a ``JobSpec``; every problem becomes one ``InvalidSpec``."""
    document = load_mapping(
        text,
        source=source,
        expected="a YAML mapping with `name`, `model`, `data` and `training`",
        hint="see examples/ for a complete job spec",
    )
    return validate_job_spec(document, source=source)


def validate_job_spec(document: dict[str, Any], *, source: str = "job spec") -> JobSpec:
    return validate_document(
        JobSpec,
        document,
        source=source,
        hint="fix the fields named above (`shipyard jobs submit --help` explains the spec)",
    )
