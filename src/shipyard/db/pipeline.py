"""Several statements of one transaction in one round trip, where the driver can.

psycopg's pipeline mode on PostgreSQL sends queued statements together and reads their results
at the next sync; SQLite runs in-process, where a round trip costs nothing, so there the block
runs its statements one by one, as it would anyway. Queuing a batch of submitted jobs took six
round trips (BEGIN, the jobs, the audit head's advance, the records, the head's seal, COMMIT), and
the server's writer thread waited on each; pipelined, it takes three.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import Compiled
from sqlalchemy.sql.dml import UpdateBase


@contextmanager
def pipelined(connection: Connection) -> Iterator[None]:
    """Queue the block's statements instead of waiting for each. Inside, results are read only
    through ``one_row``; an error of a queued statement is raised there or when the block ends,
    as SQLAlchemy's error for it (a taken key is still an ``IntegrityError``)."""
    driver: Any = connection.connection.driver_connection
    if not _can_pipeline(driver):
        yield
        return
    try:
        with driver.pipeline():
            yield
    except connection.dialect.loaded_dbapi.Error as exc:
        raise _translated(connection, exc) from exc


def one_row(connection: Connection, statement: UpdateBase, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """``connection.execute(statement, params).one()``, also inside ``pipelined``: there,
    SQLAlchemy would look for the statement's rows before the pipeline fetched them, so the
    driver runs it, and reading its row sends everything queued before it (one round trip)."""
    driver: Any = connection.connection.driver_connection
    if not (_can_pipeline(driver) and driver.pgconn.pipeline_status):
        return tuple(connection.execute(statement, params).one())
    compiled = _compiled(connection, statement)
    try:
        row = driver.execute(str(compiled), compiled.construct_params(dict(params))).fetchone()
    except connection.dialect.loaded_dbapi.Error as exc:
        raise _translated(connection, exc) from exc
    if row is None:
        raise LookupError(f"no row from {compiled}")
    return tuple(row)


def _can_pipeline(driver: object) -> bool:
    """psycopg 3 with a libpq of version 14 or later (the wheels bundle one)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(driver, psycopg.Connection) and psycopg.Pipeline.is_supported()


_COMPILED: dict[tuple[int, str], tuple[UpdateBase, Compiled]] = {}
"""By statement (held, so that its id stays its own) and dialect: statements built once."""


def _compiled(connection: Connection, statement: UpdateBase) -> Compiled:
    key = (id(statement), connection.dialect.name)
    if key not in _COMPILED:
        _COMPILED[key] = (statement, statement.compile(dialect=connection.dialect))
    return _COMPILED[key][1]


def _translated(connection: Connection, exc: Exception) -> DBAPIError:
    error = DBAPIError.instance(None, None, exc, connection.dialect.loaded_dbapi.Error)
    assert isinstance(error, DBAPIError)
    return error
