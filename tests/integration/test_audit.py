"""The audit log's hash chain on SQLite and PostgreSQL: every kind of tampering is named."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from shipyard import audit
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.jobs import submissions
from shipyard.settings import Settings
from tests.conftest import Cli

pytestmark = pytest.mark.integration  # real servers, databases or processes

ACTOR = audit.Actor(name="alice", source="127.0.0.1")


@pytest.fixture
def ctx(tmp_path: Path, db_url: str) -> Iterator[ServiceContext]:
    context = open_context(Settings(home=tmp_path / "home", db_url=db_url))
    yield context
    context.close()


def write(ctx: ServiceContext, count: int, actor: audit.Actor = ACTOR) -> None:
    for i in range(count):
        with ctx.db.transaction() as session:
            audit.append(
                session,
                ctx.audit_key,
                actor,
                "model.download",
                f"model/llama-{i}:1",
                detail={"bytes": 1000 + i, "note": "quote ' and -- and ; DROP TABLE"},
            )


def sql(ctx: ServiceContext, statement: str) -> None:
    with ctx.db.engine.begin() as connection:
        connection.execute(text(statement))


def verdict(ctx: ServiceContext) -> audit.Verdict:
    return audit.verify_log(ctx.db, ctx.audit_key)


def test_an_untouched_chain_verifies(ctx: ServiceContext) -> None:
    write(ctx, 5)
    assert verdict(ctx) == audit.Verdict(True, 5, 5)


def test_a_modified_record_is_named(ctx: ServiceContext) -> None:
    write(ctx, 5)
    sql(ctx, "UPDATE audit_log SET actor = 'mallory' WHERE seq = 3")
    found = verdict(ctx)
    assert (found.ok, found.first_bad, found.problem) == (False, 3, "record 3 was modified")


def test_a_deleted_record_is_named(ctx: ServiceContext) -> None:
    write(ctx, 5)
    sql(ctx, "DELETE FROM audit_log WHERE seq = 3")
    found = verdict(ctx)
    assert (found.first_bad, found.problem) == (3, "records 3..3 are missing (deleted)")


def test_records_cut_off_the_end_are_named(ctx: ServiceContext) -> None:
    write(ctx, 5)
    sql(ctx, "DELETE FROM audit_log WHERE seq >= 4")
    found = verdict(ctx)
    assert found.first_bad == 4
    assert found.problem == "records 4..5 are missing: the signed head is at 5 (deleted)"


def test_an_inserted_record_is_named(ctx: ServiceContext) -> None:
    write(ctx, 5)
    # A forger copies a genuine record's hash and signature onto a new row.
    sql(
        ctx,
        "INSERT INTO audit_log (seq, at, actor, action, resource, source, outcome, detail, prev_hash, "
        "hash, mac) SELECT 6, at, 'mallory', action, resource, source, outcome, detail, hash, hash, mac "
        "FROM audit_log WHERE seq = 5",
    )
    found = verdict(ctx)
    assert (found.first_bad, found.problem) == (6, "record 6 lies beyond the signed head (5): inserted")


def test_reordered_records_are_named(ctx: ServiceContext) -> None:
    write(ctx, 5)
    sql(ctx, "UPDATE audit_log SET seq = -2 WHERE seq = 2")
    sql(ctx, "UPDATE audit_log SET seq = 2 WHERE seq = 3")
    sql(ctx, "UPDATE audit_log SET seq = 3 WHERE seq = -2")
    found = verdict(ctx)
    assert found.first_bad == 2
    assert found.problem == "record 2 does not follow record 1 (deleted, inserted or reordered)"


def test_a_rewritten_head_is_detected(ctx: ServiceContext) -> None:
    write(ctx, 3)
    sql(ctx, "UPDATE audit_head SET seq = 2")
    assert verdict(ctx).problem == "the chain head's signature does not match (head altered)"


def test_string_fields_are_stored_verbatim(ctx: ServiceContext) -> None:
    write(ctx, 1, audit.Actor(name="o'brien; --", source='x"y'))
    with ctx.db.transaction() as session:
        record = session.get(audit.AuditRecord, 1)
        assert record is not None
        assert (record.actor, record.source) == ("o'brien; --", 'x"y')
        assert record.detail["note"] == "quote ' and -- and ; DROP TABLE"
    assert verdict(ctx).ok


def test_concurrent_writers_keep_one_chain(tmp_path: Path, db_url: str) -> None:
    """Six connections append at once (on SQLite a head read before the write lock was taken let
    two of them extend the same head)."""
    ctx = open_context(Settings(home=tmp_path / "home", db_url=db_url))
    try:
        errors: list[BaseException] = []

        def writer(n: int) -> None:
            try:
                write(ctx, 25, audit.Actor(name=f"writer-{n}", source="test"))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert verdict(ctx) == audit.Verdict(True, 150, 150)
    finally:
        ctx.close()


def test_batched_submissions_are_each_stored_once_in_one_chain(tmp_path: Path, db_url: str) -> None:
    """The server's group commit: eight threads submit through one writer; every answer is a
    stored job, each job has one audit record, and the chain holds."""
    from shipyard.db import AuditRecord, Job
    from shipyard.schemas.jobspec import validate_job_spec
    from tests.builders import spec_dict

    ctx = open_context(Settings(home=tmp_path / "home", db_url=db_url))
    writer = submissions.SubmissionWriter(ctx.db)
    spec = validate_job_spec(spec_dict())
    answers: list[str] = []
    lock = threading.Lock()
    try:

        def client(n: int) -> None:
            mine = ctx.acting_as(audit.Actor(name=f"local:client-{n}", source="test", is_admin=True))
            for _ in range(25):
                view = writer.submit(submissions.Submission(mine, spec)).result()
                with lock:
                    answers.append(view.id)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with ctx.db.transaction() as session:
            stored = set(session.scalars(select(Job.id)))
            submitted = list(
                session.scalars(select(AuditRecord.resource).where(AuditRecord.action == "job.submit"))
            )
        assert len(answers) == 200 and set(answers) == stored
        assert sorted(submitted) == sorted(f"job/{job_id}" for job_id in answers)
        assert verdict(ctx) == audit.Verdict(True, 200, 200)
    finally:
        writer.close()
        ctx.close()


def test_one_bad_submission_in_a_batch_fails_alone(tmp_path: Path, postgres_url: str) -> None:
    """PostgreSQL refuses a NUL character in text: that submission's batch is retried one by one,
    so only it fails and the others are stored."""
    from shipyard.db import Job
    from shipyard.schemas.jobspec import validate_job_spec
    from shipyard.services.jobs import jobs
    from shipyard.services.jobs.submission_checks import check_submission
    from tests.builders import spec_dict

    ctx = open_context(Settings(home=tmp_path / "home", db_url=postgres_url))
    writer = submissions.SubmissionWriter(ctx.db)
    spec = validate_job_spec(spec_dict())
    try:
        names = [f"local:ok-{n}" for n in range(15)] + ["local:bad\x00name"]
        actors = [ctx.acting_as(audit.Actor(n, "test", is_admin=True)) for n in names]
        admitted = [check_submission(actor, spec, False, None) for actor in actors]
        # One batch, as the writer's thread forms it from requests that arrive together.
        batch = [(a, Future[jobs.JobView]()) for a in admitted]
        writer._commit(batch)
        outcomes = [_outcome(done) for _, done in batch]
        assert [o for o in outcomes if not o.startswith("tiny-")] == ["DataError"]
        with ctx.db.transaction() as session:
            assert sorted(session.scalars(select(Job.owner))) == sorted(names[:-1])
        assert verdict(ctx) == audit.Verdict(True, 15, 15)
    finally:
        writer.close()
        ctx.close()


def _outcome(done: Future[Any]) -> str:
    error = done.exception(timeout=60)
    return type(error).__name__ if error else str(done.result().id)


def test_the_cli_exits_1_naming_the_record_and_exports_jsonl(cli: Cli, tmp_path: Path, db_url: str) -> None:
    cli.env["SHIPYARD_DB_URL"] = db_url
    ctx = open_context(Settings(home=cli.home, db_url=db_url))
    write(ctx, 4)
    assert "audit log intact: 4 records" in cli.run("audit", "verify").stdout
    out = tmp_path / "audit.jsonl"
    cli.run("audit", "export", "--since", "2000-01-01", "--out", str(out))
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and '"action": "model.download"' in lines[0]

    sql(ctx, "UPDATE audit_log SET outcome = 'denied' WHERE seq = 2")
    ctx.close()
    done = cli.run("audit", "verify", check=False)
    assert done.returncode == 1
    assert "Error: audit log broken at record 2: record 2 was modified" in done.stderr
    assert "Traceback" not in done.stderr
    assert cli.run("audit", "verify", "--json", check=False).returncode == 1
    refused = cli.run("audit", "export", check=False)
    assert refused.returncode == 1 and "broken at record 2" in refused.stderr
