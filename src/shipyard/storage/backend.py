"""What the artifact store needs from a place that keeps bytes: replicated local roots or an
S3-compatible object store. Objects are immutable and named by the store; a write is durable and
whole when it returns, or leaves nothing behind."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

Reader = Callable[[int], bytes]
Verify = Callable[[Reader], None]
"""Reads a replica to its end and raises ``CorruptData`` if its bytes are not the blob's."""


@dataclass(frozen=True)
class Replica:
    where: str
    """The root or endpoint holding it, for messages."""
    open: Callable[[], AbstractContextManager[BinaryIO]]


@dataclass
class Written:
    name: str
    placed: list[str]
    warnings: list[str] = field(default_factory=list)
    """Replicas that could not be placed although a quorum was (scrub --repair completes them)."""


@dataclass
class ScrubTally:
    checked: int = 0
    corrupt: int = 0
    missing: int = 0
    repaired: int = 0
    lost: int = 0
    bytes_verified: int = 0
    lost_names: list[str] = field(default_factory=list)

    def add(self, other: ScrubTally) -> None:
        for name in ("checked", "corrupt", "missing", "repaired", "lost", "bytes_verified"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.lost_names += other.lost_names


class Backend(Protocol):
    kind: str

    def write(self, chunks: Iterable[bytes], name_of: Callable[[], str], replicas: int) -> Written:
        """Store the chunks under ``name_of()`` (asked once every chunk is consumed, so a content
        address can be the name), in ``replicas`` copies where the backend keeps its own."""
        ...

    def replicas(self, name: str) -> list[Replica]:
        """Copies of an object, the preferred first; empty when none exists."""
        ...

    def ensure(self, name: str, replicas: int) -> None:
        """Raise the copies of an existing object to ``replicas`` (a deduplicated blob that a
        stricter project now references)."""
        ...

    def remove(self, name: str) -> None: ...

    def objects(self) -> Iterator[tuple[str, float]]:
        """Every stored object with its modification time (for garbage collection)."""
        ...

    def remove_stale(self, name: str, older_than: float) -> bool:
        """Remove ``name`` unless it was (re)written at or after ``older_than`` (epoch seconds)."""
        ...

    def scrub(
        self,
        name: str,
        replicas: int,
        verify: Verify | None,
        repair: bool,
        source_check: Verify | None = None,
    ) -> ScrubTally:
        """Check the copies of ``name`` (read them through ``verify``, or only see that they
        exist); with ``repair`` restore missing and corrupt ones where the backend can, from a
        copy that passes ``source_check`` (a copy only seen to exist is read through it first,
        so a repair never spreads damaged bytes)."""
        ...

    def describe(self) -> list[dict[str, object]]:
        """Roots or endpoints with their domains and free bytes, for ``storage status``."""
        ...
