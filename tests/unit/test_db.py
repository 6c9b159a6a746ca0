from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from shipyard.db import Base, Job, open_database
from shipyard.db.engine import MIGRATIONS, head_revision


def test_migrations_build_exactly_the_tables_the_code_declares(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'a.db'}", tmp_path)
    with db.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    assert set(inspect(db.engine).get_table_names()) >= {
        "jobs",
        "attempts",
        "metrics",
        "artifacts",
        "model_versions",
    }
    db.close()


def test_each_migration_is_named_after_its_revision_so_the_head_is_known_without_alembic() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    scripts = ScriptDirectory.from_config(config)
    for revision in scripts.walk_revisions():
        assert Path(revision.path).name.startswith(f"{revision.revision}_")
    assert head_revision() == scripts.get_current_head()


def test_opening_twice_is_a_no_op_and_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    open_database(url, tmp_path).close()
    db = open_database(url, tmp_path)
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    db.close()


def test_timestamps_come_back_timezone_aware(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'c.db'}", tmp_path)
    submitted = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with db.transaction() as session:
        session.add(
            Job(
                id="j-1",
                name="j",
                project="p",
                queue="q",
                priority=0,
                state="queued",
                spec={},
                devices=1,
                accelerator_types=["cpu"],
                run_dir="/tmp/j",
                submitted_at=submitted,
            )
        )
    with db.transaction() as session:
        job = session.get(Job, "j-1")
        assert job is not None and job.submitted_at == submitted and job.submitted_at.tzinfo is not None
    db.close()
