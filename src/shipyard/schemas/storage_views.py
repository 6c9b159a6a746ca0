"""What the artifact store's commands and pages show: stored artifacts and their files, the
scrubber's and the recovery's reports, garbage collection, the store's status."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shipyard.schemas.views import View


class StoredFileView(View):
    path: str
    size_bytes: int
    digest: str
    """Block SHA-256 of the file's bytes (see ``shipyard.storage.digests``)."""


class StoredArtifactView(View):
    project: str
    name: str
    kind: str
    """``file`` or ``folder``."""
    size_bytes: int
    files: int
    replicas: int
    encrypted: bool
    created_by: str
    created_at: datetime
    entries: list[StoredFileView] = []
    warnings: list[str] = []
    """Replicas a write could not place although its quorum was met (put only)."""


class ScrubReport(View):
    checked: int
    corrupt: int
    missing: int
    repaired: int
    lost: int
    bytes_verified: int
    seconds: float
    lost_artifacts: list[str] = []
    """``project/name`` of every artifact holding a lost blob."""
    manifests_missing: int = 0
    """Manifest copies fewer than their artifact wants (``storage recover`` needs one)."""
    manifests_repaired: int = 0


class RecoveryReport(View):
    manifests: int
    """Artifact manifests found in the store."""
    recovered: int
    """Artifacts put back into the catalog."""
    already_known: int
    unreadable: list[str]
    """Manifests that could not be read, with why."""


class GcReport(View):
    blobs_removed: int
    bytes_freed: int
    orphans_removed: int


class StorageStatus(View):
    backend: str
    roots: list[dict[str, Any]]
    """Each root with its failure domains and free bytes (or the S3 endpoint and bucket)."""
    default_replicas: int
    artifacts: int
    blobs: int
    bytes: int
    """Bytes of all artifacts as users see them (a blob shared by two counts twice)."""
    stored_bytes: int
    """Bytes of the distinct blobs, before replication."""
    encrypted_blobs: int
    active_key: str | None
    background_scrub: dict[str, Any] = {}
    """The background scrubber's pass: ``cursor`` (the last blob it verified), ``started_at`` of
    the pass under way, ``finished_at`` of the last whole one, and the pass's ``tally``; the
    last light pass's ``light_at`` and ``light`` tally."""
    short_blobs: int = 0
    """Blobs with fewer copies than their replicas now (local roots; counted as the light pass
    counts, without reading them)."""
    missing_copies: int = 0
    bytes_to_copy: int = 0
    time_to_whole_s: float | None = None
    """Until every blob has its copies again at the scrubber's rate, once its repair starts
    (at once when a repair is owed, else at the next light pass); None: nothing to restore."""
    repair_owed_since: float | None = None
    """When damage was first seen that no pass has repaired yet (a read's, a root gone)."""
