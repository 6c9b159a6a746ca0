"""Artifact names: ``/``-separated paths inside a project, never able to escape it."""

from __future__ import annotations

from shipyard.domain.text import composed, has_control_character
from shipyard.errors import InvalidSpec

MAX_NAME = 255


def check_name(name: str, what: str = "artifact name") -> str:
    """Return ``name`` if it is a safe relative path; raise naming the problem otherwise."""
    problem = _problem(name)
    if problem:
        raise InvalidSpec(
            f"{what} {name!r} {problem}",
            hint="use letters, digits and . _ - @ + : separated by single slashes, "
            "e.g. checkpoints/run-1/step-100",
        )
    if composed(name) != name:
        raise InvalidSpec(
            f"{what} {name!a} is not in Unicode normal form C: it prints like another name",
            hint=f"write it with composed characters: {composed(name)!r}",
        )
    return name


def _problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long (at most {MAX_NAME})"
    if has_control_character(name):
        return "holds a control character"
    if "\\" in name:
        return "holds a backslash"
    if name.startswith("/"):
        return "is absolute (starts with /)"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "holds an empty, '.' or '..' path segment"
    return None
