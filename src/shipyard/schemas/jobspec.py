"""The job spec: a typed, versioned YAML document (``apiVersion: shipyard/v1``).

Every section forbids unknown fields, takes each value as the type it is (``steps: true`` is no
step count) and bounds every string, list and number, so a spec can neither overflow a database
column nor drive a terminal. ``parse_job_spec`` turns pydantic's errors into one ``InvalidSpec``
that names each bad field, the value given and what would be valid.
"""

from __future__ import annotations

import string
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from shipyard.domain.text import DNS_LABEL, has_control_character
from shipyard.hardware.catalog import catalog, unknown_key_hint
from shipyard.schemas import layout
from shipyard.schemas.documents import PATTERN_WORDS, load_mapping, validate_document
from shipyard.schemas.presets import PRESETS
from shipyard.schemas.queues import QUEUE_NAME_PATTERN

API_VERSION = "shipyard/v1"
SPEC_HINT = "`shipyard spec` lists every field; `shipyard spec example pretrain` writes a starter"
"""Where every hint about the spec points: the reference generated from these models."""

MAX_STEPS = 10**9
"""Optimizer steps of one job: far beyond any real run, well inside a 64-bit counter."""
MAX_TOKENS = 10**15
"""A quadrillion tokens: 60 times Llama 3's 15 T."""
INT32 = 2**31 - 1
MAX_PATH = 4096
"""Linux's PATH_MAX."""

Steps = Annotated[int, Field(ge=0, le=MAX_STEPS)]


def _no_control_characters(value: str) -> str:
    if has_control_character(value):
        raise ValueError("holds a control character (an escape, a newline, ...)")
    return value


FieldName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_no_control_characters)]
PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_no_control_characters)]
Label = Annotated[str, Field(pattern=DNS_LABEL)]


class _Section(BaseModel):
    # strict: a YAML `true` is no step count and "8" is no batch size; numbers are finite.
    # Each field's docstring is its description: `shipyard spec` prints them.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )


STORE_SCHEME = "store:"
"""A data or model path ``store:NAME`` names an artifact of the job's project in the artifact store."""
MODEL_REF_PATTERN = (
    r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?/)?[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(:[0-9]{1,9})?$"
)
"""``[PROJECT/]NAME[:VERSION]`` of a registered model (projects and names are DNS labels)."""
PATTERN_WORDS[MODEL_REF_PATTERN] = (
    "[PROJECT/]NAME[:VERSION] of a registered model, the job's project's when none is named "
    "(`shipyard models list`)"
)


class ModelSection(_Section):
    preset: str | None = Field(default=None, max_length=64)
    """A built-in architecture (``llama-tiny``, ``llama-12m``, ... ``llama-7b``), trained from scratch."""
    path: PathText | None = None
    """A local Hugging Face-format folder of a causal language model (Llama, Qwen2, Mistral,
    Gemma, Phi, ...) to fine-tune, with its own tokenizer; or ``store:NAME``, such a folder in the
    project's artifact store (fetched, verified, into the node's cache). See ``finetune``."""
    version: Annotated[str, Field(pattern=MODEL_REF_PATTERN)] | None = None
    """A registered model version to fine-tune further, ``[PROJECT/]NAME:VERSION`` (``NAME`` alone:
    its newest, pinned at submit; no project: the job's own). A version of adapters is read
    through its merged export."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown preset; valid presets: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if [self.preset, self.path, self.version].count(None) != 2:
            raise ValueError("give exactly one of `preset`, `path` or `version`")
        return self

    @property
    def pretrained(self) -> bool:
        """Whether the job starts from an existing model (a folder, a stored one, a version)."""
        return self.preset is None

    @property
    def local_path(self) -> str | None:
        """``path`` when it names a folder on this machine (not the artifact store)."""
        return None if self.path is None or self.path.startswith(STORE_SCHEME) else self.path


class TokenizerSection(_Section):
    """The tokenizer of a model trained from scratch."""

    vocab_size: Annotated[int, Field(ge=256, le=1 << 20)] = 4096
    """Size of the byte-level BPE vocabulary trained on the data (cached by content); at least the
    256 byte tokens."""
    path: PathText | None = None
    """A local Hugging Face tokenizer directory (holding tokenizer.json) instead of training one."""


_ALPACA_HEAD = "Below is an instruction that describes a task{}. Write a response that appropriately " + (
    "completes the request."
)
PROMPT_TEMPLATES = {
    "plain": ("{prompt}\n\n{input}\n\n", "{prompt}\n\n"),
    "alpaca": (
        _ALPACA_HEAD.format(", paired with an input that provides further context")
        + "\n\n### Instruction:\n{prompt}\n\n### Input:\n{input}\n\n### Response:\n",
        _ALPACA_HEAD.format("") + "\n\n### Instruction:\n{prompt}\n\n### Response:\n",
    ),
}
"""Named prompt layouts: (with an input, without one)."""


class InstructionFields(_Section):
    """Where an instruction record keeps its parts: ``{prompt, response}`` by default; Alpaca's
    files are ``{prompt: instruction, input: input, response: output}``."""

    prompt: FieldName = "prompt"
    """The field holding the prompt (the instruction)."""
    response: FieldName = "response"
    """The field holding the answer the model learns to give."""
    input: FieldName | None = None
    """An optional field appended to the prompt (Alpaca's ``input``); absent or empty is fine."""
    template: Annotated[str, Field(min_length=1, max_length=4096)] = "plain"
    """How the model reads the prompt: ``plain`` (the prompt, a blank line, the input when there
    is one, a blank line), ``alpaca`` (Stanford Alpaca's template), or your own text holding
    ``{prompt}`` and, where records have an input, ``{input}`` (write other braces twice)."""

    @model_validator(mode="after")
    def _known_template(self) -> Self:
        if self.template in PROMPT_TEMPLATES:
            return self
        try:
            named = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        except ValueError as exc:
            raise ValueError(
                f"template is not a format text ({exc}): write literal braces as {{{{ }}}}"
            ) from None
        if "prompt" not in named or not named <= {"prompt", "input"}:
            raise ValueError(
                f"template must hold {{prompt}} (and may hold {{input}}), not {sorted(named)}; "
                f"or name one of: {', '.join(PROMPT_TEMPLATES)}"
            )
        if self.input and "input" not in named:
            raise ValueError(
                "template has no {input} although data.fields.input is set: the input would be lost"
            )
        return self

    def layout(self, prompt: str, extra: str | None) -> str:
        """The prompt as the model reads it."""
        if self.template in PROMPT_TEMPLATES:
            with_input, alone = PROMPT_TEMPLATES[self.template]
            return with_input.format(prompt=prompt, input=extra) if extra else alone.format(prompt=prompt)
        return self.template.format(prompt=prompt, input=extra or "")


DataFormat = Literal["text", "instruction", "chat", "preference"]


class DataSection(_Section):
    paths: list[PathText] = Field(min_length=1, max_length=1000)
    """Files, directories or globs (``corpus/**/*.txt``), or ``store:NAME`` artifacts (fetched,
    verified, into the node's cache before launch); ``.jsonl`` files are read as JSON lines."""

    def stored(self) -> list[str]:
        """Names of the artifacts among the paths."""
        return [p.removeprefix(STORE_SCHEME) for p in self.paths if p.startswith(STORE_SCHEME)]

    format: DataFormat = "text"
    """``text``: plain text or JSONL ``text_field`` records, a stream of tokens. ``instruction``:
    JSONL records with a prompt and a response (see ``fields``). ``chat``: JSONL records with a
    list of ``{role, content}`` messages, rendered with the model's chat template. ``preference``:
    JSONL pairs for ``finetune.method: dpo``, ``{prompt, chosen, rejected}`` as text, or as
    message lists (``chosen``/``rejected`` the assistant's turns, ``prompt`` optional)."""
    text_field: FieldName = "text"
    """The field holding the text in JSONL records."""
    fields: InstructionFields = InstructionFields()
    """The fields of an ``instruction`` record."""
    messages_field: FieldName = "messages"
    """The field holding the message list of a ``chat`` record."""
    mask_prompt: bool = True
    """``instruction`` and ``chat``: train on the responses only (prompt tokens carry no loss)."""
    packing: bool = True
    """``instruction`` and ``chat``: pack several whole samples into each sequence, attention never
    crossing from one into another; false pads each sample to ``seq_len`` instead."""
    tokenizer: TokenizerSection = TokenizerSection()
    """A byte-level BPE tokenizer trained on the data (cached by content), or a local one; a
    ``model.path`` brings its own."""
    eval_fraction: Annotated[float, Field(gt=0, lt=0.5)] = 0.02
    """Share of the token stream held out for eval loss."""

    def local(self) -> list[str]:
        """The paths that are not artifacts of the store."""
        return [p for p in self.paths if not p.startswith(STORE_SCHEME)]


class OptimizerSection(_Section):
    """The optimizer and its settings."""

    name: Literal["adamw"] = "adamw"
    """AdamW (decoupled weight decay, Loshchilov and Hutter 2019), fused where the device has it."""
    lr: Annotated[float, Field(gt=0, le=10)] = 3e-4
    """The peak learning rate, reached after the warmup."""
    betas: Annotated[tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]],
                     Field(strict=False)] = (0.9, 0.95)  # fmt: skip
    """Adam's decay rates of the first and second moments: a YAML list of two numbers in [0, 1)."""
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.1
    """Decoupled weight decay of the matrices (norms and embeddings are not decayed)."""
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-8
    """Added to Adam's denominator, for numerical stability."""
    grad_clip: Annotated[float, Field(ge=0, le=1e6)] = 1.0
    """Max global gradient norm; 0 turns clipping off."""
    state_dtype: Literal["fp32", "bf16"] = "fp32"
    """Adam's moments: ``bf16`` halves their memory (4 bytes per parameter instead of 8); the
    weights' master copy stays fp32."""


class ScheduleSection(_Section):
    """The learning rate over the run: a linear warmup, then a decay to ``min_lr_ratio``."""

    warmup_steps: Steps = 0
    """Steps of linear warmup from 0 to the peak LR."""
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    """How the LR falls from the peak after the warmup."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The LR at the last step, as a fraction of the peak LR."""


PARALLELISM_SHORTHANDS: dict[str, dict[str, int]] = {
    "ddp": {"tp": 1, "dp_shard": 1, "dp_replicate": -1},
    "fsdp": {"tp": 1, "dp_shard": -1, "dp_replicate": 1},
    "auto": {},
}
"""What ``parallelism: ddp`` (or ``fsdp``, ``auto``) stands for."""

Degree = Annotated[int, Field(ge=1, le=100_000)]
Rest = Annotated[int, Field(ge=-1, le=100_000)]


class ParallelismSection(_Section):
    """A job's devices as a mesh, in torchtitan's order: tensor parallel inside a node, FSDP2
    shards over groups of ``tp`` devices, replicas of those shards outermost. A degree left out is
    the planner's choice; ``-1`` takes the devices the others leave."""

    tp: Degree | None = None
    """Tensor-parallel degree: each layer's weights split over this many devices of one node
    (DTensor, with sequence parallelism for the norms). Divides the attention and key/value heads."""
    dp_shard: Rest | None = None
    """FSDP2 degree: weights, gradients and optimizer state sharded over this many groups."""
    dp_replicate: Rest | None = None
    """Replicas: plain DDP when nothing is sharded, else HSDP (each replica sharded dp_shard ways)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in PARALLELISM_SHORTHANDS:
                raise ValueError(
                    f"unknown parallelism {value!r}; valid: {', '.join(PARALLELISM_SHORTHANDS)}, "
                    "or a mapping {tp, dp_shard, dp_replicate}"
                )
            return PARALLELISM_SHORTHANDS[value]
        return value

    @model_validator(mode="after")
    def _one_rest(self) -> Self:
        if [self.dp_shard, self.dp_replicate].count(-1) > 1:
            raise ValueError("only one of dp_shard and dp_replicate may be -1 (the devices left over)")
        return self

    @property
    def chosen(self) -> bool:
        """Whether every degree is given (nothing is left to the planner)."""
        return None not in (self.tp, self.dp_shard, self.dp_replicate)

    def resolved(self, world: int) -> ParallelismSection:
        """Every degree a number, their product ``world`` (``layout.resolve_degrees``)."""
        tp, shard, replicate = layout.resolve_degrees(self.tp, self.dp_shard, self.dp_replicate, world)
        return ParallelismSection(tp=tp, dp_shard=shard, dp_replicate=replicate)

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded (FSDP2 or tensor parallel): not a plain replica each."""
        return (self.tp or 1) > 1 or (self.dp_shard or 1) > 1

    def describe(self) -> str:
        return f"tp={self.tp}, dp_shard={self.dp_shard}, dp_replicate={self.dp_replicate}"


CheckpointingMode = Literal["auto", "none", "selective", "full"]


class ActivationCheckpointingSection(_Section):
    """Which activations the backward pass recomputes instead of reading back from memory."""

    mode: CheckpointingMode = "auto"
    """``none`` keeps everything; ``selective`` recomputes the attention of each block (or every
    k-th block whole, see ``selective``); ``full`` recomputes every block from its input (the least
    memory, about a third more compute); ``auto``: the planner's choice for the job's devices."""
    selective: Literal["attention", "blocks"] = "attention"
    """What ``mode: selective`` recomputes: each block's attention, or every ``every``-th block whole."""
    every: Annotated[int, Field(ge=2, le=1024)] = 2
    """``selective: blocks``: recompute one block in this many."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value


COMPILING_VENDORS = ("nvidia", "amd", "generic")
"""Where Inductor compiles (CUDA/ROCm through Triton, CPUs through C++); Apple's MPS backend is a
prototype and Gaudi needs Habana's own."""


class EarlyStoppingSection(_Section):
    """Stop when the eval loss has stopped improving, and export the best model seen."""

    patience: Annotated[int, Field(gt=0, le=10_000)]
    """Evals in a row without improvement after which the job stops."""
    min_delta: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    """How much lower than the best so far an eval loss must be to count as an improvement."""


class TrainingSection(_Section):
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS)] | None = None
    """Optimizer steps; give this or ``tokens``."""
    tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    """Tokens to train on; steps = ceil(tokens / global_batch_tokens)."""
    global_batch_tokens: Annotated[int, Field(gt=0, le=1 << 30)] = 16384
    """Tokens per optimizer step over all devices; gradient accumulation is derived from it."""
    micro_batch_size: Annotated[int, Field(gt=0, le=1 << 16)] = 8
    """Sequences per device per forward/backward."""
    seq_len: Annotated[int, Field(gt=0, le=1 << 20)] = 256
    """Tokens per training sequence (the context the model learns to use)."""
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """``auto`` picks bf16 autocast where the device supports it, else fp32."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seeds the weights, the data order and dropout: the same seed trains the same model."""
    eval_interval: Steps = 0
    """Steps between eval-loss measurements; 0 evaluates at the start and the end only."""
    eval_batches: Annotated[int, Field(gt=0, le=1 << 20)] = 8
    """Micro-batches of held-out data per eval-loss measurement."""
    early_stopping: EarlyStoppingSection | None = None
    """``{patience: K}``: stop once K evals in a row did not improve on the best eval loss, and
    export the checkpoint of the best one (needs ``eval_interval``)."""
    log_interval: Annotated[int, Field(gt=0, le=MAX_STEPS)] = 1
    """Steps between metric records (loss, tokens/s, MFU, memory)."""
    compile: bool | Literal["auto"] = "auto"
    """``torch.compile`` each transformer block: ``auto`` does on NVIDIA and AMD GPUs, where it
    pays (a slower first step, faster ones after); ``true`` anywhere Inductor runs (GPUs, CPUs)."""
    parallelism: ParallelismSection = ParallelismSection()
    """How several devices share the work: ``ddp``, ``fsdp``, or ``{tp, dp_shard, dp_replicate}``;
    what is left out, the planner chooses."""
    activation_checkpointing: ActivationCheckpointingSection = ActivationCheckpointingSection()
    """Recompute activations in the backward pass instead of keeping them: ``none``,
    ``selective`` or ``full``; ``auto`` (the default) takes the planner's choice."""

    @model_validator(mode="after")
    def _length(self) -> Self:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of `steps` or `tokens`")
        if self.early_stopping is not None and not self.eval_interval:
            raise ValueError(
                "early_stopping watches the eval loss, which eval_interval 0 measures only at the "
                "start and the end; set eval_interval (steps between evals)"
            )
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
        return layout.total_steps(self.steps, self.tokens, self.global_batch_tokens)

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each device, as llm.c derives it."""
        return layout.grad_accum_steps(
            self.global_batch_tokens, self.micro_batch_size, self.seq_len, world_size
        )


class ResourcesSection(_Section):
    """What the job runs on: the scheduler picks the listed type that is free and fastest."""

    accelerator: list[Annotated[str, Field(max_length=64)]] = Field(default=["cpu"], max_length=32)
    """One accelerator type or an any-of list in order of preference, e.g. ``[h100-sxm, a800, cpu]``."""
    devices: Annotated[int, Field(gt=0, le=1024)] = 1
    """Devices per node (one training process each)."""
    nodes: Annotated[int, Field(gt=0, le=100_000)] = 1
    """Machines of a cluster the job spans, each with ``devices`` devices, placed all at once."""
    cpus_per_device: Annotated[int, Field(gt=0, le=4096)] | None = None
    """CPU threads per process; default: the node's cores shared evenly by a CPU job's processes."""
    min_memory_gib: Annotated[float, Field(gt=0, le=1 << 20)] | None = None
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
            raise ValueError(
                f"unknown accelerator type {unknown[0]!r}; {unknown_key_hint(unknown[0], catalog())}"
            )
        return value


class LoraSection(_Section):
    """Low-rank adapters (Hu et al. 2021)."""

    rank: Annotated[int, Field(gt=0, le=4096)] = 16
    """The adapters' rank r: trainable parameters grow with it."""
    alpha: Annotated[int, Field(gt=0, le=1 << 20)] = 32
    """The scale of the adapters' update is alpha / rank."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the adapters' input."""
    target_modules: list[FieldName] | None = Field(default=None, min_length=1, max_length=64)
    """Names of the linear layers that get adapters; default: every attention and MLP projection
    of the model's family (``q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj`` for
    Llama, Qwen2, Mistral and Gemma)."""
    dora: bool = False
    """Weight-decomposed adapters (DoRA, Liu et al. 2024): a learned magnitude per output."""


FinetuneMethod = Literal["full", "lora", "qlora", "dpo"]
TrainedWeights = Literal["full", "lora", "qlora"]
PreferenceLoss = Literal["sigmoid", "ipo", "simpo"]


class DpoSection(_Section):
    """Preference tuning on ``{prompt, chosen, rejected}`` pairs (``data.format: preference``)."""

    weights: TrainedWeights = "lora"
    """What is trained: ``lora`` adapters (the reference is the base with them switched off, as
    TRL does, with no second copy in memory), ``qlora``, or ``full`` (with a frozen copy of the
    starting weights as the reference)."""
    beta: Annotated[float, Field(gt=0, le=100)] = 0.1
    """How far the policy may move from the reference (DPO's β; IPO's τ)."""
    loss: PreferenceLoss = "sigmoid"
    """``sigmoid``: DPO (Rafailov et al. 2023); ``ipo``: IPO's squared loss on per-token log
    ratios (Azar et al. 2023, as TRL computes it); ``simpo``: SimPO's reference-free loss on
    length-normalized log-likelihoods with a margin (Meng et al. 2024), which loads no reference."""
    simpo_gamma: Annotated[float, Field(ge=0, le=100)] = 0.5
    """``simpo``: the target margin γ between chosen and rejected rewards."""


class FinetuneSection(_Section):
    """How an existing model is adapted."""

    method: FinetuneMethod = "lora"
    """``full`` trains every weight; ``lora`` trains low-rank adapters beside frozen weights;
    ``qlora`` does so over 4-bit NF4 weights (bitsandbytes, NVIDIA GPUs); ``dpo`` tunes on
    preference pairs, training what ``dpo.weights`` says."""
    dpo: DpoSection = DpoSection()
    """``dpo``: the weights it trains, β and the loss."""
    lora: LoraSection = LoraSection()
    """The adapters of ``lora`` and ``qlora``."""
    gradient_checkpointing: bool = False
    """The older spelling of ``training.activation_checkpointing: full``."""
    merge: bool = False
    """``lora``/``qlora``: also export the base model with the adapters merged in (``export/merged``)."""


class CheckpointSection(_Section):
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


class RestartsSection(_Section):
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


class JobSpec(_Section):
    api_version: Literal["shipyard/v1"] = Field("shipyard/v1", alias="apiVersion")
    """The spec's version: a later Shipyard reads a ``shipyard/v1`` spec the same way."""
    kind: Literal["TrainingJob"] = "TrainingJob"
    """What the document describes."""
    name: Label
    """Lower-case letters, digits and dashes; model versions are registered under this name."""
    project: Label = "default"
    """The project the job, its artifacts and its models belong to; your role in it decides what
    you may do."""
    model: ModelSection
    """The model: a preset trained from scratch, a local folder, or a registered version."""
    finetune: FinetuneSection | None = None
    """How a ``model.path`` is fine-tuned; without it, every weight is trained (``method: full``)."""
    data: DataSection
    """What the job trains on."""
    training: TrainingSection
    """How long and how: steps or tokens, batch, optimizer, precision, parallelism."""
    resources: ResourcesSection = ResourcesSection()
    checkpoint: CheckpointSection = CheckpointSection()
    restarts: RestartsSection = RestartsSection()
    """Retries after failures that are not the job's own, with out-of-memory recovery."""
    priority: Annotated[int, Field(ge=-INT32 - 1, le=INT32)] = 0
    """Higher runs first within a queue (a 32-bit integer)."""
    queue: Annotated[str, Field(pattern=QUEUE_NAME_PATTERN)] = "default"
    """The local queue the job waits in; its cluster queue's quota admits it (`shipyard queues`)."""

    @model_validator(mode="after")
    def _finetune_needs_a_model(self) -> Self:
        if self.finetune is not None and not self.model.pretrained:
            raise ValueError("`finetune` adapts an existing model: give `model.path`, not a preset")
        if (self.method == "dpo") != (self.data.format == "preference"):
            raise ValueError(
                f"finetune.method {self.method!r} with data.format {self.data.format!r}: preference "
                "pairs train with finetune.method dpo, and dpo trains on them; give both or neither"
            )
        if self.data.format != "text" and not self.model.pretrained:
            raise ValueError(
                f"data.format {self.data.format!r} fine-tunes an existing model: give `model.path`"
            )
        return self

    @model_validator(mode="after")
    def _layout_fits_the_devices(self) -> Self:
        p, r = self.training.parallelism, self.resources
        if p.tp is not None and r.devices % p.tp:
            valid = [d for d in range(1, r.devices + 1) if r.devices % d == 0]
            raise ValueError(
                f"training.parallelism.tp {p.tp} does not divide resources.devices {r.devices} "
                f"(tensor parallelism stays inside a node); valid: {', '.join(map(str, valid))}"
            )
        if p.chosen:
            p.resolved(r.devices * r.nodes)  # raises with the product and the fix
        if self.training.compile is True:
            known = catalog()
            blocked = [a for a in r.accelerator if known[a].vendor not in COMPILING_VENDORS]
            if blocked:
                raise ValueError(
                    f"training.compile true, but torch.compile does not run on {', '.join(blocked)}; "
                    "valid: auto (compiles where it can), false, or true with other accelerator types"
                )
        gradient_checkpointing = self.finetune is not None and self.finetune.gradient_checkpointing
        if gradient_checkpointing and self.training.activation_checkpointing.mode not in ("auto", "full"):
            raise ValueError(
                "finetune.gradient_checkpointing true asks for activation_checkpointing full, but "
                f"training.activation_checkpointing.mode is {self.training.activation_checkpointing.mode!r}; "
                "give one of them"
            )
        return self

    @property
    def activation_checkpointing(self) -> ActivationCheckpointingSection:
        """``training.activation_checkpointing``, with ``finetune.gradient_checkpointing`` (its
        older spelling) read as ``full``."""
        section = self.training.activation_checkpointing
        if section.mode == "auto" and self.finetune is not None and self.finetune.gradient_checkpointing:
            return section.model_copy(update={"mode": "full"})
        return section

    @property
    def method(self) -> FinetuneMethod | None:
        """How the model is trained: None pre-trains a preset from scratch."""
        if not self.model.pretrained:
            return None
        return self.finetune.method if self.finetune else "full"

    @property
    def weights(self) -> TrainedWeights | None:
        """What training changes: every weight (``full``), or adapters beside frozen (``lora``) or
        4-bit (``qlora``) ones; None pre-trains. DPO trains what ``finetune.dpo.weights`` says."""
        method = self.method
        if method == "dpo" and self.finetune is not None:
            return self.finetune.dpo.weights
        return None if method is None or method == "dpo" else method

    @property
    def adapters(self) -> bool:
        """Whether training changes adapters only: checkpoints then hold them alone."""
        return self.weights in ("lora", "qlora")


def stored_job_spec(document: dict[str, Any]) -> JobSpec:
    """A spec as the platform stored it, after ``validate_job_spec`` accepted it at submit:
    validated again, but not measured for depth and size (this is on every read of a job)."""
    return JobSpec.model_validate(document)


def parse_job_spec(text: str, *, source: str = "job spec") -> JobSpec:
    """Parse YAML text into a ``JobSpec``; every problem becomes one ``InvalidSpec``."""
    document = load_mapping(
        text,
        source=source,
        expected="a YAML mapping with `name`, `model`, `data` and `training`",
        hint=SPEC_HINT,
    )
    return validate_job_spec(document, source=source)


def validate_job_spec(document: dict[str, Any], *, source: str = "job spec") -> JobSpec:
    return validate_document(
        JobSpec,
        document,
        source=source,
        hint=f"fix the fields named above; {SPEC_HINT}",
    )
