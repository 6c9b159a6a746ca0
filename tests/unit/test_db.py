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


def test_model_names_become_per_project_and_existing_versions_keep_their_numbers(
    db_url: str, tmp_path: Path
) -> None:
    """A database from before (one numbering of each name across projects, as the registry kept
    it) upgraded in place: every version keeps its project, name, number and stage, and from
    then on each project numbers its own model."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine, insert

    from shipyard import registry
    from shipyard.db import Artifact, ModelVersion

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = create_engine(db_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0013")
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        for n, project in enumerate(("a", "b"), start=1):
            # The jobs table as 0013 has it (the model knows later columns).
            job_id, submitted = f"j-{project}", datetime.now(UTC)
            session.execute(
                insert(Job.__table__).values(
                    id=job_id, name="shared", project=project, queue="q", priority=0,
                    state="succeeded", spec={}, devices=1, accelerator_types=["cpu"], run_dir="/tmp/j",
                    cancel_requested=False, preempt_requested=False, submitted_at=submitted,
                )
            )  # fmt: skip
            # The artifacts table as 0013 has it (the model knows later columns).
            export_id = session.execute(
                insert(Artifact.__table__).values(
                    job_id=job_id, kind="export", path=f"/tmp/{project}", step=1, size_bytes=1,
                    created_at=submitted,
                ).returning(Artifact.__table__.c.id)
            ).scalar_one()  # fmt: skip
            stage = "production" if project == "a" else "none"
            session.add(ModelVersion(name="shared", version=n, project=project, job_id=job_id,
                                     artifact_id=export_id, step=1, metrics={}, stage=stage))  # fmt: skip
    engine.dispose()

    db = open_database(db_url, tmp_path)
    with db.transaction() as session:
        kept = {(v.project, v.name, v.version, v.stage) for v in session.query(ModelVersion)}
        assert kept == {("a", "shared", 1, "production"), ("b", "shared", 2, "none")}
        b_job, a_job = session.get(Job, "j-b"), session.get(Job, "j-a")
        assert b_job is not None and a_job is not None
        export = session.query(Artifact).filter_by(job_id="j-b").one()
        newer = registry.add(session, b_job, export, "shared", {})
        assert (newer.project, newer.version) == ("b", 3)  # b numbers its own model
        assert registry.move(session, newer, "production") == "none"
        session.add(ModelVersion(name="shared", version=1, project="b", job_id="j-b",
                                 artifact_id=export.id, step=1, metrics={}))  # fmt: skip
    with db.transaction() as session:  # promoting b's model never touched a's
        assert registry.find(session, "a", "shared", "1").stage == "production"
        assert [v.version for v in registry.versions(session, "shared", None, "b")] == [3, 2, 1]
    db.close()
