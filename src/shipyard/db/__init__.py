"""Embedded state: SQLAlchemy 2 tables, engine setup and Alembic migrations."""

from shipyard.db.engine import Database, open_database, rows_changed
from shipyard.db.tables import Artifact, Attempt, Base, Job, Metric, ModelVersion

__all__ = [
    "Artifact",
    "Attempt",
    "Base",
    "Database",
    "Job",
    "Metric",
    "ModelVersion",
    "open_database",
    "rows_changed",
]
