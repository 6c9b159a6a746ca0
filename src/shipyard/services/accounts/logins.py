"""Signing in with a password: one argon2 verification for a known name and an unknown one
alike, a bounded number of hashes at once, and failures counted per name and address, each pair
waiting longer the more it fails (and the address alone past a limit)."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.db import LoginThrottle, User
from shipyard.errors import (
    Overloaded,
    Throttled,
    Unauthenticated,
)
from shipyard.services.context import ServiceContext

hasher = PasswordHasher()  # argon2id with the library's current recommended parameters
FREE_FAILURES = 5
"""Failed logins of one name from one address allowed before that pair must wait."""
LOCK_S = 30.0
MAX_LOCK_S = 900.0
FREE_FAILURES_PER_ADDRESS = 20
"""Failed logins from one address, over all names, before that address must wait: a guesser
that tries a new name each time is slowed down too."""
ANY_NAME = "*"
"""The throttle row of an address over every name (no user name holds a ``*``)."""
FORGET_FAILURES_AFTER = timedelta(days=1)
"""A pair's failures are forgotten a day after the last one."""
BAD_CREDENTIALS = "invalid user name or password"
_DUMMY_HASH = hasher.hash("an account that does not exist")
HASH_SLOTS = max(1, min(4, os.cpu_count() or 1))
HASH_QUEUE = 4 * HASH_SLOTS
"""Password hashes computed at once in a process, and logins that may wait for one: each takes
64 MiB and a core for about 0.1 s, and 16 at once took a server from 401 to 1,358 MiB. Past
the queue a login is answered 503 at once (``Overloaded``)."""


class HashSlots:
    """At most ``slots`` hashes at a time, at most ``queue`` callers waiting for one; the rest
    are refused at once rather than queued without end."""

    def __init__(self, slots: int, queue: int) -> None:
        self._running = threading.Semaphore(slots)
        self._lock = threading.Lock()
        self._admitted, self._limit = 0, slots + queue

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self._lock:
            if self._admitted >= self._limit:
                raise Overloaded(
                    "the server is checking too many passwords at once",
                    retry_after_s=1.0,
                    hint="try again in a moment",
                )
            self._admitted += 1
        try:
            with self._running:
                yield
        finally:
            with self._lock:
                self._admitted -= 1


HASHING = HashSlots(HASH_SLOTS, HASH_QUEUE)


def check_login(ctx: ServiceContext, name: str, password: str) -> None:
    """Return when the password is right; else raise (the failure is committed and audited)."""
    now = ctx.clock.now()
    who = audit.Actor(name=name, source=ctx.actor.source)
    source = ctx.actor.source[:128]
    pair, address = (name, source), (ANY_NAME, source)
    with ctx.db.read() as session:
        wait = max(_blocked_for(session.get(LoginThrottle, key), now) for key in (pair, address))
        user = session.get(User, name)
        stored = user.password_hash if user is not None and not user.disabled else None
    if wait > 0:
        _audit_login(ctx, who, "throttled")
        raise _throttled(wait)
    try:
        with HASHING.slot():
            # The same argon2 work whether or not the user exists: no timing oracle.
            right = _verify(stored or _DUMMY_HASH, password) and stored is not None
            rehashed = hasher.hash(password) if right and hasher.check_needs_rehash(stored or "") else None
    except Overloaded:
        _audit_login(ctx, who, "throttled", {"reason": "busy"})
        raise
    with ctx.db.transaction() as session:
        if right:
            session.execute(delete(LoginThrottle).where(*_pair_is(name, source)))
            if rehashed is not None:
                session.execute(update(User).where(User.name == name).values(password_hash=rehashed))
            return
        failures = _count_failure(session, pair, now, FREE_FAILURES)
        _count_failure(session, address, now, FREE_FAILURES_PER_ADDRESS)
        audit.append(
            session, ctx.audit_key, who, "auth.login", f"user/{name}", outcome="failure",
            detail={"failures_from_address": failures},
        )  # fmt: skip
    raise Unauthenticated(BAD_CREDENTIALS, hint="check the user name and password")


def _blocked_for(throttle: LoginThrottle | None, now: datetime) -> float:
    if throttle is None or throttle.blocked_until is None:
        return 0.0
    return max(0.0, (throttle.blocked_until - now).total_seconds())


def _throttled(wait_s: float) -> Throttled:
    """The same answer, to the byte, whichever name is asked for: the wait is rounded up to whole
    lock periods, and no name is repeated."""
    rounded = LOCK_S * math.ceil(wait_s / LOCK_S)
    return Throttled(
        f"too many failed logins from this address: try again in {rounded:.0f} s",
        retry_after_s=rounded,
        hint="wait, then check the user name and password; other addresses are not affected",
    )


def _pair_is(name: str, source: str) -> tuple[Any, ...]:
    return LoginThrottle.user == name, LoginThrottle.source == source


def _audit_login(
    ctx: ServiceContext, who: audit.Actor, outcome: str, detail: dict[str, Any] | None = None
) -> None:
    with ctx.db.transaction() as session:
        audit.append(
            session, ctx.audit_key, who, "auth.login", f"user/{who.name}", outcome=outcome, detail=detail
        )


def _count_failure(session: Session, key: tuple[str, str], now: datetime, free: int) -> int:
    """One more failure of ``key`` (a name and an address, or ``ANY_NAME`` and an address); past
    ``free`` of them it waits, doubling."""
    throttle = session.get(LoginThrottle, key, with_for_update=True)
    if throttle is None:
        session.execute(
            delete(LoginThrottle).where(LoginThrottle.last_failure_at < now - FORGET_FAILURES_AFTER)
        )
        throttle = LoginThrottle(user=key[0], source=key[1], failures=0, blocked_until=None)
        session.add(throttle)
    throttle.failures += 1
    throttle.last_failure_at = now
    extra = throttle.failures - free
    if extra >= 0:
        throttle.blocked_until = now + timedelta(seconds=min(MAX_LOCK_S, LOCK_S * 2**extra))
    return throttle.failures


def _verify(password_hash: str, password: str) -> bool:
    try:
        return hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False
