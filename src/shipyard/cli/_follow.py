"""Follow a job until it ends: a live progress bar (step, loss, tokens/s, ETA)."""

from __future__ import annotations

import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from shipyard.cli._jobs_backend import Jobs
from shipyard.cli._output import err_console
from shipyard.domain import JobState
from shipyard.schemas.views import JobView

POLL_S = 1.0
"""Seconds between looks at the job: slow enough not to slow training on a small machine."""


def follow(platform: Jobs, job_id: str) -> JobView:
    """Show progress on stderr until the job reaches a final state; returns its last view."""
    view = platform.status(job_id)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, refresh_per_second=2) as progress:
        task = progress.add_task(view.name, total=view.total_steps, stats="")
        while not JobState(view.state).is_final:
            progress.update(task, completed=view.step, stats=_stats(view))
            time.sleep(POLL_S)
            view = platform.status(job_id)
        progress.update(task, completed=view.step, stats=_stats(view))
    return view


def _stats(view: JobView) -> str:
    if view.state == JobState.QUEUED:
        return f"queued: {view.pending_reason or ''}"
    parts = [view.state]
    if view.loss is not None:
        parts.append(f"loss {view.loss:.3f}")
    if view.eval_loss is not None:
        parts.append(f"eval {view.eval_loss:.3f}")
    if view.tokens_per_s:
        parts.append(f"{view.tokens_per_s:,.0f} tok/s")
    return " | ".join(parts)
