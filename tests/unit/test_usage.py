"""Usage and cost accounting against a case computed by hand: device-hours from the attempts' real
start and end, split at UTC midnight, running attempts counted up to now, priced per type, and
only the caller's projects unless an admin asks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shipyard import audit
from shipyard.db import Attempt
from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import catalog
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.accounts import accounts, rbac
from shipyard.services.cluster.usage import usage
from shipyard.services.context import ServiceContext
from shipyard.services.jobs import jobs
from tests.builders import spec_dict

MIDNIGHT = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
H100_PER_H = catalog()["h100-sxm"].price_usd_per_h  # the catalog's rental price


def _attempt(
    ctx: ServiceContext, project: str, kind: str, devices: int, start: datetime, end: datetime | None
) -> None:
    job_id = jobs.submit(ctx, validate_job_spec(spec_dict(project=project))).id
    with ctx.db.transaction() as session:
        session.add(
            Attempt(
                job_id=job_id, number=1, state="running" if end is None else "succeeded",
                accelerator_type=kind, device_ids=list(range(devices)), threads_per_process=1, node="n1",
                log_path="/dev/null", started_at=start, finished_at=end,
            )
        )  # fmt: skip


@pytest.fixture
def history(ctx: ServiceContext) -> ServiceContext:
    # a: 2 H100s from 22:00 to 02:00 across midnight (4 h x 2 = 8 device-hours, 4 on each day)
    _attempt(ctx, "a", "h100-sxm", 2, MIDNIGHT - timedelta(hours=2), MIDNIGHT + timedelta(hours=2))
    # a: one that ended three weeks ago, outside the window
    _attempt(ctx, "a", "h100-sxm", 8, MIDNIGHT - timedelta(days=21), MIDNIGHT - timedelta(days=20))
    # b: a CPU job on 3 cores, running for the last 2 hours (no price for cpu)
    _attempt(ctx, "b", "cpu", 3, datetime.now(UTC) - timedelta(hours=2), None)
    return ctx


def test_usage_equals_the_hand_computed_case(history: ServiceContext) -> None:
    view = usage(history, by="project")
    rows = {row.key: row for row in view.rows}
    assert set(rows) == {"a", "b"}
    assert rows["a"].device_hours == pytest.approx(8.0)
    assert rows["a"].cost_usd == pytest.approx(8.0 * H100_PER_H)
    assert rows["b"].device_hours == pytest.approx(6.0, abs=0.01)  # 3 cores x 2 h, up to now
    per_day = dict(zip(view.days, rows["a"].by_day, strict=True))
    assert per_day[(MIDNIGHT - timedelta(days=1)).date().isoformat()] == pytest.approx(4.0)
    assert per_day[MIDNIGHT.date().isoformat()] == pytest.approx(4.0)
    assert view.cost_usd == pytest.approx(8.0 * H100_PER_H) and view.unpriced_types == ["cpu"]
    by_type = {row.key: row for row in usage(history, by="type").rows}
    assert by_type["cpu"].cost_usd is None  # unknown, not free
    wide = usage(history, since=MIDNIGHT - timedelta(days=30))
    assert {row.key: row.device_hours for row in wide.rows}["a"] == pytest.approx(8.0 + 8 * 24.0)


def test_a_member_sees_only_the_projects_they_hold_a_role_in(history: ServiceContext) -> None:
    accounts.create_user(history, "bea", "a long enough passphrase")
    rbac.grant(history, "b", "bea", "viewer")
    bea = history.acting_as(audit.Actor(name="bea", source="test"))
    assert [row.key for row in usage(bea).rows] == ["b"]


def test_a_wrong_grouping_or_window_is_refused_with_the_fix(ctx: ServiceContext) -> None:
    with pytest.raises(InvalidSpec, match="cannot group usage by 'team'"):
        usage(ctx, by="team")
    with pytest.raises(InvalidSpec, match="the window is empty"):
        usage(ctx, since=datetime.now(UTC) + timedelta(days=1))
