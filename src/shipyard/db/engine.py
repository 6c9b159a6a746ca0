"""Open the database: SQLite (WAL) under ``$SHIPYARD_HOME`` by default, any SQLAlchemy URL else.

Opening brings the schema to the newest Alembic revision, under a file lock so that the CLI and
the agent starting together do not race.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"


@dataclass(frozen=True, slots=True)
class Database:
    engine: Engine
    sessions: sessionmaker[Session]
    readers: sessionmaker[Session]
    """Sessions in autocommit mode: see ``read``."""
    autocommit: Engine
    """The engine in autocommit mode: see ``connect``."""

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: committed when the block ends, rolled back if it raises."""
        with self.sessions() as session, session.begin():
            yield session

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose caller commits (or rolls back) one short transaction after another,
        keeping the objects it read: a pass records each outcome on its own."""
        with self.sessions() as session:
            yield session

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One unit of work on a Core connection, for writes made of Core statements only (queuing
        submitted jobs): no ORM session to set up and flush around them. Committed when the block
        ends, rolled back if it raises."""
        with self.engine.begin() as connection:
            yield connection

    @contextmanager
    def read(self) -> Iterator[Session]:
        """For reads on hot paths (the token check of every request, a job's view): no BEGIN and
        COMMIT around them, two round trips fewer. Each statement sees its own snapshot, as each
        statement of a READ COMMITTED transaction on PostgreSQL does anyway."""
        with self.readers() as session:
            yield session

    def connect(self) -> Connection:
        """A Core connection in autocommit mode for the statements of the hottest paths (the token
        check of every request): no session, no ORM objects, no BEGIN and COMMIT around them."""
        return self.autocommit.connect()

    def close(self) -> None:
        self.engine.dispose()


def rows_changed(result: object) -> bool:
    """Whether a guarded UPDATE matched a row (its WHERE held the state the caller read)."""
    return bool(getattr(result, "rowcount", 0))


def open_database(url: str, lock_dir: Path) -> Database:
    engine = create_engine(url, connect_args=_connect_args(url))
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / ".migrate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        upgrade(engine)
    if url.startswith("sqlite:///") and engine.url.database and os.path.isfile(engine.url.database):
        # Its owner's alone (SQLite gives the -wal and -shm files the database file's mode).
        os.chmod(engine.url.database, 0o600)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    return Database(
        engine,
        sessions=sessionmaker(engine, expire_on_commit=False),
        readers=sessionmaker(autocommit, expire_on_commit=False),
        autocommit=autocommit,
    )


def _connect_args(url: str) -> dict[str, Any]:
    # The agent and CLI processes write concurrently; wait for the lock instead of failing.
    return {"timeout": 30} if url.startswith("sqlite") else {}


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def head_revision() -> str:
    """The newest migration's revision: each file is named after its revision (``0013_*.py``,
    checked by a test), so no Alembic import is needed to know it."""
    return max(path.name.split("_", 1)[0] for path in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))


def _at_head(engine: Engine) -> bool:
    """Whether the schema is current, read with one query: every command opens the database,
    and importing Alembic to ask would cost each of them a sixth of a second."""
    try:
        with engine.connect() as connection:
            current = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError:  # no version table yet: a new database
        return False
    return current == head_revision()


def upgrade(engine: Engine) -> None:
    """Apply pending migrations (a no-op when the schema is current)."""
    if _at_head(engine):
        return
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    with engine.connect() as connection:
        if MigrationContext.configure(connection).get_current_revision() == head:
            return
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
