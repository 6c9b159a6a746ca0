"""Job claiming on SQLite and PostgreSQL when several agents race over the same queue."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shipyard.services.context import open_context
from shipyard.settings import Settings

pytestmark = pytest.mark.integration  # real servers, databases or processes


def test_concurrent_agents_claim_each_queued_job_once(tmp_path: Path, db_url: str) -> None:
    """Agents racing over the same queue (SKIP LOCKED on PostgreSQL): every job started once."""
    from shipyard.agent.leasing import claim
    from shipyard.db import Job
    from shipyard.domain import JobState

    ctx = open_context(Settings(home=tmp_path / "home", db_url=db_url))
    try:
        with ctx.db.transaction() as session:
            for i in range(40):
                session.add(
                    Job(id=f"j{i}", name="j", project="p", queue="default", state=JobState.QUEUED, spec={},
                        devices=1, accelerator_types=["cpu"], run_dir="/nonexistent")
                )  # fmt: skip
        claims: list[str] = []
        lock = threading.Lock()

        def agent() -> None:
            for i in range(40):
                with ctx.db.transaction() as session:
                    job = session.get(Job, f"j{i}")
                    assert job is not None
                    if claim(session, job, datetime.now(UTC)):
                        with lock:
                            claims.append(job.id)

        threads = [threading.Thread(target=agent) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(claims) == sorted(f"j{i}" for i in range(40))
    finally:
        ctx.close()
