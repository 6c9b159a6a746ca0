"""Store throughput beside plain file copies on the same disk, measured in one run.

Plain: copy the source with sequential writes and one fsync; read it back. Store: the same bytes
through ``BlobStore`` (block hashing, replication, encryption) into scratch roots on the same
disk, and read back with verification. Page caches are dropped for the files read, so reads come
from the disk for both; each read is the median of three.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shipyard.storage.backend import Backend
from shipyard.storage.blobs import BlobStore
from shipyard.storage.config import RootConfig
from shipyard.storage.crypto import Keyring
from shipyard.storage.roots import ReplicatedRoots

_IO_BYTES = 4 << 20


def run(
    scratch_parent: Path, size_bytes: int, *, extra: dict[str, Backend] | None = None
) -> list[dict[str, Any]]:
    """Rows of {case, write_gbps, read_gbps, write_ratio, read_ratio, scrub_gbps}; ``extra`` adds
    cases on other backends (an S3 endpoint). Each case is paired with a plain copy measured just
    before it: a VM's disk speed drifts by 2-3x within minutes, a ratio of neighbours does not."""
    scratch = Path(tempfile.mkdtemp(prefix="shipyard-bench-", dir=scratch_parent))
    try:
        source = scratch / "source.bin"
        _fill(source, size_bytes)
        rows: list[dict[str, Any]] = []
        key = secrets.token_bytes(32)
        ring = Keyring({"bench": key}, "bench")
        cases: list[tuple[str, Backend, int, bool]] = [
            ("store, 1 replica", _roots(scratch, "one", 1), 1, False),
            ("store, 1 replica, encrypted", _roots(scratch, "enc", 1), 1, True),
            ("store, 2 replicas, one disk", _roots(scratch, "two", 2), 2, False),
        ]
        cases += [(label, backend, 1, False) for label, backend in (extra or {}).items()]
        for label, backend, replicas, encrypt in cases:
            plain_write, plain_read = _plain(source, scratch / "plain.bin")
            if not rows:
                rows.append(_row("plain file (fsync)", plain_write, plain_read, plain_write, plain_read))
            store = BlobStore(backend, lambda: ring)
            started = time.perf_counter()
            blob, _ = store.put_file(source, replicas=replicas, encrypt=encrypt)
            write_s = time.perf_counter() - started
            read_s = _read_time(
                lambda: store.read(blob, store.verifier(blob, digest=False)),  # noqa: B023
                lambda: _drop_cache_under(scratch),
            )
            row = _row(label, size_bytes / write_s, size_bytes / read_s, plain_write, plain_read)
            _drop_cache_under(scratch)
            started = time.perf_counter()
            verified = store.scrub(blob, replicas, repair=False).bytes_verified
            row["scrub_gbps"] = round(verified / (time.perf_counter() - started) / 1e9, 3)
            rows.append(row)
            backend.remove(blob.name)  # the next case starts from the same free space
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def interleaved_reads(scratch_parent: Path, size_bytes: int, rounds: int) -> dict[str, list[float]]:
    """Read GB/s of a plain file and of the same bytes stored (one replica, checked by block
    CRC32C; one replica encrypted), all written first, then read in turn from a dropped cache,
    ``rounds`` times: the disk's drift over minutes falls on every case alike."""
    scratch = Path(tempfile.mkdtemp(prefix="shipyard-reads-", dir=scratch_parent))
    try:
        source = scratch / "source.bin"
        _fill(source, size_bytes)
        plain = scratch / "plain.bin"
        shutil.copyfile(source, plain)
        ring = Keyring({"bench": secrets.token_bytes(32)}, "bench")
        reads: dict[str, Callable[[], object]] = {"plain file": lambda: _read_through(plain)}
        for label, encrypt in (("store, 1 replica", False), ("store, 1 replica, encrypted", True)):
            store = BlobStore(_roots(scratch, label.replace(" ", "").replace(",", ""), 1), lambda: ring)
            blob, _ = store.put_file(source, replicas=1, encrypt=encrypt)
            reads[label] = functools.partial(store.read, blob, store.verifier(blob, digest=False))
        speeds: dict[str, list[float]] = {label: [] for label in reads}
        for _ in range(rounds):
            for label, read in reads.items():
                _drop_cache_under(scratch)
                speeds[label].append(round(size_bytes / _timed(read) / 1e9, 3))
        return speeds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_through(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(_IO_BYTES):
            pass


def _row(case: str, write: float, read: float, plain_write: float, plain_read: float) -> dict[str, Any]:
    return {
        "case": case,
        "write_gbps": round(write / 1e9, 3),
        "read_gbps": round(read / 1e9, 3),
        "write_ratio": round(write / plain_write, 3),
        "read_ratio": round(read / plain_read, 3),
        "plain_write_gbps": round(plain_write / 1e9, 3),
        "plain_read_gbps": round(plain_read / 1e9, 3),
    }


def _roots(scratch: Path, label: str, count: int) -> ReplicatedRoots:
    configs = [
        RootConfig(path=scratch / f"{label}-{i}", rack="bench", disk=f"{label}-{i}") for i in range(count)
    ]
    for config in configs:
        config.path.mkdir()
    return ReplicatedRoots(configs)


def _fill(path: Path, size: int) -> None:
    block = secrets.token_bytes(_IO_BYTES)  # incompressible, like trained weights
    with open(path, "wb") as handle:
        for offset in range(0, size, _IO_BYTES):
            handle.write(block[: min(_IO_BYTES, size - offset)])
        handle.flush()
        os.fsync(handle.fileno())


def _plain(source: Path, target: Path) -> tuple[float, float]:
    """Bytes/s of a sequential copy with fsync, and of reading the copy back from disk."""

    def copy() -> None:
        with open(source, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, _IO_BYTES)
            dst.flush()
            os.fsync(dst.fileno())

    write_s = _timed(copy)

    read_s = _read_time(lambda: _read_through(target), lambda: _drop_cache(target))
    size = target.stat().st_size
    target.unlink()
    return size / write_s, size / read_s


READS = 3
"""Reads timed of each copy, from a dropped cache each time: the median is kept. The first read
after a large write is often slowed by the disk's own writeback (a VM's by its host's), by as
much as 2-3x, whatever reads."""


def _read_time(read: Callable[[], object], drop: Callable[[], None]) -> float:
    times = []
    for _ in range(READS):
        drop()
        times.append(_timed(read))
    return sorted(times)[READS // 2]


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _drop_cache(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def _drop_cache_under(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and path.name != "source.bin":
            _drop_cache(path)
