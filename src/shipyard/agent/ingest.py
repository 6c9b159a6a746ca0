"""The records a running attempt writes, taken into the database: metrics rows for the charts and
summaries, and each finite figure as a point of its own series."""

from __future__ import annotations

import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from shipyard.agent.outputs import keep_stored_only, record_checkpoint
from shipyard.db import Attempt, Metric, MetricPoint
from shipyard.executors.base import (
    Synced,
)
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    checkpoint_step,
    latest_checkpoint,
)
from shipyard.services.context import ServiceContext
from shipyard.services.storage import storage

_log = logging.getLogger("shipyard.agent")


def collect(ctx: ServiceContext, session: Session, attempt: Attempt, synced: Synced) -> None:
    """What the attempt wrote since the last pass: its metrics and its newest checkpoint,
    recorded at once so that the committer commits it to the artifact store while the attempt
    runs (a SIGKILL or a lost node or disk then loses at most one checkpoint interval). Where
    its nodes stored the checkpoint themselves, what is recorded is its files' records."""
    run_dir = Path(attempt.job.run_dir)
    ingest_metrics(session, attempt)
    if (stored := synced.checkpoint) is not None:
        folder = keep_stored_only(run_dir / CHECKPOINT_DIR, stored)
        sealed = storage.sealed(ctx, list(stored.files))
        record_checkpoint(session, attempt.job, folder, checkpoint_step(folder), written=sealed)
        return  # it is the newest now, recorded in this transaction
    newest = latest_checkpoint(run_dir / CHECKPOINT_DIR)
    if newest is None or RECORDED.get(attempt.id) == newest:
        return
    if record_checkpoint(session, attempt.job, newest, checkpoint_step(newest)):
        RECORDED[attempt.id] = newest  # committed before: not looked up again at every pass


RECORDED: dict[int, Path] = {}
"""Each running attempt's newest checkpoint, once found recorded by an earlier transaction: a pass
over thousands of attempts would otherwise look each one's up again."""


def ingest_metrics(session: Session, attempt: Attempt) -> None:
    """Copy the complete lines the runtime appended to metrics.jsonl since the last look."""
    path = Path(attempt.job.run_dir) / METRICS_FILE
    if not path.exists():
        return
    if path.stat().st_size < attempt.metrics_offset:
        attempt.metrics_offset = 0  # a fresh start truncated the file
    with open(path, "rb") as f:
        f.seek(attempt.metrics_offset)
        chunk = f.read()
    complete = chunk[: chunk.rfind(b"\n") + 1]
    points: list[dict[str, Any]] = []
    for line in complete.splitlines():
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
            kind, step = record.get("kind", "train"), record.get("step", 0)
            if not (isinstance(kind, str) and len(kind) <= 32):
                raise ValueError("kind is not a short string")
            if not (isinstance(step, int) and 0 <= step < 2**62):
                raise ValueError("step is not a step number")
            figures = {key: _figure(record.get(key)) for key in ("loss", "tokens_per_s", "mfu")}
        except ValueError:  # half a line a killed attempt left, or a damaged one: one record lost
            if line.strip():
                _log.warning(
                    "job %s: a metrics line is not a record of the runtime, skipped: %.80r",
                    attempt.job_id,
                    line,
                )
            continue
        session.add(
            Metric(
                job_id=attempt.job_id, attempt_id=attempt.id, kind=kind, step=step, values=record, **figures
            )
        )
        at = record.get("time") if isinstance(record.get("time"), int | float) else time.time()
        where = {"job_id": attempt.job_id, "attempt_id": attempt.id, "step": step, "at": at}
        points.extend({**where, "name": name, "value": value} for name, value in series_points(kind, record))
    if points:
        session.execute(insert(MetricPoint), points)
    attempt.metrics_offset += len(complete)


SERIES_EVENTS = frozenset({"start", "resume", "checkpoint"})
"""Record kinds that mark an event rather than measure a step: none of their numbers is a series."""
MAX_SERIES_PER_RECORD = 64


def series_points(kind: str, record: dict[str, Any]) -> list[tuple[str, float]]:
    """The named scalars one metrics record adds to the job's series: every finite number in it
    (a training step's under their own names, another kind's after the kind: ``eval_loss``), at
    most 64, names of letters, digits and ``_./-`` up to 64 characters; anything else is not a
    series and is left in the record."""
    if kind in SERIES_EVENTS:
        return []
    points = []
    for key, value in record.items():
        if key in ("kind", "step", "time") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = key if kind == "train" else f"{kind}_{key}"
        if not (math.isfinite(value) and _SERIES_NAME.fullmatch(name)):
            continue
        points.append((name, float(value)))
        if len(points) == MAX_SERIES_PER_RECORD:
            break
    return points


_SERIES_NAME = re.compile(r"[A-Za-z0-9_./-]{1,64}")


def _figure(value: object) -> float | None:
    """A metric's number as the database keeps it (None where the runtime logged none)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{value!r} is out of range") from None
