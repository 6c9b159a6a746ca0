"""``shipyard quickstart``: train a small code model end to end, then sample from it."""

from __future__ import annotations

from typing import Annotated

import typer

from shipyard.cli._contexts import command_context
from shipyard.cli._follow import follow
from shipyard.cli._jobs_backend import Embedded
from shipyard.cli._output import console, duration, table
from shipyard.daemon.supervisor import Supervisor
from shipyard.domain import JobState
from shipyard.errors import ShipyardError
from shipyard.schemas.presets import PRESETS
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs import quickstart as quickstart_service
from shipyard.services.models import models as model_service

PROMPT = "def "


def quickstart(
    steps: Annotated[
        int | None, typer.Option(help="Optimizer steps (default: sized for a few minutes).")
    ] = None,
    model: Annotated[str | None, typer.Option(help=f"Architecture preset: {', '.join(PRESETS)}.")] = None,
) -> None:
    """Train a LLaMA-style model on the Python standard library's source, then sample from it."""
    ctx = command_context(start_agent=Supervisor())
    spec = quickstart_service.spec(ctx, steps=steps, preset=model)
    arch = PRESETS[spec.model.preset or ""]
    where = f"{spec.resources.devices} x {spec.resources.accelerator[0]}"
    console.rule("[bold]Shipyard quickstart")
    params = arch.with_vocab(spec.data.tokenizer.vocab_size).num_params()
    console.print(
        f"Training [bold]{spec.model.preset}[/] (LLaMA-style, ~{params / 1e6:.2g}M "
        f"parameters) on the Python standard library's source\n"
        f"{spec.training.total_steps} steps of {spec.training.global_batch_tokens:,} tokens on {where}; "
        f"data in {spec.data.paths[0]}"
    )
    submitted = job_service.submit(ctx, spec)
    console.print(f"job [bold]{submitted.id}[/] submitted; logs: shipyard jobs logs {submitted.id}")
    view = follow(Embedded(ctx), submitted.id)
    if view.state != JobState.SUCCEEDED:
        raise ShipyardError(
            f"quickstart job {view.id} {view.state}: {view.message or 'see its log'}",
            hint=view.hint or f"shipyard jobs logs {view.id}",
        )
    detail = job_service.get(ctx, view.id)
    version = next(v for v in model_service.list_versions(ctx, spec.name) if v.job_id == view.id)
    sample = model_service.generate(
        ctx, f"{version.project}/{version.name}:{version.version}", PROMPT, max_new_tokens=80, temperature=0.7
    )

    console.rule("[bold]Sample")
    typer.echo(sample.prompt + sample.completion)
    console.rule("[bold]Summary")
    s = detail.summary
    ratio = s.get("eval_loss_end", 0) / s["eval_loss_start"] if s.get("eval_loss_start") else None
    table(
        None,
        ["", "start", "end"],
        [
            ("train loss", s.get("train_loss_start"), s.get("train_loss_end")),
            (
                "eval loss",
                s.get("eval_loss_start"),
                s.get("eval_loss_end")
                if ratio is None
                else f"{s['eval_loss_end']:.4g} ({ratio:.0%} of start)",
            ),
            ("tokens/s (median)", "", s.get("tokens_per_s")),
            ("MFU (median)", "", f"{s.get('mfu', 0):.2%}"),
            ("wall time", "", duration(s.get("wall_s"))),
            ("model version", "", f"{version.project}/{version.name}:{version.version}  ({version.path})"),
        ],
    )
    console.print(
        f"Next: [bold]shipyard jobs show {view.id}[/], "
        f"[bold]shipyard generate {version.name} --prompt 'import '[/], [bold]shipyard models list[/]"
    )


def register(app: typer.Typer) -> None:
    app.command()(quickstart)
