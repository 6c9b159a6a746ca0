"""A node's own cache of stored folders its jobs read (``store:`` datasets, tokenizers, base
models): fetched once per node by the node itself, verified as read, shared by every job there,
content-addressed, and kept under a size limit by evicting what no live job holds, least recently
used first.

    CACHE/content/<key>/data/...      the folder, renamed into place whole
    CACHE/content/<key>/holders/<id>  one file per attempt on this node that reads it: its pid

``key`` hashes the folder's files (paths, digests, sizes): the same dataset stored twice under two
names is fetched once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol


class Reader(Protocol):
    def read(self, records: list[dict[str, Any]], into: Path) -> Path: ...


def content_key(records: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for record in sorted(records, key=lambda r: r["path"]):
        digest.update(f"{record['path']}\0{record['digest']}\0{record['size_bytes']}\n".encode())
    return digest.hexdigest()[:32]


class NodeCache:
    def __init__(self, root: Path, limit_bytes: int) -> None:
        self.content = root / "content"
        self.limit_bytes = limit_bytes

    def fetch(self, reader: Reader, records: list[dict[str, Any]], holder: str) -> Path:
        """The folder of ``records`` in the cache, fetched unless it is there, held by
        ``holder`` (an attempt on this node: this process holds it while it lives)."""
        entry = self.content / content_key(records)
        with self._locked():
            (entry / "holders").mkdir(parents=True, exist_ok=True)
            (entry / "holders" / holder).write_text(str(os.getpid()))
            os.utime(entry)  # the newest use: evicted last
        data = reader.read(records, entry / "data")  # at once when it is there
        with self._locked():
            self._evict(keep=entry)
        return data

    def _evict(self, keep: Path) -> None:
        """Remove unheld folders, least recently used first, until the cache is under its limit."""
        entries = sorted((e for e in self.content.iterdir() if e.is_dir()), key=lambda e: e.stat().st_mtime)
        total = sum(_size(entry / "data") for entry in entries)
        for entry in entries:
            if total <= self.limit_bytes:
                return
            if entry == keep or _held(entry):
                continue
            size = _size(entry / "data")
            shutil.rmtree(entry, ignore_errors=True)
            total -= size

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One attempt at a time decides what the node's cache holds (fetches run unlocked)."""
        self.content.mkdir(parents=True, exist_ok=True)
        with open(self.content / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _held(entry: Path) -> bool:
    """Whether a live process holds the folder (a holder whose process ended is dropped)."""
    held = False
    for holder in (entry / "holders").glob("*"):
        try:
            os.kill(int(holder.read_text()), 0)
            held = True
        except (ValueError, ProcessLookupError):
            holder.unlink(missing_ok=True)
        except PermissionError:  # another user's live process
            held = True
    return held


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
