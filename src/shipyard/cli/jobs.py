"""``shipyard jobs submit|list|show|logs|cancel``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from shipyard.cli._follow import follow
from shipyard.cli._jobs_backend import jobs as jobs_backend
from shipyard.cli._output import JsonOpt, console, duration, err_console, fmt, print_json, table
from shipyard.domain import JobState
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.views import JobDetail, JobView

sub_app = typer.Typer(help="Submit and watch training jobs.", no_args_is_help=True)

JobIdArg = Annotated[str, typer.Argument(help="Job id, as `shipyard jobs list` shows it.")]


@sub_app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="YAML job spec (apiVersion: shipyard/v1).")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the job with a progress bar until it ends.")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Start from the newest checkpoint of the last job with this name."),
    ] = False,
    resume_from: Annotated[
        str | None,
        typer.Option("--resume-from", help="Start from this job id's or this folder's checkpoint."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Queue a training job; the local agent starts it when its devices are free.

    SPEC is a YAML file: `shipyard spec` lists its every field, `shipyard spec example` writes a
    starter to edit."""
    with jobs_backend() as platform:
        view = platform.submit(spec, resume=resume, resume_from=resume_from)
        for warning in view.warnings:
            err_console.print(f"[bold yellow]Warning:[/] {warning}")
        if not json_out:
            resuming = f" (resuming {view.resume_from})" if view.resume_from else ""
            console.print(f"submitted [bold]{view.id}[/]{resuming}")
        if wait:
            view = follow(platform, view.id)
    if json_out:
        print_json(view)
    elif wait:
        _print_outcome(view)
    if wait and view.state != JobState.SUCCEEDED:
        raise typer.Exit(1)


def _print_outcome(view: JobView) -> None:
    color = "green" if view.state == JobState.SUCCEEDED else "red"
    console.print(
        f"job {view.id} [bold {color}]{view.state}[/]" + (f": {view.message}" if view.message else "")
    )
    if view.hint and view.state != JobState.SUCCEEDED:
        console.print(f"[bold]Hint:[/] {view.hint}")


@sub_app.command("list")
def list_(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state (queued, running, ...).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """Jobs, newest first, with progress and why queued ones wait."""
    with jobs_backend() as platform:
        views = platform.list(state, limit)
    if json_out:
        print_json(views)
        return
    table(
        None,
        ["id", "state", "step", "loss", "tok/s", "devices", "submitted", "reason"],
        [
            (
                v.id,
                v.state,
                f"{v.step}/{v.total_steps}",
                v.loss,
                v.tokens_per_s,
                f"{v.devices}x{'|'.join(v.accelerator_types)}",
                v.submitted_at,
                v.pending_reason or v.message,
            )
            for v in views
        ],
    )


@sub_app.command()
def show(job_id: JobIdArg, json_out: JsonOpt = False) -> None:
    """One job: state, attempts, summary figures and artifacts."""
    with jobs_backend() as platform:
        detail = platform.get(job_id)
    if json_out:
        print_json(detail)
        return
    _print_detail(detail)


def _print_detail(d: JobDetail) -> None:
    console.print(f"[bold]{d.id}[/]  {d.state}" + (f" ({d.exit_reason})" if d.exit_reason else ""))
    rows: list[tuple[str, object]] = [
        ("name / project / queue", f"{d.name} / {d.project} / {d.queue}"),
        ("progress", f"step {d.step}/{d.total_steps}"),
        ("resources", f"{d.devices} x {' or '.join(d.accelerator_types)}"),
        ("submitted", d.submitted_at),
        ("started", d.started_at),
        ("finished", d.finished_at),
        ("run dir", d.run_dir),
    ]
    if d.pending_reason:
        rows.append(("waiting because", d.pending_reason))
    if d.resume_from:
        rows.append(("resumed from", d.resume_from))
    if d.message:
        rows.append(("message", d.message))
    if d.hint:
        rows.append(("hint", d.hint))
    s = d.summary
    for key, label in [
        ("train_loss_start", "train loss (first step)"),
        ("train_loss_end", "train loss (last step)"),
        ("eval_loss_start", "eval loss (start)"),
        ("eval_loss_end", "eval loss (end)"),
        ("tokens_per_s", "tokens/s (median)"),
        ("mfu", "MFU (median)"),
    ]:
        if key in s:
            rows.append((label, f"{s[key]:.2%}" if key == "mfu" else s[key]))
    if "wall_s" in s:
        rows.append(("wall time", duration(s["wall_s"])))
    ran_on = d.attempts[-1].accelerator_type if d.attempts else None
    rows += _estimate_rows(d.estimate, s, ran_on, d.plan_gaps)
    table(None, ["", ""], rows)
    if d.attempts:
        table(
            "attempts",
            ["#", "state", "exit", "devices", "threads", "micro-batch", "pid", "log"],
            [
                (
                    a.number,
                    a.state,
                    a.exit_reason,
                    f"{a.accelerator_type} {a.device_ids}",
                    a.threads_per_process,
                    a.micro_batch_size,
                    a.pid,
                    a.log_path,
                )
                for a in d.attempts
            ],
        )
        for a in d.attempts:
            if a.message:  # an elastic job's resize: what and why
                console.print(f"attempt {a.number}: {a.message}")
            for straggler in (a.health or {}).get("stragglers", []):
                console.print(
                    f"attempt {a.number}: rank {straggler['rank']} straggles, computing "
                    f"{straggler['ratio']:.2f}x as long per step as the ranks' median"
                )
    if d.artifacts:
        table(
            "artifacts",
            ["kind", "step", "size", "path"],
            [(a.kind, a.step, f"{a.size_bytes / 2**20:.1f} MiB", a.path) for a in d.artifacts],
        )


def _estimate_rows(
    estimate: Estimate | None, measured: dict[str, float], ran_on: str | None, gaps: list[str]
) -> list[tuple[str, object]]:
    """The planner's prediction at submit time beside what the run measured: for the accelerator
    type the job ran on, with the layout it ran with."""
    if estimate is None:
        return []
    accelerator, plan = estimate.on(ran_on)

    def against(key: str) -> str:
        return f" (measured {fmt(measured[key])})" if key in measured else ""

    # Where an earlier job of this shape measured a figure, it was planned with that one.
    memory = f"{plan.memory_gib_per_device:.2f} GiB"
    if plan.memory_measured_by is not None:
        memory += f" (as job {plan.memory_measured_by} peaked; the planner's model: "
        memory += f"{plan.memory_gib_planned or 0:.2f})"
    speed = fmt(plan.tokens_per_s)
    if plan.tokens_per_s_range is not None and plan.throughput_measured_by is None:
        speed += f" (80%: {fmt(plan.tokens_per_s_range['low'])}-{fmt(plan.tokens_per_s_range['high'])})"
    if plan.throughput_measured_by is not None:
        speed += f" (as job {plan.throughput_measured_by} ran; the planner's model: "
        speed += f"{fmt(plan.tokens_per_s_planned or 0)})"
    rows: list[tuple[str, object]] = [("planned on", f"{estimate.devices} x {accelerator}")]
    if plan.layout is not None:
        rows.append(("planned layout", plan.layout.describe()))
    rows += [
        ("planned memory/device", f"{memory}{against('memory_gib')}"),
        ("planned step time", f"{fmt(plan.step_time_s)} s{against('step_time_s')}"),
        ("planned tokens/s", f"{speed}{against('tokens_per_s')}"),
        *([("planned from", plan.evidence)] if plan.evidence and plan.throughput_measured_by is None else []),
        (
            "planned wall time",
            f"{duration(estimate.wall_time_s or 0)}{_wall_range(estimate.wall_time_s_range)}",
        ),
    ]
    return rows + [("why they differ", why) for why in gaps]


def _wall_range(span: dict[str, float] | None) -> str:
    return "" if span is None else f" (80%: {duration(span['low'])}-{duration(span['high'])})"


@sub_app.command()
def logs(
    job_id: JobIdArg,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="That attempt's log (`jobs show` lists them), not the newest's.")
    ] = None,
) -> None:
    """The job's training log (its newest attempt, or --attempt N)."""
    with jobs_backend() as platform:
        offset = 0
        while True:
            chunk = platform.log(job_id, offset, must_exist=not follow_, attempt=attempt)
            if chunk.data:
                typer.echo(chunk.data.decode(errors="replace"), nl=False)
            offset = chunk.next_offset
            if not follow_:
                return
            if chunk.job_ended:
                follow_ = False  # one last read for lines written just before the end
                continue
            time.sleep(1.0)


@sub_app.command()
def cancel(job_id: JobIdArg, json_out: JsonOpt = False) -> None:
    """Cancel a job: a running one checkpoints first (SIGTERM), and is killed after a grace period."""
    with jobs_backend() as platform:
        view = platform.cancel(job_id)
    if json_out:
        print_json(view)
    elif view.state == JobState.CANCELLED:
        console.print(f"job {view.id} cancelled")
    else:
        console.print(f"job {view.id}: stop requested; it checkpoints, then stops")


def register(app: typer.Typer) -> None:
    app.add_typer(sub_app, name="jobs")
