"""The embedded backend: blobs as plain files on several roots, replicated across failure domains.

Placement is rendezvous hashing made domain-aware: roots are ranked by a hash of (root, object)
and copies go, in that order, first to roots in racks not used yet, then nodes, then disks. So
every process computes the same placement without a directory service, and adding or removing a
root moves only the objects whose ranking changes (``scrub --repair`` moves them).

A write streams into a temporary file on each chosen root, fsyncs, and renames; it succeeds when
a write quorum (a majority of the copies asked for) is durable, taking spare roots for roots that
fail. A crash at any point leaves at most temporary files, which garbage collection removes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from shipyard.durable import fsync_dir
from shipyard.errors import CorruptData, StorageError
from shipyard.storage.backend import Replica, ScrubTally, Verify, Written
from shipyard.storage.config import RootConfig

TMP = "tmp"
_COPY_BYTES = 4 << 20


@dataclass(frozen=True, eq=False)  # one object per configured root: identity is equality
class Root:
    config: RootConfig

    @property
    def path(self) -> Path:
        return self.config.path

    @property
    def label(self) -> str:
        c = self.config
        return f"{c.path} (rack {c.rack}, node {c.node}{', disk ' + c.disk if c.disk else ''})"

    def file(self, name: str) -> Path:
        return self.path / name

    def staging_file(self) -> Path:
        staging = self.path / TMP
        staging.mkdir(parents=True, exist_ok=True)
        return staging / uuid.uuid4().hex

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free if self.path.exists() else 0


def placement(roots: list[Root], name: str, replicas: int, keep: Iterable[Root] = ()) -> list[Root]:
    """Roots for ``replicas`` copies of ``name``: widest failure domains first; among equals the
    roots in ``keep`` (which hold a copy already, so nothing moves), then by rank."""
    held = set(keep)
    ranked = sorted(roots, key=lambda r: hashlib.sha256(f"{r.path}\0{name}".encode()).digest())
    chosen: list[Root] = []
    used: list[set[str]] = [set(), set(), set()]
    while len(chosen) < min(replicas, len(ranked)):
        remaining = [r for r in ranked if r not in chosen]
        # max() keeps the first of equals, so rank order breaks the last ties.
        best = max(
            remaining,
            key=lambda r: (*(d not in u for d, u in zip(r.config.domains(), used, strict=True)), r in held),
        )
        chosen.append(best)
        for domain, seen in zip(best.config.domains(), used, strict=True):
            seen.add(domain)
    return chosen


class ReplicatedRoots:
    kind = "local"

    def __init__(self, roots: list[RootConfig], retiring: list[RootConfig] | None = None) -> None:
        self.roots = [Root(config) for config in roots]
        self.retiring = [Root(config) for config in retiring or []]
        """Roots being removed: read from and emptied by scrub, never written."""

    # -- writing ----------------------------------------------------------------------------------

    def write(self, chunks: Iterable[bytes], name_of: Callable[[], str], replicas: int) -> Written:
        if replicas > len(self.roots):
            raise StorageError(
                f"{replicas} replicas asked for, but the store has {len(self.roots)} root(s)",
                hint="add roots with `shipyard storage roots add PATH --rack R`, or ask for fewer --replicas",
            )
        # The name (a content address) is known only at the end: place by a random one.
        order = placement(self.roots, uuid.uuid4().hex, len(self.roots))
        targets, spares = order[:replicas], order[replicas:]
        failures: dict[Root, OSError] = {}
        staged = self._stream(chunks, targets, failures)
        name = name_of()
        placed = self._commit(staged, name, failures)
        while len(placed) < replicas and spares and placed:
            spare = spares.pop(0)
            try:
                _copy(placed[0].file(name), spare, name)
                placed.append(spare)
            except OSError as exc:
                failures[spare] = exc
        quorum = replicas // 2 + 1
        if len(placed) < quorum:
            raise StorageError(
                f"could not write {name}: {_describe(failures)}",
                hint="free space on or repair the root named, or remove it: `shipyard storage roots remove`",
            )
        warnings = [f"{root.label}: {_reason(exc)}" for root, exc in failures.items()]
        if len(placed) < replicas:
            warnings.append(
                f"{name}: {len(placed)} of {replicas} replicas written; run `shipyard storage scrub --repair`"
            )
        return Written(name, [str(root.path) for root in placed], warnings)

    def _stream(
        self, chunks: Iterable[bytes], targets: list[Root], failures: dict[Root, OSError]
    ) -> dict[Root, tuple[Path, BinaryIO]]:
        staged: dict[Root, tuple[Path, BinaryIO]] = {}
        for root in targets:
            try:
                path = root.staging_file()
                staged[root] = (path, open(path, "wb"))  # noqa: SIM115 - closed in _commit or below
            except OSError as exc:
                failures[root] = exc
        try:
            for chunk in chunks:
                for root, (path, handle) in list(staged.items()):
                    try:
                        handle.write(chunk)
                    except OSError as exc:
                        failures[root] = exc
                        _discard(path, handle)
                        del staged[root]
        except BaseException:
            for path, handle in staged.values():
                _discard(path, handle)
            raise
        return staged

    def _commit(
        self, staged: dict[Root, tuple[Path, BinaryIO]], name: str, failures: dict[Root, OSError]
    ) -> list[Root]:

        def durable(root: Root) -> Root | None:
            path, handle = staged[root]
            try:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
                _publish(path, root.file(name))
                return root
            except OSError as exc:
                failures[root] = exc
                _discard(path, handle)
                return None

        # The copies are flushed together: on separate disks their fsyncs overlap.
        with ThreadPoolExecutor(max_workers=max(1, len(staged))) as flushers:
            return [root for root in flushers.map(durable, list(staged)) if root is not None]

    def ensure(self, name: str, replicas: int) -> None:
        self.scrub(name, replicas, verify=None, repair=True)

    # -- reading ----------------------------------------------------------------------------------

    def replicas(self, name: str) -> list[Replica]:
        ordered = placement(self.roots, name, len(self.roots)) + self.retiring
        return [
            Replica(root.label, _opener(root.file(name))) for root in ordered if root.file(name).is_file()
        ]

    def remove(self, name: str) -> None:
        for root in self.roots + self.retiring:
            root.file(name).unlink(missing_ok=True)

    def objects(self) -> Iterator[tuple[str, float]]:
        for root in self.roots:
            if not root.path.is_dir():
                continue
            for path in root.path.rglob("*"):
                with contextlib.suppress(FileNotFoundError):  # removed while we walk
                    if path.is_file() and not path.name.startswith("."):
                        yield path.relative_to(root.path).as_posix(), path.stat().st_mtime

    def remove_stale(self, name: str, older_than: float) -> bool:
        """Remove every copy of ``name`` last written before ``older_than`` (a writer that
        re-created it since keeps it)."""
        removed = False
        for root in self.roots:
            path = root.file(name)
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    removed = True
        return removed

    # -- scrubbing --------------------------------------------------------------------------------

    def scrub(
        self,
        name: str,
        replicas: int,
        verify: Verify | None,
        repair: bool,
        source_check: Verify | None = None,
    ) -> ScrubTally:
        """Verify every copy of ``name``; with ``repair`` rewrite missing or corrupt ones on the
        roots placement wants, and drop copies elsewhere once those are whole (rebalancing)."""
        tally = ScrubTally(checked=1)
        healthy: list[Root] = []
        corrupt: list[Root] = []
        for root in self.roots + self.retiring:
            path = root.file(name)
            if not path.is_file():
                continue
            if verify is None:
                healthy.append(root)
                continue
            try:
                with open(path, "rb") as handle:
                    verify(handle.read)
                tally.bytes_verified += path.stat().st_size
                healthy.append(root)
            except CorruptData:
                corrupt.append(root)
        tally.corrupt = len(corrupt)
        wanted = placement(self.roots, name, replicas, keep=healthy)
        tally.missing = sum(1 for root in wanted if root not in healthy and root not in corrupt)
        if not healthy:
            tally.lost, tally.lost_names = 1, [name]
            return tally
        if not repair:
            return tally
        if verify is None and source_check is not None and any(r not in healthy for r in wanted):
            healthy, damaged = _checked(healthy, name, source_check)
            corrupt += damaged
            tally.corrupt = len(corrupt)
            if not healthy:
                tally.lost, tally.lost_names = 1, [name]
                return tally
        source = healthy[0].file(name)
        for root in wanted:
            if root not in healthy:
                try:
                    _copy(source, root, name)
                    tally.repaired += 1
                    healthy.append(root)
                except OSError:
                    continue  # counted again by the next scrub; the other copies still serve
        for root in corrupt:
            if root not in wanted:
                root.file(name).unlink(missing_ok=True)
        if all(root in healthy for root in wanted):
            for root in healthy:
                if root not in wanted:
                    root.file(name).unlink(missing_ok=True)
        return tally

    def describe(self) -> list[dict[str, object]]:
        return [
            {
                "path": str(root.path),
                "rack": root.config.rack,
                "node": root.config.node,
                "disk": root.config.disk or str(root.path),
                "free_bytes": root.free_bytes(),
                "reachable": root.path.is_dir(),
            }
            for root in self.roots
        ]


def _checked(present: list[Root], name: str, check: Verify) -> tuple[list[Root], list[Root]]:
    """The copies among ``present`` that pass ``check`` (a source to repair from is read first),
    and those that do not."""
    good: list[Root] = []
    bad: list[Root] = []
    for root in present:
        try:
            with open(root.file(name), "rb") as handle:
                check(handle.read)
            good.append(root)
        except CorruptData:
            bad.append(root)
        except OSError:
            continue  # gone meanwhile: neither a source nor damage
    return good, bad


def _opener(path: Path) -> Callable[[], contextlib.AbstractContextManager[BinaryIO]]:
    return lambda: open(path, "rb")


def _copy(source: Path, root: Root, name: str) -> None:
    staging = root.staging_file()
    try:
        with open(source, "rb") as src, open(staging, "wb") as dst:
            shutil.copyfileobj(src, dst, _COPY_BYTES)
            dst.flush()
            os.fsync(dst.fileno())
        _publish(staging, root.file(name))
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _publish(staged: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, final)
    fsync_dir(final.parent)


def _discard(path: Path, handle: BinaryIO) -> None:
    with contextlib.suppress(OSError):
        handle.close()
    path.unlink(missing_ok=True)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    return exc.strerror or str(exc)


def _describe(failures: dict[Root, OSError]) -> str:
    return (
        "; ".join(f"root {root.label}: {_reason(exc)}" for root, exc in failures.items()) or "no root took it"
    )
