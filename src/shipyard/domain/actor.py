"""Who acts: the principal every use case checks and the audit log records."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and from where."""

    name: str
    source: str
    is_admin: bool = False
    """Cluster admin: every permission everywhere (the embedded platform's local user is one)."""
    scopes: frozenset[str] = frozenset({"read", "write", "admin"})
    """What the credential allows: a ``read`` token cannot change anything."""
