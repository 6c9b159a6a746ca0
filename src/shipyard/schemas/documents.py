"""YAML documents validated by pydantic models: every problem becomes one ``InvalidSpec`` that
names each bad field, the value given and what would be valid."""

from __future__ import annotations

from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shipyard.errors import InvalidSpec

Document = TypeVar("Document", bound=BaseModel)


def load_mapping(text: str, *, source: str, expected: str, hint: str) -> dict[str, Any]:
    """The YAML mapping in ``text``; a syntax error is reported with its line and column."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InvalidSpec(
            f"{source} is not valid YAML{where}: {problem}",
            hint="check the indentation and the `key: value` syntax around that line",
        ) from None
    if not isinstance(document, dict):
        raise InvalidSpec(f"{source} must be {expected}, got {type(document).__name__}", hint=hint)
    return document


def validate_document(model: type[Document], document: Any, *, source: str, hint: str) -> Document:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems = [describe_error(error, model) for error in exc.errors()]
        raise InvalidSpec(f"{source} is invalid:\n  " + "\n  ".join(problems), hint=hint) from None


def describe_error(error: Any, root: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    field = ".".join(str(p) for p in loc) or "(top level)"
    given = error.get("input")
    if error["type"] == "extra_forbidden":
        valid = _valid_fields(root, loc[:-1])
        return f"unknown field `{field}` (value {given!r}); valid fields here: {', '.join(valid)}"
    if error["type"] == "missing":
        return f"missing required field `{field}`"
    message = str(error["msg"]).removeprefix("Value error, ")
    if isinstance(given, dict):
        return f"`{field}`: {message}"
    return f"`{field}`: {message} (got {given!r})"


def _valid_fields(root: type[BaseModel], parent: tuple[Any, ...]) -> list[str]:
    model = root
    for part in parent:
        if not isinstance(part, str):
            continue  # list index: same model
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [f.alias or name for name, f in model.model_fields.items()]
