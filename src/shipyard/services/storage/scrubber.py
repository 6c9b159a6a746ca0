"""The background scrubber: every blob's replicas checked and repaired without an admin.

Two kinds of pass, as Ceph scrubs: a light one every ``scrub.light_interval_s`` (a minute) that
sees every copy exists and restores the missing ones from a checked copy, and a deep one every
``scrub.interval_h`` (a week) that reads every copy in full, resumable (its position is kept in
the home, so a restarted agent or server carries on where the last one stopped). Damage a read
found (``store_health``) starts the pass it needs at once. Both read and copy at most
``scrub.rate_mb_s``, so that they never starve training of disk bandwidth.

Both the agent and the server run it; a lock file lets one of them scrub at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field

from sqlalchemy import select

from shipyard import audit
from shipyard.db import StoredBlob
from shipyard.durable import write_json_atomic
from shipyard.services.context import ServiceContext
from shipyard.services.storage import health as store_health
from shipyard.services.storage import manifests
from shipyard.services.storage.catalog import blob_of
from shipyard.storage import config as storage_config
from shipyard.storage.backend import ScrubTally
from shipyard.storage.opening import open_store

STATE_FILE = "scrub-state.json"
LOCK_FILE = "scrub.lock"
BATCH = 32
"""Blobs read from the catalog at a time."""
IDLE_LOOK_S = 60.0
TAKE_OVER_S = 2.0
"""How often a process waiting to scrub asks for the lock that another holds."""

_log = logging.getLogger(__name__)


@dataclass
class PassState:
    cursor: str = ""
    """The last blob name of this pass that was scrubbed (blobs go in name order)."""
    started_at: float | None = None
    finished_at: float | None = None
    """When the last whole pass ended."""
    tally: dict[str, int] = field(default_factory=dict)
    light_at: float | None = None
    """When the last light pass ended."""
    light: dict[str, int] = field(default_factory=dict)
    """What it found (``missing`` copies, ``repaired``, ``corrupt`` sources, ``lost`` blobs)."""


def scrub_in_background(ctx: ServiceContext, stopping: threading.Event) -> None:
    """Scrub pass after pass until ``stopping`` is set. One process of a home scrubs at a time;
    the others look again every ``TAKE_OVER_S``, so that when it dies (an agent killed, a
    server stopped) another carries on within seconds, not at its own restart."""
    home = ctx.settings.home
    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK_FILE, "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stopping.wait(TAKE_OVER_S):
                    return
        while not stopping.is_set():
            try:
                wait = scrub_some(ctx, stopping)
            except Exception:  # a store or database that fails now may work at the next look
                _log.exception("the scrubber's pass failed; it looks again in %.0f s", IDLE_LOOK_S)
                wait = IDLE_LOOK_S
            stopping.wait(wait)


def scrub_some(ctx: ServiceContext, stopping: threading.Event) -> float:
    """A light pass when one is due or owed, else the next batch of the deep pass (starting one
    if it is due or owed); returns how long to wait before the next call."""
    home = ctx.settings.home
    config = storage_config.load(home).scrub
    state = _load(ctx)
    now = ctx.clock.now().timestamp()
    debt = store_health.owed(home)
    light_in = _light_due_in(ctx, state, config.light_interval_s, now)
    # Copies seen missing since the last light pass start one now; bytes seen damaged start the
    # deep pass instead (it restores missing copies too), which light passes must not starve.
    light_owed = debt is not None and not debt.deep and (state.light_at or 0) < debt.latest
    if light_in is not None and (light_in <= 0 or light_owed):
        _light_pass(ctx, state, config.rate_mb_s, stopping)
        return 0.0
    if state.started_at is None and not (debt is not None and debt.deep):
        due_in = (state.finished_at or 0) + config.interval_h * 3600 - now
        if state.finished_at is not None and due_in > 0:
            return min(due_in, IDLE_LOOK_S, light_in if light_in is not None else IDLE_LOOK_S)
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


def _light_due_in(ctx: ServiceContext, state: PassState, interval_s: float, now: float) -> float | None:
    """Seconds until the next light pass (0 or less: due), or None where none runs (an object
    store keeps its own copies; ``light_interval_s`` 0)."""
    if interval_s <= 0 or storage_config.load(ctx.settings.home).backend != "local":
        return None
    return (state.light_at or 0) + interval_s - now


def _light_pass(ctx: ServiceContext, state: PassState, rate_mb_s: float, stopping: threading.Event) -> None:
    """See that every copy of every blob exists; restore the missing ones from a checked copy."""
    home, began = ctx.settings.home, ctx.clock.now().timestamp()
    with ctx.db.read() as session:
        rows = [(blob_of(row), row.replicas) for row in session.scalars(select(StoredBlob))]
    store = open_store(home)
    tally = ScrubTally()
    for blob, replicas in rows:
        if stopping.is_set():
            return  # not settled: the next run passes again
        found = store.blobs.scrub(blob, replicas, repair=True, verify=False)
        tally.add(found)
        if found.repaired:  # copying, rate-limited as reading is
            stopping.wait(found.repaired * blob.size_bytes / (rate_mb_s * 2**20))
    with ctx.db.transaction() as session:  # the manifests a root took with it, too
        copies = manifests.heal(store, session, repair=True)
    state.light_at = ctx.clock.now().timestamp()
    counted = ("checked", "missing", "repaired", "corrupt", "lost")
    seen = {name: getattr(tally, name) for name in counted} | {"manifests_missing": copies.missing}
    store_health.settle(home, deep=False, began=began)
    if tally.corrupt:  # a source that failed its check: read everything (a lost blob, no copy
        store_health.owe(home, deep=True)  # left at all, is reported: no pass can bring it back)
    # Audited when it repaired something or found the store otherwise than the last pass did,
    # not every minute while one blob stays lost.
    damage = {name: seen[name] for name in ("missing", "corrupt", "lost", "manifests_missing")}
    before = {name: state.light.get(name, 0) for name in damage}
    if any(damage.values()) and (tally.repaired or copies.repaired or damage != before):
        record_scrub(ctx, repair=True, counts={"light": 1, **seen}, background=True)
    state.light = seen
    _save(ctx, state)


def _finish(ctx: ServiceContext, state: PassState) -> None:
    """Heal the manifests, audit the whole pass (as ``storage scrub --repair`` is), and wait for
    the next."""
    with ctx.db.transaction() as session:
        copies = manifests.heal(open_store(ctx.settings.home), session, repair=True)
    state.tally["manifests_missing"] = copies.missing
    record_scrub(ctx, repair=True, counts=state.tally, background=True)
    store_health.settle(ctx.settings.home, deep=True, began=state.started_at or 0.0)
    _save(
        ctx,
        PassState(
            finished_at=ctx.clock.now().timestamp(),
            tally=state.tally,
            light_at=state.light_at,
            light=state.light,
        ),
    )


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
