"""Whether a path lies inside given folders, decided on the path it resolves to."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from shipyard.errors import Conflict


def is_inside(path: str | Path, roots: Iterable[Path]) -> bool:
    """Whether ``path``, absolute, resolves (symlinks and ``..`` first) inside one of ``roots``
    (themselves resolved). The answer does not depend on whether the path exists, so it tells a
    caller nothing about the disk outside the roots."""
    if not os.path.isabs(path):
        return False
    real = resolved(path)
    # On strings, not Path objects: this is on every submission's path.
    return any(real == str(root) or real.startswith(f"{str(root).rstrip('/')}/") for root in roots)


_ASK_THE_KERNEL = hasattr(os, "O_PATH") and os.path.isdir("/proc/self/fd")


def resolved(path: str | Path) -> str:
    """``os.path.realpath``, asked of the kernel when the path exists: open it without reading
    (``O_PATH``) and read back the name the kernel resolved — three system calls, where realpath
    makes one per component. A missing path (or a system without ``/proc``) takes realpath,
    which gives the same answer."""
    if not _ASK_THE_KERNEL:
        return os.path.realpath(path)
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def refuse_overwrite(path: Path, *, force: bool, flag: str = "--force") -> None:
    """Refuse to write over an existing file the user named, unless they said ``force``."""
    if path.is_file() and not force:
        raise Conflict(
            f"{path} exists; nothing was written", hint=f"give another path, or {flag} to replace it"
        )


PRIVATE_UMASK = 0o077
"""What the server and the agent create (databases, run folders, checkpoints, stored blobs) is
their user's alone: another account on the machine reads none of it."""


def make_private(folder: Path) -> None:
    """Make ``folder`` (and its parents) if missing; readable, writable and searchable only by
    its owner, whatever mode an earlier version left it with."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.stat().st_mode & 0o077 and folder.stat().st_uid == os.getuid():
        folder.chmod(0o700)
