"""What a job's data paths hold, looked at on disk: files, directories and globs expanded, a
path that matches nothing or resolves outside the project's data roots refused, and the first
file sampled to tell text from a binary file. The spec (``jobspec.DataSection``) asks; this
module probes, so the spec itself never touches the filesystem."""

from __future__ import annotations

import codecs
import functools
import glob
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from shipyard.domain.paths import is_inside
from shipyard.errors import DatasetError

if TYPE_CHECKING:
    from shipyard.schemas.jobspec import DataSection


def files_of(data: DataSection, within: list[Path] | None = None) -> list[Path]:
    """The spec's data files: files, directories and globs expanded into a sorted list of files
    with some content. ``within``: folders every file must resolve inside (a job submitted
    through a server)."""
    return expand(data.local(), within, has_stored=bool(data.stored()))


def check_data(data: DataSection) -> None:
    """What ``files_of`` checks, stopping at the first file with content: every submission's check."""
    check_content(data.local(), has_stored=bool(data.stored()))


def expand(entries: list[str], within: list[Path] | None = None, *, has_stored: bool = False) -> list[Path]:
    """Files, directories and globs as a sorted list of files with some content (the spec's
    artifacts of the store, ``has_stored``, count as content). ``within``: folders every file
    must resolve inside (a job submitted through a server)."""
    found: set[Path] = set()
    for entry in entries:
        matches = [Path(m) for m in glob.glob(os.path.expanduser(entry), recursive=True)]
        if not matches:
            raise _matches_nothing(entry)
        for match in matches:
            if match.is_dir():
                found.update(p for p in match.rglob("*") if p.is_file())
            elif match.is_file():
                found.add(match)
    files = sorted(found)
    if within is not None:
        _refuse_outside(files, within)
    if has_stored:
        return files
    if not any(f.stat().st_size for f in files):
        raise DatasetError(
            f"dataset {entries} is empty ({len(files)} files, 0 bytes)",
            hint="point data.paths at text or JSONL files with content",
        )
    return files


def check_content(entries: list[str], *, has_stored: bool = False) -> None:
    """What ``expand`` checks (every path matches something, some file has content), stopping at
    the first file with content instead of listing them all: the check of every submission."""
    has_content = has_stored
    for entry in entries:
        matches = glob.iglob(os.path.expanduser(entry), recursive=True)
        first = next(matches, None)
        if first is None:
            raise _matches_nothing(entry)
        if not has_content:
            found = next(filter(_has_content, itertools.chain([first], matches)), None)
            if found is not None:
                _refuse_binary(found)
                has_content = True
    if not has_content:
        expand(entries)  # raises, saying what it found


SAMPLE_BYTES = 8000
"""How much of a dataset's first file is decoded at submit to tell text from a binary file (as
much as git reads to decide the same)."""


def _refuse_binary(path: str) -> None:
    """A file that is not UTF-8 text (a model, an archive, an executable) named as training text."""
    if os.path.isdir(path):
        path = next(
            os.path.join(folder, name)
            for folder, _, names in os.walk(path)
            for name in sorted(names)
            if os.path.getsize(os.path.join(folder, name)) > 0
        )
    info = os.stat(path)
    problem = _binary_problem(path, info.st_mtime_ns, info.st_size)
    if problem is not None:
        raise DatasetError(
            f"dataset file {path} {problem}",
            hint="give text or JSONL files in data.paths; tokenizers and models go in their own fields",
        )


@functools.lru_cache(maxsize=4096)
def _binary_problem(path: str, mtime_ns: int, size: int) -> str | None:  # noqa: ARG001 - the cache key
    """Why the file's first bytes are no text, or None; remembered while the file is unchanged
    (every submission of a dataset samples the same first file)."""
    with open(path, "rb") as f:
        sample = f.read(SAMPLE_BYTES)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)  # a cut last character is fine
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (byte {exc.start} is {sample[exc.start]:#04x})"
    return "holds NUL bytes: a binary file, not text" if b"\0" in sample else None


def _refuse_outside(files: list[Path], roots: list[Path]) -> None:
    for path in files:
        if not is_inside(path, roots):
            raise DatasetError(
                f"dataset file {path} resolves outside the project's data roots",
                hint="a link inside a data root must point inside one too; ask an admin to add the folder",
            )


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
