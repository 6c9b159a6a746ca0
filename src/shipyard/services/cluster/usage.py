"""What each project, queue, user and accelerator type used: device-hours from the attempts' real
start and end (running ones counted up to now), per UTC day, priced with the catalog's and
``hardware.yaml``'s hourly prices — the showback Slurm's ``sreport`` and Kubecost give."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Literal

from sqlalchemy import or_, select

from shipyard.db import Attempt, Job
from shipyard.errors import InvalidSpec
from shipyard.schemas.views import UsageRowView, UsageView
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.planning import hardware_catalog

Grouping = Literal["project", "queue", "user", "type"]
GROUPINGS: tuple[Grouping, ...] = ("project", "queue", "user", "type")
MAX_DAYS = 366


def usage(
    ctx: ServiceContext, *, by: str = "project", since: datetime | None = None, until: datetime | None = None
) -> UsageView:
    """Device-hours and cost per ``by`` (and per day) between ``since`` (default: seven days
    before ``until``) and ``until`` (default: now), of the projects the caller may see."""
    if by not in GROUPINGS:
        raise InvalidSpec(f"cannot group usage by {by!r}", hint=f"use one of: {', '.join(GROUPINGS)}")
    until = until or datetime.now(UTC)
    since = since or until - timedelta(days=7)
    if not since < until:
        raise InvalidSpec(f"the window is empty: {since:%Y-%m-%d %H:%M} is not before {until:%Y-%m-%d %H:%M}",
                          hint="give --since a time in the past")  # fmt: skip
    if until - since > timedelta(days=MAX_DAYS):
        raise InvalidSpec(f"the window is longer than {MAX_DAYS} days", hint="give a later --since")
    prices = {key: spec.hourly_usd for key, spec in hardware_catalog(ctx.settings).items()}
    days = _days(since, until)
    first_midnight = datetime.combine(days[0], datetime.min.time(), UTC).timestamp()
    window = (since.timestamp(), until.timestamp())
    column = GROUPINGS.index(by)
    hours: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    costs: dict[str, float] = defaultdict(float)
    attempts: dict[str, int] = defaultdict(int)
    unpriced: set[str] = set()
    with ctx.db.read() as session:
        visible = rbac.visible_projects(session, ctx.actor)
        query = (
            select(Job.project, Job.queue, Job.owner, Attempt.accelerator_type, Attempt.device_ids,
                   Attempt.started_at, Attempt.finished_at)
            .join(Job, Attempt.job_id == Job.id)
            .where(Attempt.started_at < until)
            .where(or_(Attempt.finished_at.is_(None), Attempt.finished_at > since))
        )  # fmt: skip
        if visible is not None:
            query = query.where(Job.project.in_(visible))
        for *keys, device_ids, started, finished in session.execute(query):
            key, kind = keys[column], keys[3]
            devices = len(device_ids or []) or 1
            attempts[key] += 1
            price = prices.get(kind)
            if price is None:
                unpriced.add(kind)
            start = max(started.timestamp(), window[0])
            end = min(finished.timestamp() if finished else window[1], window[1])
            per_day = hours[key]
            for day, span_s in _by_day(start, end, first_midnight):
                per_day[day] += devices * span_s / 3600
            costs[key] += devices * max(0.0, end - start) / 3600 * (price or 0.0)
    rows = [
        UsageRowView(
            key=key, device_hours=round(sum(per_day), 4),
            cost_usd=None if by == "type" and key in unpriced else round(costs[key], 2),
            attempts=attempts[key], by_day=[round(value, 4) for value in per_day],
        )
        for key, per_day in hours.items()
    ]  # fmt: skip
    rows.sort(key=lambda row: (-row.device_hours, row.key))
    return UsageView(
        by=by, since=since, until=until, days=[day.isoformat() for day in days], rows=rows,
        device_hours=round(sum(row.device_hours for row in rows), 4),
        cost_usd=round(sum(row.cost_usd or 0.0 for row in rows), 2),
        unpriced_types=sorted(unpriced),
    )  # fmt: skip


def _days(since: datetime, until: datetime) -> list[date]:
    first, last = since.astimezone(UTC).date(), (until - timedelta(microseconds=1)).astimezone(UTC).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def _by_day(start: float, end: float, first_midnight: float) -> Iterator[tuple[int, float]]:
    """The seconds of [start, end) falling on each UTC day, by the day's index from the first."""
    while start < end:
        day = int((start - first_midnight) // 86400)
        stop = min(end, first_midnight + (day + 1) * 86400)
        yield day, stop - start
        start = stop
