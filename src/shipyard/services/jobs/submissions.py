"""The submission writer: a server process's concurrent submissions checked and written in
batches (group commit), in a thread of its own."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from shipyard.db import Database
from shipyard.schemas.jobspec import JobSpec, validate_job_spec
from shipyard.schemas.views import JobView
from shipyard.services.context import ServiceContext
from shipyard.services.jobs.jobs import insert_jobs, submitted_before
from shipyard.services.jobs.submission_checks import Checked, check_submission

_log = logging.getLogger("shipyard.jobs")


@dataclass(frozen=True, slots=True)
class Submission:
    """A submission as a request makes it, before any check."""

    ctx: ServiceContext
    spec: JobSpec | dict[str, Any]
    """The spec, or the document a request sent, validated here (off the request's event loop)."""
    resume: bool = False
    resume_from: str | None = None
    idempotency_key: str | None = None
    """The client's key: a retried request with the same key answers the job the first made."""


class SubmissionWriter:
    """Admits and writes the submissions of one server process's concurrent requests together,
    in a thread of its own: one transaction, one advance of the audit head and one multi-row
    insert per batch instead of per job (group commit). A request's future is done once its
    batch commits, so its answer still means the job is stored; a submission that fails its
    checks fails alone, and a batch that fails to write is retried one submission at a time.

    The checks run here too, so that an async request hands its submission over once and
    awaits the answer: no trip through the request thread pool on the way."""

    def __init__(self, db: Database, *, max_batch: int = 64) -> None:
        self._db, self._max_batch = db, max_batch
        self._pending: queue.SimpleQueue[tuple[Submission, Future[JobView]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="submission-writer", daemon=True)
        self._thread.start()

    def submit(self, submission: Submission) -> Future[JobView]:
        done: Future[JobView] = Future()
        self._pending.put((submission, done))
        return done

    def close(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (first := self._pending.get()) is not None:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._pending.put(None)  # stop after this batch
                    break
                batch.append(item)
            self._commit(self._check(batch))

    @staticmethod
    def _check(batch: list[tuple[Submission, Future[JobView]]]) -> list[tuple[Checked, Future[JobView]]]:
        checked = []
        for s, done in batch:
            # A request cancelled while it waited (its client went away) is not written. Once
            # running, a future can no longer be cancelled, so its answer can always be set.
            if not done.set_running_or_notify_cancel():
                continue
            try:
                spec = s.spec if isinstance(s.spec, JobSpec) else validate_job_spec(s.spec)
                if s.idempotency_key and (before := submitted_before(s.ctx, s.idempotency_key, spec)):
                    done.set_result(before)
                    continue
                passed = check_submission(s.ctx, spec, s.resume, s.resume_from)
                checked.append((dataclasses.replace(passed, idempotency_key=s.idempotency_key), done))
            except Exception as exc:  # the request's error, raised where it awaits the answer
                done.set_exception(exc)
        return checked

    def _commit(self, batch: list[tuple[Checked, Future[JobView]]]) -> None:
        if not batch:
            return
        try:
            views = insert_jobs(self._db, [submission for submission, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                first, done = batch[0]
                # Two requests with one key in flight at once: the second finds the first's job.
                key = first.idempotency_key
                before = submitted_before(first.ctx, key, first.spec) if key else None
                if before is not None:
                    done.set_result(before)
                else:
                    done.set_exception(exc)
            else:
                for item in batch:
                    self._commit([item])
            return
        for (_, done), view in zip(batch, views, strict=True):
            done.set_result(view)
        ctx = batch[0][0].ctx
        if ctx.start_agent is not None:
            try:
                ctx.start_agent(ctx.settings)
            except OSError as exc:  # the jobs are stored; the next submission tries again
                _log.warning("could not start the local agent: %s", exc)
