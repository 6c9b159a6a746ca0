"""Embedded state: SQLAlchemy 2 tables, engine setup and Alembic migrations."""

from shipyard.db.engine import Database, open_database, rows_changed
from shipyard.db.tables import (
    AgentStatus,
    Artifact,
    Attempt,
    AuditHead,
    AuditRecord,
    Base,
    Job,
    Metric,
    ModelVersion,
    ProjectRole,
    QueueConfigVersion,
    StoredArtifact,
    StoredBlob,
    StoredEntry,
    Token,
    User,
)

__all__ = [
    "AgentStatus",
    "Artifact",
    "Attempt",
    "AuditHead",
    "AuditRecord",
    "Base",
    "Database",
    "Job",
    "Metric",
    "ModelVersion",
    "ProjectRole",
    "QueueConfigVersion",
    "StoredArtifact",
    "StoredBlob",
    "StoredEntry",
    "Token",
    "User",
    "open_database",
    "rows_changed",
]
