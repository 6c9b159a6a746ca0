"""What the artifact store's upkeep is owed, kept as a mark in the home.

A read that found a copy missing or damaged, or a root that is gone, marks the store: the
scrubber of the server or of any agent of the home then repairs at once (a light pass for
missing copies, a deep one when bytes were found damaged) instead of at its next scheduled pass,
and in the embedded mode the command that found it starts the agent that does. As Ceph and HDFS
re-replicate as soon as they see a copy gone, rather than on a schedule.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from shipyard.durable import write_json_atomic
from shipyard.storage.backend import ScrubTally

OWED_FILE = "store-repair.json"


@dataclass(frozen=True, slots=True)
class Owed:
    since: float
    """When the first damage of this debt was seen."""
    latest: float
    """When the last was: a pass that began before it has not repaired it."""
    deep: bool
    """Whether bytes were found damaged (every copy is then read again), not only missing."""


def owe(home: Path, *, deep: bool) -> None:
    """Mark the store as owed a repair (deep: a full read of every copy)."""
    before, now = owed(home), time.time()
    deeper = deep or bool(before and before.deep)
    write_json_atomic(
        home / OWED_FILE, {"since": before.since if before else now, "latest": now, "deep": deeper}
    )


def owe_for(home: Path, found: ScrubTally) -> None:
    """Mark what a read's repair found and could not settle, or found damaged. A blob with no
    copy left is owed a light pass (a root unmounted for a moment may bring one back), not a
    deep one: reading every copy again cannot restore it."""
    if found.corrupt:
        owe(home, deep=True)
    elif found.missing > found.repaired or found.lost:
        owe(home, deep=False)


def owed(home: Path) -> Owed | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        found = json.loads((home / OWED_FILE).read_text())
        return Owed(since=float(found["since"]), latest=float(found["latest"]), deep=bool(found["deep"]))
    return None


def settle(home: Path, *, deep: bool, began: float) -> None:
    """A pass that began at ``began`` finished: a light one settles a debt of missing copies, a
    deep one any debt; either only a debt seen before it began."""
    found = owed(home)
    if found is not None and found.latest <= began and (deep or not found.deep):
        (home / OWED_FILE).unlink(missing_ok=True)
