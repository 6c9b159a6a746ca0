"""Tables of the artifact store's catalog: blobs (content, shared), artifacts and the entries that
name each artifact's files. Every change ships with an Alembic migration."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from shipyard.db.base import Base, utcnow


class StoredBlob(Base):
    """One file's bytes in the artifact store, shared by every artifact that holds them."""

    __tablename__ = "stored_blobs"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    """The object's name in the backend (``blobs/ab/<digest>``, ``enc/…``, ``objects/…``)."""
    digest: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    replicas: Mapped[int] = mapped_column(Integer)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    wrapped_key: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    block_crcs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """CRC32C of each 4 MiB block (plain blobs): what reads check; None before blocks had them."""
    """The blob's data key wrapped by the master key ``key_id``; None when stored in the clear."""
    project: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The project an encrypted blob belongs to (plain blobs are shared across projects)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StoredArtifact(Base):
    """A named manifest in the store: a file or a folder of files, each a blob."""

    __tablename__ = "stored_artifacts"
    __table_args__ = (UniqueConstraint("project", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(8))
    """``file`` or ``folder``."""
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    replicas: Mapped[int] = mapped_column(Integer)
    encrypted: Mapped[bool] = mapped_column(Boolean)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    entries: Mapped[list[StoredEntry]] = relationship(
        cascade="all, delete-orphan", order_by="StoredEntry.path", lazy="selectin"
    )


class StoredEntry(Base):
    __tablename__ = "stored_entries"

    artifact_id: Mapped[int] = mapped_column(
        ForeignKey("stored_artifacts.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(Text, primary_key=True)
    """Inside the artifact, ``/``-separated; the file's own name for a single file."""
    blob_name: Mapped[str] = mapped_column(ForeignKey("stored_blobs.name"), index=True)

    blob: Mapped[StoredBlob] = relationship(lazy="joined")
