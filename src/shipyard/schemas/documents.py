"""YAML documents validated by pydantic models: every problem becomes one ``InvalidSpec`` that
names each bad field, the value given and what would be valid."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shipyard.domain.text import DNS_LABEL, DNS_LABEL_HINT
from shipyard.errors import InvalidSpec, NotFound, PayloadTooLarge

Document = TypeVar("Document", bound=BaseModel)

MAX_DOCUMENT_BYTES = 1 << 20
"""Largest spec file or JSON request body read (1 MiB); a job spec is a few hundred bytes."""
MAX_DEPTH = 32
"""Deepest nesting of mappings and lists in a document."""
MAX_NODES = 20_000
"""Most values in a document, YAML aliases expanded (an alias bomb, ``&a [*a, *a, ...]`` nested
nine deep, is a few hundred bytes that expand to billions of values) and written out alike: it
bounds the time a document takes to read and check too (PyYAML reads about 60,000 values a
second; a 300 KB flow list took 3 s of a server's CPU, 60,000 unknown keys 0.7 s of checking).
A spec with 1,000 data paths holds about 1,100."""
MAX_PROBLEMS = 20
"""Most problems an error message describes (a document of 60,000 unknown keys took 0.4 s to
describe, each of them named)."""
SHOWN_CHARS = 80
"""How much of a bad value an error message repeats."""
PATTERN_WORDS = {DNS_LABEL: DNS_LABEL_HINT.removeprefix("use ")}
"""What a name pattern asks for, in words (modules that define a pattern add theirs)."""


class _TooDeep(Exception):
    pass


class _TooMany(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``3e-4`` and ``1e9`` as numbers as YAML 1.2 does (PyYAML
    follows YAML 1.1, where a float needs a dot and ``lr: 3e-4`` would be a string), and
    stopping while it composes at ``MAX_DEPTH`` (it recurses once per level) or at
    ``MAX_NODES`` values written out, which bounds the time it takes."""

    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH + 1:
                raise _TooDeep
            if self._nodes > MAX_NODES:
                raise _TooMany
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def read_document_file(path: Path, *, what: str = "job spec") -> str:
    """The text of a document file, refused before reading when it is no file, too large or not
    UTF-8 text."""
    if not path.exists():
        raise NotFound(f"{what} {path} does not exist", hint=f"give the path of a YAML {what}")
    if not path.is_file():
        raise InvalidSpec(f"{what} {path} is a folder, not a file", hint=f"give the path of a YAML {what}")
    size = path.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise PayloadTooLarge(
            f"{what} {path} is {size:,} bytes; at most {MAX_DOCUMENT_BYTES:,} are read",
            hint=f"a {what} holds settings, not data: point it at data files instead of inlining them",
        )
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(
            f"{what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})",
            hint=f"give a YAML {what}, not a binary file",
        ) from None


def load_mapping(text: str, *, source: str, expected: str, hint: str) -> dict[str, Any]:
    """The YAML mapping in ``text``; a syntax error is reported with its line and column, and a
    document too large, too deep or expanding too far through aliases is refused before it is
    built."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise PayloadTooLarge(
            f"{source} is {len(text):,} characters; at most {MAX_DOCUMENT_BYTES:,} are read",
            hint="a document holds settings, not data",
        )
    try:
        document = _load_bounded(text, source)
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


def _load_bounded(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except _TooDeep:
            raise _too_deep(source) from None
        except _TooMany:
            raise _too_many(source) from None
        if node is None:
            return None
        _check_graph(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_children(node: Any) -> Iterable[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return ()


def _check_graph(root: yaml.Node, source: str) -> None:
    """Refuse a YAML node graph nested deeper than ``MAX_DEPTH`` or holding more than
    ``MAX_NODES`` values with aliases counted each time they are used, without expanding
    anything: each shared node is measured once."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values, height)
    in_progress: set[int] = set()

    def measure(node: Any, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in measured:
            size, height = measured[key]
            if depth + height > MAX_DEPTH:
                raise _too_deep(source)
            return size, height
        if depth > MAX_DEPTH or key in in_progress:
            raise _too_deep(source)
        in_progress.add(key)
        size, height = 1, 0
        for child in _yaml_children(node):
            child_size, child_height = measure(child, depth + 1)
            size, height = size + child_size, max(height, child_height + 1)
            if size > MAX_NODES:
                raise _too_many(source)
        in_progress.discard(key)
        measured[key] = (size, height)
        return size, height

    measure(root, 0)


def check_shape(document: Any, source: str = "the document") -> None:
    """Refuse a built document (JSON, or YAML already measured as a graph) nested deeper than
    ``MAX_DEPTH`` or holding more than ``MAX_NODES`` values. Iterative and bounded by those two:
    cheap on the few dozen values of a real spec, and it stops a self-referring object too."""
    pending, seen = [(document, 0)], 0
    while pending:
        value, depth = pending.pop()
        seen += 1
        if seen > MAX_NODES:
            raise _too_many(source)
        if depth > MAX_DEPTH:
            raise _too_deep(source)
        if isinstance(value, dict):
            pending.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list | tuple):
            pending.extend((child, depth + 1) for child in value)


def _too_many(source: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{source} holds more than {MAX_NODES:,} values (YAML aliases count each use)",
        hint="a document holds settings, not data: point it at data files instead of inlining them",
    )


def _too_deep(source: str) -> InvalidSpec:
    return InvalidSpec(
        f"{source} nests deeper than {MAX_DEPTH} levels (or an alias refers to itself)",
        hint="a job spec is a few levels deep; remove the nesting or the recursive alias",
    )


def shown(value: Any) -> str:
    """A bad value as an error message repeats it: its repr, cut to ``SHOWN_CHARS``."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}… ({len(text):,} characters)"


def validate_document(model: type[Document], document: Any, *, source: str, hint: str) -> Document:
    check_shape(document, source=source)
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=True)
        problems = [describe_error(error, model) for error in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"… and {len(errors) - MAX_PROBLEMS:,} more problems")
        raise InvalidSpec(f"{source} is invalid:\n  " + "\n  ".join(problems), hint=hint) from None


def describe_error(error: Any, root: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    field = ".".join(str(p) for p in loc) or "(top level)"
    given = error.get("input")
    if error["type"] == "extra_forbidden":
        valid = _valid_fields(root, loc[:-1])
        return f"unknown field `{field}` (value {shown(given)}); valid fields here: {', '.join(valid)}"
    if error["type"] == "missing":
        return f"missing required field `{field}`"
    message = str(error["msg"]).removeprefix("Value error, ")
    pattern = (error.get("ctx") or {}).get("pattern")
    if error["type"] == "string_pattern_mismatch" and pattern in PATTERN_WORDS:
        message = f"must be {PATTERN_WORDS[pattern]}"
    if isinstance(given, dict):
        return f"`{field}`: {message}"
    return f"`{field}`: {message} (got {shown(given)})"


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
