"""Directories that appear whole or not at all: written under a temporary name, fsynced, renamed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shipyard.durable import fsync_dir, fsync_file


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``final`` in one rename.

    If the block raises (a full disk, a kill signal turned exception), the staging directory is
    removed and ``final``, old or absent, is left as it was.
    """
    staging = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        for path in staging.rglob("*"):
            if path.is_file():
                fsync_file(path)
        fsync_dir(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
