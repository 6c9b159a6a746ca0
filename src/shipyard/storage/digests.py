"""Content addresses: block SHA-256, hashed on two cores while the bytes stream.

A blob's digest is the SHA-256 of the concatenated SHA-256 digests of its 4 MiB blocks (the
scheme of Dropbox's content hash). One SHA-256 stream runs at about 1.8 GB/s on this class of
CPU, slower than a disk reads; blocks hash in parallel, so verifying every read costs almost
nothing beside the read itself. ``hashlib`` releases the GIL on large buffers, so threads do.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import crc32c

BLOCK_BYTES = 4 << 20
_WINDOW = 8
"""Blocks in flight at once: bounds memory (8 × 4 MiB) while keeping both cores busy."""

_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shipyard-hash")


def _block_digest(block: bytes) -> bytes:
    return hashlib.sha256(block).digest()


class BlockHasher:
    """Feed blocks of ``BLOCK_BYTES`` (the last may be shorter) in order; ``hexdigest()`` at the end."""

    def __init__(self) -> None:
        self._pending: deque[Future[bytes]] = deque()
        self._outer = hashlib.sha256()
        self.size = 0

    def update(self, block: bytes) -> None:
        if not block:  # an empty file has no block (its digest is that of no block digests)
            return
        self.size += len(block)
        self._pending.append(_pool.submit(_block_digest, block))
        while len(self._pending) > _WINDOW:
            self._outer.update(self._pending.popleft().result())

    def hexdigest(self) -> str:
        while self._pending:
            self._outer.update(self._pending.popleft().result())
        return self._outer.hexdigest()


def blocks(read: Callable[[int], bytes], size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Full blocks of ``size`` from a reader (short reads joined), the last one shorter."""
    while True:
        block = read(size)
        while 0 < len(block) < size:
            more = read(size - len(block))
            if not more:
                break
            block += more
        if not block:
            return
        yield block
        if len(block) < size:
            return


def prefetched(pieces: Iterator[bytes], depth: int = 4) -> Iterator[bytes]:
    """``pieces``, produced by a background thread up to ``depth`` ahead: the next read from
    disk or network overlaps the hashing or decryption of the current one (reads release the GIL)."""
    ready: queue.Queue[tuple[bytes | None, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for piece in pieces:
                while not stop.is_set():
                    try:
                        ready.put((piece, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put((None, None))
        except BaseException as exc:  # handed to the consumer, raised there
            ready.put((None, exc))

    producer = threading.Thread(target=produce, name="shipyard-readahead", daemon=True)
    producer.start()
    try:
        while True:
            piece, error = ready.get()
            if error is not None:
                raise error
            if piece is None:
                return
            yield piece
    finally:
        stop.set()  # the consumer stopped early (a bad replica): let the producer end
        producer.join()


def hashed(pieces: Iterable[bytes], hasher: BlockHasher) -> Iterator[bytes]:
    """Pass ``pieces`` (whole blocks) through, hashing them on the way."""
    for piece in pieces:
        hasher.update(piece)
        yield piece


CRC_BYTES = 4


def block_crc(block: bytes) -> bytes:
    """The CRC32C of one block, as stored (hardware-accelerated: about 20 GB/s on one core, with
    the GIL released, so it overlaps the read-ahead thread's next read)."""
    return crc32c.crc32c(block).to_bytes(CRC_BYTES, "big")


class BlockCrcs:
    """The CRC32C of each block passed through, concatenated: what a read checks instead of the
    SHA-256 (as Ceph BlueStore and HDFS checksum blocks); the digest stays the content address
    and what scrubs check."""

    def __init__(self) -> None:
        self.crcs = bytearray()

    def through(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        for piece in pieces:
            self.crcs += block_crc(piece)
            yield piece


def digest_of(read: Callable[[int], bytes]) -> str:
    hasher = BlockHasher()
    for block in blocks(read):
        hasher.update(block)
    return hasher.hexdigest()


_folder_digests: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def folder_digest(folder: Path) -> str:
    """The content address of a folder (a model's weights, config and tokenizer): the SHA-256 of
    each file's relative path and block digest, in path order. Remembered while no file's size or
    modification time changes, so a queue of jobs on one base model hashes it once."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    listing = tuple((str(p.relative_to(folder)), (s := p.stat()).st_size, s.st_mtime_ns) for p in files)
    key = (str(folder.resolve()), listing)
    found = _folder_digests.get(key)
    if found is None:
        outer = hashlib.sha256()
        for path, (relative, _, _) in zip(files, listing, strict=True):
            with open(path, "rb") as f:
                outer.update(f"{relative}\0{digest_of(f.read)}\n".encode())
        found = _folder_digests[key] = outer.hexdigest()
    return found
