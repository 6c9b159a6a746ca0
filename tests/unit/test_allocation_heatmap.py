"""The nodes page's heatmap: each column is a whole clock hour, labelled by its start, and its
caption says from which day and hour (an attempt at 06:11-06:19 was once drawn under "05:00")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shipyard.db.tables import Attempt, Job
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.schemas.views import NodeView
from shipyard.services.cluster import cluster
from shipyard.services.context import ServiceContext
from shipyard.services.jobs import jobs
from tests.builders import spec_dict


def test_an_attempt_is_drawn_under_the_clock_hour_it_ran_in(ctx: ServiceContext) -> None:
    job_id = jobs.submit(ctx, validate_job_spec(spec_dict())).id
    last_hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    started = last_hour + timedelta(minutes=11)
    with ctx.db.transaction() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.add(
            Attempt(
                job_id=job_id, number=1, state="succeeded", accelerator_type="cpu", device_ids=[0],
                threads_per_process=1, node="n1", log_path="/dev/null", started_at=started,
                finished_at=started + timedelta(minutes=8),
            )
        )  # fmt: skip
    node = NodeView(
        id="n1", up=True, capacity={"cpu": 2}, used={}, memory_gib={"cpu": 16.0}, labels={}, jobs=[]
    )
    heatmap = cluster.allocation_by_hour(ctx, [node], hours=24)
    held = dict(zip(heatmap["hours"], heatmap["rows"]["n1"], strict=True))
    assert held[last_hour.strftime("%H:00")] == pytest.approx(0.5 * 8 / 60)  # 1 of 2 cores for 8 minutes
    assert sum(held.values()) == pytest.approx(0.5 * 8 / 60)  # and in no other column
    assert heatmap["hours"][-1] == datetime.now(UTC).strftime("%H:00")  # the current hour is the last
    assert heatmap["since"] == (last_hour - timedelta(hours=22)).strftime("%Y-%m-%d %H:00")
