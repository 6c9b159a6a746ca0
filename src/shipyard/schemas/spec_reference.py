"""The job spec's reference, read off the pydantic models that validate it, so it cannot drift
from what ``jobs submit`` accepts: every section and field with its type, default, valid values
and why it is there (the field's own docstring).

``shipyard spec`` prints it; ``shipyard spec example`` writes the starters in ``starters/``.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import catalog
from shipyard.schemas.documents import PATTERN_WORDS
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.presets import PRESETS
from shipyard.schemas.training_spec import PARALLELISM_SHORTHANDS

VALUES_FROM: dict[str, Callable[[], list[str]]] = {
    "model.preset": lambda: list(PRESETS),
    "resources.accelerator": lambda: list(catalog()),
}
"""Fields whose valid values a validator checks against a table rather than a type."""

SHORTHANDS: dict[str, str] = {
    "training.parallelism": ", ".join(PARALLELISM_SHORTHANDS),
    "training.activation_checkpointing": "none, selective, full, auto",
    "resources.accelerator": "a single type instead of a list",
}
"""Sections that also take a plain value in place of the mapping."""


@dataclass(frozen=True)
class FieldDoc:
    path: str
    """``training.optimizer.lr``: where the field sits in the YAML document."""
    type: str
    """``integer``, ``number``, ``string``, ``boolean``, ``list of string``, ``section``, ..."""
    required: bool
    default: str | None
    """The default as YAML would write it; None when required or a section of defaults."""
    valid: str
    """Bounds or allowed values in words ("> 0 and <= 10", "one of: cosine, linear")."""
    why: str

    @property
    def section(self) -> bool:
        return self.type.startswith("section")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "type": self.type,
            "required": self.required,
            "default": self.default,
            "valid": self.valid,
            "description": self.why,
        }


def reference(model: type[BaseModel] = JobSpec) -> list[FieldDoc]:
    """Every field of ``model`` and its sections, depth first, in the order a spec writes them."""
    return list(_walk(model, ""))


def markdown(docs: list[FieldDoc]) -> str:
    """The reference as a Markdown page (``docs/spec-reference.md`` is this, generated): one
    table per section, the section's description above it."""
    about = {d.path: d.why for d in docs if d.section}
    out = [
        "# Job spec reference",
        "",
        "Generated from the spec's own models (`shipyard spec` prints the same); do not edit by hand:",
        "`SHIPYARD_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_spec_reference.py` writes it again.",
    ]
    grouped: dict[str, list[FieldDoc]] = {}  # by section, in the order a spec first meets them
    for doc in docs:
        if not doc.section:
            grouped.setdefault(doc.path.rpartition(".")[0], []).append(doc)
    for section, fields in grouped.items():
        out += ["", f"## `{section}`" if section else "## Top level", ""]
        out += [about[section], ""] if about.get(section) else []
        out += ["| field | type | default | valid | what it is |", "|---|---|---|---|---|"]
        for doc in fields:
            default = "required" if doc.required else ("" if doc.default is None else f"`{doc.default}`")
            cells = [f"`{doc.path}`", doc.type, default, doc.valid, doc.why]
            out.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(out) + "\n"


def sections(docs: list[FieldDoc]) -> list[str]:
    return [d.path for d in docs if d.section]


def select(docs: list[FieldDoc], section: str | None) -> list[FieldDoc]:
    """The fields under ``section`` (``training`` or ``training.optimizer``), the section first."""
    if section is None:
        return docs
    known = sections(docs)
    if section not in known:
        raise InvalidSpec(
            f"the job spec has no section {section!r}",
            hint=f"give one of: {', '.join(known)}",
        )
    return [d for d in docs if d.path == section or d.path.startswith(section + ".")]


def _walk(model: type[BaseModel], prefix: str) -> Iterator[FieldDoc]:
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        nested = _section_model(info.annotation)
        yield _doc(path, info, nested)
        if nested is not None:
            yield from _walk(nested, path + ".")


def _doc(path: str, info: FieldInfo, nested: type[BaseModel] | None) -> FieldDoc:
    why = plain(info.description or (nested.__doc__ if nested else None) or "")
    required = info.is_required()
    if nested is not None:
        kind = "section" + (", optional" if _optional(info.annotation) else "")
        valid = f"or {SHORTHANDS[path]}" if path in SHORTHANDS else ""
        return FieldDoc(path, kind, required, None, valid, why)
    kind, valid = _describe(info.annotation, list(info.metadata))
    if path in VALUES_FROM:
        valid = "one of: " + ", ".join(VALUES_FROM[path]())
        if path in SHORTHANDS:
            valid += f" (or {SHORTHANDS[path]})"
    default = None if required else _yaml(_default(info))
    return FieldDoc(path, kind, required, default, valid, why)


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return None if info.default is PydanticUndefined else info.default


def _section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _optional(annotation: Any) -> bool:
    return _is_union(annotation) and type(None) in typing.get_args(annotation)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _describe(annotation: Any, metadata: list[Any]) -> tuple[str, str]:
    """``(type in words, valid values in words)`` of an annotation and its constraints."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        for item in extra:
            metadata += item.metadata if isinstance(item, FieldInfo) else [item]
        return _describe(base, metadata)
    if _is_union(annotation):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = ", optional" if len(parts) < len(typing.get_args(annotation)) else ""
        if bool in parts and len(parts) > 1:  # `compile: true | false | auto`
            words = ["true", "false"] + [_yaml(v) for p in parts for v in typing.get_args(p)]
            return "boolean or string" + optional, "one of: " + ", ".join(words)
        described = [_describe(a, list(metadata)) for a in parts]
        kinds = " or ".join(dict.fromkeys(k for k, _ in described))
        valid = "; ".join(v for _, v in described if v)
        return kinds + optional, valid
    origin = typing.get_origin(annotation)
    if origin is Literal:
        values = typing.get_args(annotation)
        return _kind(type(values[0])), "one of: " + ", ".join(_yaml(v) for v in values)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        item_kind, item_valid = _describe(args[0], [])
        count = f"{len(args)} " if origin is tuple else ""
        noun = f"{item_kind}s"
        kind = f"list of {count}{noun}"
        limits = _bounds(metadata, items=True)
        return kind, "; ".join(v for v in (limits, f"each {item_valid}" if item_valid else "") if v)
    return _kind(annotation), _bounds(metadata)


def _kind(python_type: Any) -> str:
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(python_type, "value")


def _bounds(metadata: list[Any], *, items: bool = False) -> str:
    words = []
    unit = "items" if items else "characters"
    for item in metadata:
        if isinstance(item, at.Gt):
            words.append(f"> {_yaml(item.gt)}")
        elif isinstance(item, at.Ge):
            words.append(f">= {_yaml(item.ge)}")
        elif isinstance(item, at.Lt):
            words.append(f"< {_yaml(item.lt)}")
        elif isinstance(item, at.Le):
            words.append(f"<= {_yaml(item.le)}")
        elif isinstance(item, at.MinLen) and item.min_length > 1:  # 1: not empty, which goes unsaid
            words.append(f"at least {item.min_length} {unit}")
        elif isinstance(item, at.MaxLen):
            words.append(f"at most {item.max_length:,} {unit}")
        elif (pattern := getattr(item, "pattern", None)) is not None:
            words.append(PATTERN_WORDS.get(pattern, f"matching {pattern}"))
    return " and ".join(words)


def _yaml(value: Any) -> str:
    """A value as a YAML document would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value):
        if value.is_integer() and abs(value) < 10**6:
            return str(int(value))
        return f"{value:g}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
    if isinstance(value, int) and abs(value) >= 10**6:
        return f"{value:_}"  # YAML 1.2 reads 1_000_000, as the spec's loader does
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def plain(docstring: str) -> str:
    """A docstring as one paragraph of terminal text: reST ````literal```` becomes `literal`."""
    return re.sub(r"\s+", " ", docstring.replace("``", "`")).strip()


STARTERS = {
    "pretrain": "a LLaMA-style model trained from scratch on text files",
    "finetune": "LoRA fine-tuning of a local Hugging Face model on chat records",
    "multi-node": "a 7B-shaped model over two 8-GPU machines: tensor parallel and FSDP",
}
"""The starter specs ``shipyard spec example`` writes, each a file in ``starters/``."""


def starter(kind: str, **values: str) -> str:
    """A starter spec, its ``${NAME}`` placeholders filled with ``values`` (data, model)."""
    if kind not in STARTERS:
        raise InvalidSpec(f"no starter spec {kind!r}", hint=f"give one of: {', '.join(STARTERS)}")
    text = resources.files("shipyard.schemas").joinpath(f"starters/{kind}.yaml").read_text()
    for name, value in values.items():
        text = text.replace("${" + name.upper() + "}", _yaml_string(value))
    return text


def _yaml_string(value: str) -> str:
    """A path as a YAML scalar: double-quoted (a glob's ``*`` or a ``:`` means something to YAML),
    which is JSON's string syntax too."""
    return json.dumps(value)
