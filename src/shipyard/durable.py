"""Durable file writes, the one helper every layer uses: a temporary name beside the file, fsync,
rename, fsync of the directory. A reader sees the old file or the whole new one, and the rename
survives a power cut; a failed write leaves no temporary file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """``path`` holds the old bytes or ``data``, never a part, whatever happens meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        staged.replace(path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomically(path, text.encode())


def write_json_atomic(path: Path, payload: object) -> None:
    write_atomically(path, json.dumps(payload, indent=2).encode())


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
