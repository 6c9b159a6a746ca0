"""The job spec: a typed, versioned YAML document (``apiVersion: shipyard/v1``).

Every section forbids unknown fields, takes each value as the type it is (``steps: true`` is no
step count) and bounds every string, list and number, so a spec can neither overflow a database
column nor drive a terminal. ``parse_job_spec`` turns pydantic's errors into one ``InvalidSpec``
that names each bad field, the value given and what would be valid.
"""

from __future__ import annotations

import string
from typing import Annotated, Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import catalog
from shipyard.schemas import layout
from shipyard.schemas.documents import PATTERN_WORDS, load_mapping, validate_document
from shipyard.schemas.finetune_spec import (
    FinetuneMethod,
    FinetuneSection,
    TrainedWeights,
)
from shipyard.schemas.presets import PRESETS
from shipyard.schemas.queues import QUEUE_NAME_PATTERN
from shipyard.schemas.resources_spec import CheckpointSection, ResourcesSection, RestartsSection
from shipyard.schemas.spec_base import (
    INT32,
    SPEC_HINT,
    FieldName,
    Label,
    PathText,
    Section,
)
from shipyard.schemas.training_spec import (
    COMPILING_VENDORS,
    ActivationCheckpointingSection,
    ParallelismSection,
    TrainingSection,
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


class ModelSection(Section):
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


class TokenizerSection(Section):
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


class InstructionFields(Section):
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


class DataSection(Section):
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


class JobSpec(Section):
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
        if r.elastic and len(self.elastic_layouts) < 2:
            raise ValueError(
                f"resources {_range_words(r)}: no two sizes in that range split the step's "
                f"{self.training.global_batch_tokens // self.training.seq_len} samples evenly over their "
                "data-parallel ranks; widen the range or pick a global_batch_tokens with more divisors"
            )
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
    def elastic_layouts(self) -> list[tuple[int, int]]:
        """The (nodes, devices per node) the job may run on, one per size in all, smallest first:
        the spec's alone, or for an elastic job every size in its ranges that keeps the global
        batch whole (on the fewest nodes that give it)."""
        r, t = self.resources, self.training
        if not r.elastic:
            return [(r.nodes, r.devices)]
        layouts = layout.elastic_sizes(
            (r.fewest_devices, r.devices),
            (r.fewest_nodes, r.nodes),
            t.parallelism.tp or 1,
            t.global_batch_tokens // t.seq_len,
        )
        return [(n, d) for n, d in layouts if not t.parallelism.chosen or _resolves(t.parallelism, n * d)]

    def sized(self, nodes: int, devices: int) -> JobSpec:
        """The spec of an attempt on ``nodes`` of ``devices`` each: that layout, and a micro-batch
        that divides each rank's share of the step's samples (the global batch unchanged)."""
        r, t = self.resources, self.training
        if (nodes, devices) == (r.nodes, r.devices) and not r.elastic:
            return self
        ranks = devices * nodes // (t.parallelism.tp or 1)
        micro = layout.micro_batch_for(t.global_batch_tokens // t.seq_len // ranks, t.micro_batch_size)
        resources = {"devices": devices, "min_devices": None, "nodes": nodes, "min_nodes": None}
        return self.model_copy(
            update={
                "resources": r.model_copy(update=resources),
                "training": t.model_copy(update={"micro_batch_size": micro}),
            }
        )

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


def _range_words(resources: ResourcesSection) -> str:
    """An elastic job's ranges as the spec gives them."""
    r = resources
    return ", ".join(
        f"{key} {{min: {fewest}, max: {most}}}" if given is not None else f"{key} {most}"
        for key, given, fewest, most in (
            ("devices", r.min_devices, r.fewest_devices, r.devices),
            ("nodes", r.min_nodes, r.fewest_nodes, r.nodes),
        )
    )


def _resolves(parallelism: ParallelismSection, world: int) -> bool:
    """Whether the degrees the spec gives multiply to ``world`` (a -1 taking the rest)."""
    try:
        parallelism.resolved(world)
    except InvalidSpec:
        return False
    return True
