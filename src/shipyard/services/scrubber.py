"""The background scrubber: every blob's replicas verified and repaired without an admin, one
pass per ``scrub.interval_h`` of storage.yaml, at most ``scrub.rate_mb_s`` so that it never
starves training of disk bandwidth, and resumable: the pass's position is kept in the home, so
a restarted agent or server carries on where the last one stopped.

Both the agent and the server run it; a lock file lets one of them scrub at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
from dataclasses import asdict, dataclass, field

from sqlalchemy import select

from shipyard import audit
from shipyard.db import StoredBlob
from shipyard.schemas.launch import write_json_atomic
from shipyard.services import manifests
from shipyard.services.context import ServiceContext
from shipyard.services.storage import blob_of
from shipyard.storage import config as storage_config
from shipyard.storage.backend import ScrubTally
from shipyard.storage.opening import open_store

STATE_FILE = "scrub-state.json"
LOCK_FILE = "scrub.lock"
BATCH = 32
"""Blobs read from the catalog at a time."""
IDLE_LOOK_S = 60.0


@dataclass
class PassState:
    cursor: str = ""
    """The last blob name of this pass that was scrubbed (blobs go in name order)."""
    started_at: float | None = None
    finished_at: float | None = None
    """When the last whole pass ended."""
    tally: dict[str, int] = field(default_factory=dict)


def scrub_in_background(ctx: ServiceContext, stopping: threading.Event) -> None:
    """Scrub pass after pass until ``stopping`` is set (or return at once if another process of
    this home scrubs)."""
    home = ctx.settings.home
    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        while not stopping.is_set():
            try:
                wait = scrub_some(ctx, stopping)
            except Exception:  # a store or database that fails now may work at the next look
                wait = IDLE_LOOK_S
            stopping.wait(wait)


def scrub_some(ctx: ServiceContext, stopping: threading.Event) -> float:
    """Scrub the next batch of the current pass (starting one if it is due); returns how long to
    wait before the next call."""
    config = storage_config.load(ctx.settings.home).scrub
    state = _load(ctx)
    now = time.time()
    if state.finished_at is not None and state.cursor == "" and state.started_at is None:
        due_in = state.finished_at + config.interval_h * 3600 - now
        if due_in > 0:
            return min(due_in, IDLE_LOOK_S)
    if state.started_at is None:
        state.started_at, state.tally = now, {}
    with ctx.db.read() as session:
        rows = session.scalars(
            select(StoredBlob).where(StoredBlob.name > state.cursor).order_by(StoredBlob.name).limit(BATCH)
        ).all()
        batch = [(blob_of(row), row.replicas) for row in rows]
    if not batch:
        _finish(ctx, state)
        return 0.0
    store = open_store(ctx.settings.home)
    budget = config.rate_mb_s * 2**20
    tally = ScrubTally()
    for blob, replicas in batch:
        if stopping.is_set():
            break
        began = time.monotonic()
        tally.add(store.blobs.scrub(blob, replicas, repair=True))
        state.cursor = blob.name
        # Rate-limited: each blob takes at least its size over the budget.
        stopping.wait(max(0.0, blob.size_bytes / budget - (time.monotonic() - began)))
    for name in ("checked", "corrupt", "missing", "repaired", "lost", "bytes_verified"):
        state.tally[name] = state.tally.get(name, 0) + getattr(tally, name)
    _save(ctx, state)
    return 0.0


def _finish(ctx: ServiceContext, state: PassState) -> None:
    """Heal the manifests, audit the whole pass (as ``storage scrub --repair`` is), and wait for
    the next."""
    with ctx.db.transaction() as session:
        copies = manifests.heal(open_store(ctx.settings.home), session, repair=True)
    state.tally["manifests_missing"] = copies.missing
    record_scrub(ctx, repair=True, counts=state.tally, background=True)
    _save(ctx, PassState(finished_at=time.time(), tally=state.tally))


def record_scrub(ctx: ServiceContext, *, repair: bool, counts: dict[str, int], background: bool) -> None:
    """The audit record of one scrub: what it found and whether it repaired it."""
    with ctx.db.transaction() as session:
        audit.append(
            session,
            ctx.audit_key,
            ctx.actor,
            "storage.scrub",
            "storage",
            outcome="ok" if not counts.get("lost") else "lost",
            detail={"repair": repair, "background": background, **counts},
        )


def last_pass(ctx: ServiceContext) -> PassState:
    """Where the background scrubber is: the pass under way, or the last one finished."""
    return _load(ctx)


def _load(ctx: ServiceContext) -> PassState:
    path = ctx.settings.home / STATE_FILE
    with contextlib.suppress(OSError, ValueError, TypeError):
        return PassState(**json.loads(path.read_text()))
    return PassState()


def _save(ctx: ServiceContext, state: PassState) -> None:
    write_json_atomic(ctx.settings.home / STATE_FILE, asdict(state))
