"""Embedded state: SQLAlchemy 2 tables, engine setup and Alembic migrations."""

from shipyard.db.account_tables import (
    AuditHead,
    AuditRecord,
    LoginThrottle,
    ProjectRole,
    SignInLink,
    Token,
    User,
)
from shipyard.db.base import Base
from shipyard.db.engine import Database, open_database, rows_changed
from shipyard.db.store_tables import StoredArtifact, StoredBlob, StoredEntry
from shipyard.db.tables import (
    AgentStatus,
    Artifact,
    Attempt,
    ClusterNode,
    DeviceCalibration,
    DeviceSample,
    Job,
    Metric,
    MetricPoint,
    ModelVersion,
    QueueConfigVersion,
    ShapeMeasurement,
)

__all__ = [
    "AgentStatus",
    "Artifact",
    "Attempt",
    "AuditHead",
    "AuditRecord",
    "Base",
    "ClusterNode",
    "Database",
    "DeviceCalibration",
    "DeviceSample",
    "Job",
    "LoginThrottle",
    "Metric",
    "MetricPoint",
    "ModelVersion",
    "ProjectRole",
    "QueueConfigVersion",
    "ShapeMeasurement",
    "SignInLink",
    "StoredArtifact",
    "StoredBlob",
    "StoredEntry",
    "Token",
    "User",
    "open_database",
    "rows_changed",
]
