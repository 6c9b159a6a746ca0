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
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in roots)


def refuse_overwrite(path: Path, *, force: bool, flag: str = "--force") -> None:
    """Refuse to write over an existing file the user named, unless they said ``force``."""
    if path.is_file() and not force:
        raise Conflict(
            f"{path} exists; nothing was written", hint=f"give another path, or {flag} to replace it"
        )
