"""Is this node fit for new work? Free disk under its run folders here, and each NVIDIA GPU's
uncorrectable ECC errors and whether it answers at all (``discovery.query_nvml_health``, behind
the vendor seam). A node with a problem is cordoned: nothing new starts on it (``shipyard nodes``
says why) until the problem is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

GIB = 2**30


def disk_problems(folder: Path, min_free_gib: float) -> list[str]:
    """Too little space where attempts write their checkpoints (``folder`` or its nearest parent)."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    free_gib = shutil.disk_usage(existing).free / GIB
    if free_gib >= min_free_gib:
        return []
    return [
        f"disk: {free_gib:.1f} GiB free under {existing}, below the {min_free_gib:g} GiB a checkpoint "
        "may need (free space, or set SHIPYARD_MIN_FREE_DISK_GIB)"
    ]
