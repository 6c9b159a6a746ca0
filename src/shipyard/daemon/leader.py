"""Exactly one scheduling loop at a time, however many servers run.

On PostgreSQL the leader holds a session-level advisory lock on a connection of its own: when
its process or machine dies, the database ends the session and the lock passes to the next agent
that asks. The leader checks on every pass that it still holds the lock (a connection the network
dropped loses it silently). On SQLite one home is one database, and the home's agent lock
(``supervisor.AGENT_LOCK``) already makes its agent the only one.
"""

from __future__ import annotations

import contextlib

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from shipyard.db import Database

LOCK_KEY = 0x5348_4950_5944  # "SHIPYD": the advisory lock's key, the same for every agent
_TRY = text("SELECT pg_try_advisory_lock(:key)")
_RELEASE = text("SELECT pg_advisory_unlock_all()")
_HELD = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND pid = pg_backend_pid() AND ((classid::bigint << 32) | objid::bigint) = :key"
)


class Leadership:
    """Whether this agent may schedule now; ``is_leader`` asks (and takes the lock when free)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._connection: Connection | None = None
        self._shared = db.engine.dialect.name == "postgresql"

    def is_leader(self) -> bool:
        if not self._shared:
            return True
        try:
            if self._connection is None:
                self._connection = self._db.connect()
                return bool(self._connection.execute(_TRY, {"key": LOCK_KEY}).scalar())
            if self._connection.execute(_HELD, {"key": LOCK_KEY}).scalar():
                return True
            return bool(self._connection.execute(_TRY, {"key": LOCK_KEY}).scalar())
        except DBAPIError:  # the connection (and with it any lock it held) is gone: ask again later
            self.close()
            return False

    def close(self) -> None:
        """Give up the lead: the lock is released at once (a closed session releases it only
        once its server process has ended, which a standby asking at that instant can beat),
        then the connection is really closed (back in the pool, it would keep its session)."""
        if self._connection is not None:
            with contextlib.suppress(DBAPIError):
                self._connection.execute(_RELEASE)
            with contextlib.suppress(DBAPIError):
                self._connection.invalidate()
                self._connection.close()
            self._connection = None
