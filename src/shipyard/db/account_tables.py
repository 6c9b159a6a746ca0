"""Tables of accounts and their trail: users, sign-in throttling and links, tokens, project roles,
and the hash-chained audit log. Every change ships with an Alembic migration."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from shipyard.db.base import Base, utcnow


class User(Base):
    """A person or a service account; tokens authenticate both."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    password_hash: Mapped[str | None] = mapped_column(Text)
    """argon2id; None for service accounts, which sign in with tokens only."""
    is_admin: Mapped[bool] = mapped_column(default=False)
    is_service: Mapped[bool] = mapped_column(default=False)
    disabled: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LoginThrottle(Base):
    """Failed logins of one user name from one client address. Kept per pair, and for names that
    do not exist as for those that do, so a guesser elsewhere never locks the real user out and
    the answers never tell which names exist."""

    __tablename__ = "login_throttles"

    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(String(128), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer)
    blocked_until: Mapped[datetime | None]
    last_failure_at: Mapped[datetime] = mapped_column(index=True)


class Token(Base):
    """An API token: only its SHA-256 is kept; the secret is shown once."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), index=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class SignInLink(Base):
    """A one-time, short-lived credential that starts a dashboard session (``shipyard ui``):
    its own kind, so no API token can pass for one. Only the SHA-256 of its secret is kept."""

    __tablename__ = "sign_in_links"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"))
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class ProjectRole(Base):
    """A user's role in a project: owner, maintainer, member or viewer."""

    __tablename__ = "project_roles"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))


class AuditRecord(Base):
    """One security-relevant action. Append-only and hash-chained (see shipyard/audit)."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(64), index=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    resource: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(128))
    """Where the request came from: ``cli@host``, ``agent@host`` or the client's address."""
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict[str, Any]]
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    mac: Mapped[str] = mapped_column(String(64))


class AuditHead(Base):
    """The last record's sequence number and hash, MAC-signed: truncation and appends that
    bypass the service show up against it. One row, locked by every append."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    mac: Mapped[str] = mapped_column(String(64))
