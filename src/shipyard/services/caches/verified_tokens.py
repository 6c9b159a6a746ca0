"""Tokens a server process checked against the database a moment ago.

Every API request presents a token; reading it (and its user) from the database was the costliest
statement of a submission. A server keeps what it read for ``ttl_s`` seconds, as Kubernetes'
token webhook cache does (two minutes there): the secret is still compared and the expiry still
checked on every request, only the row is not read again. Revoking a token through a server
forgets it there at once; the other server processes stop accepting it within ``ttl_s``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

from shipyard.domain.clock import SYSTEM_CLOCK, Clock

DEFAULT_TTL_S = 2.0
DEFAULT_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """What a token check read: enough to accept the token again without the database."""

    secret_hash: str
    user: str
    is_admin: bool
    scopes: frozenset[str]
    expires_at: datetime | None
    read_at: float
    """``Clock.monotonic()`` when it was read."""


class VerifiedTokens:
    """A bounded map from token id to its last check, entries older than ``ttl_s`` ignored."""

    def __init__(
        self, ttl_s: float = DEFAULT_TTL_S, capacity: int = DEFAULT_CAPACITY, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.ttl_s, self._capacity, self.clock = ttl_s, capacity, clock
        self._entries: dict[str, VerifiedToken] = {}
        self._lock = threading.Lock()

    def get(self, token_id: str) -> VerifiedToken | None:
        found = self._entries.get(token_id)
        if found is None or self.clock.monotonic() - found.read_at > self.ttl_s:
            return None
        return found

    def put(self, token_id: str, verified: VerifiedToken) -> None:
        with self._lock:
            if len(self._entries) >= self._capacity:  # many clients at once: start over, not grow
                self._entries.clear()
            self._entries[token_id] = verified

    def forget(self, token_id: str) -> None:
        with self._lock:
            self._entries.pop(token_id, None)
