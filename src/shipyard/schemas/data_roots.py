"""Where jobs that arrive through the server may read: the data roots a cluster admin configured
for each project, in ``$SHIPYARD_HOME/server.yaml``::

    data_roots:
      "*": [/data/shared]              # every project
      nlp: [/data/nlp, /models/open]   # and these for project nlp

A path is inside a root when it resolves there with every symlink and ``..`` resolved first, so a
link inside a root that points out of it is outside. Pure: the service layer checks a spec at
submit, the training runtime checks every file it opens at launch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from shipyard.domain.paths import is_inside, resolved
from shipyard.domain.text import DNS_LABEL
from shipyard.errors import DatasetError
from shipyard.schemas.documents import load_mapping, validate_document
from shipyard.schemas.jobspec import STORE_SCHEME, JobSpec
from shipyard.schemas.spec_base import PathText

EVERY_PROJECT = "*"
ProjectKey = Annotated[str, Field(pattern=f"{DNS_LABEL}|^\\*$")]


class ServerConfig(BaseModel):
    """``server.yaml``: what a server lets the work it receives touch on its disks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_roots: dict[ProjectKey, list[PathText]] = Field(default_factory=dict, max_length=10_000)
    """Project (or ``*``) -> absolute folders its jobs may read data, models and tokenizers from."""

    def roots_for(self, project: str) -> list[Path]:
        """The resolved roots of ``project``: its own and those of every project (resolved once
        per project and configuration: this is on every submission's path)."""
        found = self._resolved.get(project)
        if found is None:
            folders = [*self.data_roots.get(EVERY_PROJECT, []), *self.data_roots.get(project, [])]
            found = self._resolved[project] = [Path(resolved(f)) for f in folders if os.path.isabs(f)]
        return found

    @functools.cached_property
    def _resolved(self) -> dict[str, list[Path]]:
        return {}


def parse_server_config(text: str, source: str) -> ServerConfig:
    hint = 'write data_roots: {"*": [/data/shared], nlp: [/data/nlp]} with absolute folders'
    document = load_mapping(text, source=source, expected="a YAML mapping with `data_roots`", hint=hint)
    return validate_document(ServerConfig, document, source=source, hint=hint)


GLOB_MAGIC = frozenset("*?[")


def literal_part(pattern: str) -> str:
    """The folders of a glob before its first wildcard (``/data/a/**/*.txt`` -> ``/data/a``):
    every match lies below them, so they are what must be inside a root."""
    parts = pattern.split("/")
    literal = next((i for i, part in enumerate(parts) if GLOB_MAGIC & set(part)), len(parts))
    return "/".join(parts[:literal]) or ("/" if pattern.startswith("/") and literal else "")


def spec_paths(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """(field, path) for every path on the server's disk that a spec names."""
    for index, path in enumerate(spec.data.paths):
        if not path.startswith(STORE_SCHEME):
            yield f"data.paths[{index}]", path
    if spec.data.tokenizer.path:
        yield "data.tokenizer.path", spec.data.tokenizer.path
    if spec.model.local_path:
        yield "model.path", spec.model.local_path


def spec_folders(spec: JobSpec) -> Iterator[tuple[str, Path]]:
    """(field, folder) for the folders a spec names whose every file the job reads."""
    for field, folder in (
        ("model.path", spec.model.local_path),
        ("data.tokenizer.path", spec.data.tokenizer.path),
    ):
        if folder:
            yield field, Path(folder)


def refuse_escaped_folders(spec: JobSpec, roots: list[Path]) -> None:
    """At launch: every file of the model and tokenizer folders resolves inside ``roots`` (the
    data files are checked as they are listed, ``dataset_files.files_of(data, within=...)``)."""
    for field, folder in spec_folders(spec):
        escaped = next(files_outside(folder, roots), None)
        if escaped is not None:
            raise DatasetError(
                f"{field}: {escaped} resolves outside the project's data roots",
                hint="a link inside a data root must point inside one too",
            )


def files_outside(folder: Path, roots: list[Path]) -> Iterator[Path]:
    """Files below ``folder`` (a model or tokenizer folder) that resolve outside ``roots``."""
    for directory, _, names in os.walk(folder):
        for name in names:
            path = Path(directory) / name
            if not is_inside(path, roots):
                yield path
