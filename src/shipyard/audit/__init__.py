"""The audit log: who did what to which resource, when, from where, and how it ended.

Append-only and tamper-evident. Each record holds the SHA-256 of the previous record's hash and
its own canonical JSON (so editing, deleting, inserting or reordering a row breaks the chain at
that row), plus an HMAC of that hash under the server's key (so a rewritten chain cannot be
re-signed without the key). One head row, MAC-signed as well and locked by every append, holds
the last sequence number: records cut off the end, or added behind the service's back, show up
against it. ``verify`` walks the chain and names the first record that does not hold.

The use cases that read it (admins only) are ``services/accounts/auditing.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, cast

from sqlalchemy import Connection, ScalarResult, Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from shipyard.db import AuditHead, AuditRecord, Database
from shipyard.db.base import utcnow
from shipyard.db.pipeline import one_row
from shipyard.domain.actor import Actor as Actor  # the principal its records name
from shipyard.errors import AuditChainBroken, InvalidSpec
from shipyard.schemas.views import AuditVerdictView
from shipyard.settings import Settings

GENESIS = "0" * 64
"""The previous hash of the first record."""
KEY_FILE = "audit.key"


def audit_key(settings: Settings) -> bytes:
    """``SHIPYARD_AUDIT_KEY`` (every server of a cluster must share it), else a key file made
    once in ``$SHIPYARD_HOME`` with mode 0600."""
    if settings.audit_key:
        return settings.audit_key.encode()
    path = settings.home / KEY_FILE
    if not path.exists():
        _create_key(path)
    return path.read_bytes()


def _create_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_hex(32).encode())
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(staged, path)  # never replaces a key another process made first
    except FileExistsError:
        pass
    finally:
        staged.unlink()


def canonical(record: AuditRecord) -> str:
    """The fields a record's hash covers, as canonical JSON (sorted keys, no spaces)."""
    return json.dumps(
        {
            "seq": record.seq,
            "at": record.at.isoformat(),
            "actor": record.actor,
            "action": record.action,
            "resource": record.resource,
            "source": record.source,
            "outcome": record.outcome,
            "detail": record.detail,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _hash(prev_hash: str, record: AuditRecord) -> str:
    return hashlib.sha256((prev_hash + canonical(record)).encode()).hexdigest()


def _mac(key: bytes, *parts: object) -> str:
    return hmac.new(key, ":".join(str(p) for p in parts).encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One record to append: who did what to which resource, and how it ended."""

    actor: Actor
    action: str
    resource: str
    outcome: str = "ok"
    detail: dict[str, Any] | None = None


def append(
    session: Session,
    key: bytes,
    actor: Actor,
    action: str,
    resource: str,
    *,
    outcome: str = "ok",
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> AuditRecord:
    """Add one record in the caller's transaction (so it commits, or not, with what it records)."""
    return append_all(session, key, [Entry(actor, action, resource, outcome, detail)], at=at)[0]


_HEAD = cast(Table, AuditHead.__table__)
_ADVANCE = (
    update(_HEAD)
    .where(_HEAD.c.id == 1)
    .values(seq=_HEAD.c.seq + bindparam("count"))
    .returning(_HEAD.c.seq, _HEAD.c.hash)
)
_SEAL = update(_HEAD).where(_HEAD.c.id == 1).values(hash=bindparam("new_hash"), mac=bindparam("new_mac"))
_RECORDS = cast(Table, AuditRecord.__table__)
_RECORD_COLUMNS = tuple(column.key for column in _RECORDS.columns)
"""Core statements built once: appends are on the path of every write (no ORM unit of work)."""


def append_all(
    session: Session | Connection, key: bytes, entries: list[Entry], *, at: datetime | None = None
) -> list[AuditRecord]:
    """Add records in the caller's transaction (an ORM session's or a Core connection's), in order.

    The head row is advanced first, by all of them at once, in one statement that also returns
    the previous hash: that takes the write lock before anything is read (SQLite runs reads that
    precede a transaction's first write outside it, so two processes could otherwise extend the
    same head), and costs one round trip while every other append waits on the lock."""
    if isinstance(session, Session):  # the caller's changes first: one that fails, before the lock
        session.flush()
    connection = session.connection() if isinstance(session, Session) else session
    last, prev_hash = one_row(connection, _ADVANCE, {"count": len(entries)})
    when = at or utcnow()
    records = []
    for seq, entry in enumerate(entries, start=last - len(entries) + 1):
        record = AuditRecord(
            seq=seq,
            at=when,
            actor=entry.actor.name,
            action=entry.action,
            resource=entry.resource,
            source=entry.actor.source,
            outcome=entry.outcome,
            detail=entry.detail or {},
            prev_hash=prev_hash,
        )
        record.hash = _hash(prev_hash, record)
        record.mac = _mac(key, record.hash)
        records.append(record)
        prev_hash = record.hash
    session.execute(insert(_RECORDS), [{c: getattr(r, c) for c in _RECORD_COLUMNS} for r in records])
    session.execute(_SEAL, {"new_hash": prev_hash, "new_mac": _mac(key, last, prev_hash)})
    return records


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    records: int
    head_seq: int
    first_bad: int | None = None
    problem: str | None = None

    def view(self) -> AuditVerdictView:
        return AuditVerdictView(
            ok=self.ok,
            records=self.records,
            head_seq=self.head_seq,
            first_bad=self.first_bad,
            problem=self.problem,
        )


def verify(session: Session, key: bytes) -> Verdict:
    """Walk the chain in sequence order; the first record that does not hold ends the walk."""
    head = session.get(AuditHead, 1)
    head_seq = head.seq if head else 0
    if (
        head is not None
        and head.seq > 0
        and not hmac.compare_digest(head.mac, _mac(key, head.seq, head.hash))
    ):
        return Verdict(
            False, 0, head_seq, head.seq, "the chain head's signature does not match (head altered)"
        )
    prev, expected, count = GENESIS, 1, 0
    with _records(session) as records:
        for record in records:
            count += 1
            bad = _check(record, prev, expected, head_seq, key)
            if bad:
                first = record.seq if record.seq <= expected else expected
                return Verdict(False, count, head_seq, first, bad)
            prev, expected = record.hash, record.seq + 1
    if expected - 1 < head_seq:
        return Verdict(
            False,
            count,
            head_seq,
            expected,
            f"records {expected}..{head_seq} are missing: the signed head is at {head_seq} (deleted)",
        )
    if head is not None and head.seq > 0 and head.hash != prev:
        return Verdict(False, count, head_seq, head.seq, f"record {head.seq} does not match the signed head")
    return Verdict(True, count, head_seq)


def _check(record: AuditRecord, prev: str, expected: int, head_seq: int, key: bytes) -> str | None:
    if record.seq > head_seq:
        return f"record {record.seq} lies beyond the signed head ({head_seq}): inserted"
    if record.seq != expected:
        if record.seq > expected:
            return f"records {expected}..{record.seq - 1} are missing (deleted)"
        return f"record {record.seq} is out of sequence (inserted)"
    if not hmac.compare_digest(record.mac, _mac(key, record.hash)):
        return f"record {record.seq} carries no valid signature (inserted or forged)"
    if record.prev_hash != prev:
        return f"record {record.seq} does not follow record {record.seq - 1} (deleted, inserted or reordered)"
    if record.hash != _hash(prev, record):
        return f"record {record.seq} was modified"
    return None


@contextmanager
def _records(session: Session, since: datetime | None = None) -> Iterator[ScalarResult[AuditRecord]]:
    """Records in sequence order, streamed; the cursor is closed even when the walk stops early."""
    query = select(AuditRecord).order_by(AuditRecord.seq).execution_options(yield_per=1000)
    if since is not None:
        query = query.where(AuditRecord.at >= since)
    result = session.scalars(query)
    try:
        yield result
    finally:
        result.close()


def export(session: Session, out: TextIO, since: datetime | None = None) -> int:
    """Write records (with their hashes, so a SIEM can re-check the chain) as JSON lines."""
    count = 0
    with _records(session, since) as records:
        for record in records:
            line = json.loads(canonical(record))
            line.update(prev_hash=record.prev_hash, hash=record.hash)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    return count


def parse_since(text: str) -> datetime:
    """``2026-11-30``, ``2026-11-30T06:00:00`` (UTC unless a zone is given)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidSpec(
            f"--since {text!r} is not a date",
            hint="give an ISO date or time, e.g. 2026-11-30 or 2026-11-30T06:00",
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def verify_log(db: Database, key: bytes) -> Verdict:
    with db.transaction() as session:
        return verify(session, key)


def export_log(db: Database, key: bytes, out: TextIO, since: datetime | None = None) -> int:
    """Export, refusing to hand a broken chain to a SIEM as if it were sound."""
    with db.transaction() as session:
        verdict = verify(session, key)
        if not verdict.ok:
            raise AuditChainBroken(
                f"the audit log is broken at record {verdict.first_bad}: {verdict.problem}",
                hint="`shipyard audit verify` shows where; restore the database from a backup",
            )
        return export(session, out, since)
