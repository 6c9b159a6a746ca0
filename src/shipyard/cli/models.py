"""``shipyard models list | promote | delete`` and ``shipyard generate``."""

from __future__ import annotations

from typing import Annotated

import typer

from shipyard.cli._output import JsonOpt, console, print_json, table
from shipyard.services import models as model_service
from shipyard.services.context import open_context

sub_app = typer.Typer(help="Registered model versions.", no_args_is_help=True)


@sub_app.command("list")
def list_(
    name: Annotated[str | None, typer.Argument(help="Only versions of this model.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Model versions, newest first per name, with the job that made each."""
    versions = model_service.list_versions(open_context(), name)
    if json_out:
        print_json(versions)
        return
    table(
        None,
        ["model", "version", "stage", "job", "step", "eval loss", "size", "created", "path"],
        [
            (
                v.name,
                v.version,
                v.stage,
                v.job_id,
                v.step,
                v.metrics.get("eval_loss"),
                f"{v.size_bytes / 2**20:.1f} MiB",
                v.created_at,
                v.path,
            )
            for v in versions
        ],
    )


@sub_app.command()
def promote(
    version: Annotated[str, typer.Argument(help="NAME:VERSION")],
    stage: Annotated[str, typer.Argument(help="none, staging, production or archived")],
) -> None:
    """Move a version to a stage (the version in production before is archived)."""
    moved = model_service.promote(open_context(), version, stage)
    typer.echo(f"{moved.name}:{moved.version} is now {moved.stage}")


@sub_app.command()
def delete(version: Annotated[str, typer.Argument(help="NAME:VERSION")]) -> None:
    """Forget a version (refused while it is in production; its files stay with its job)."""
    model_service.delete(open_context(), version)
    typer.echo(f"deleted {version}")


@sub_app.command()
def show(version: Annotated[str, typer.Argument(help="NAME:VERSION")], json_out: JsonOpt = False) -> None:
    """Where a version comes from: job, attempts, dataset and its digest, base model, checkpoint
    step, measured metrics beside the planner's estimate."""
    found = model_service.lineage(open_context(), version)
    if json_out:
        print_json(found)
        return
    table(None, ["field", "value"], sorted(model_service.flatten(found).items()))


@sub_app.command()
def compare(
    first: Annotated[str, typer.Argument(help="NAME:VERSION")],
    second: Annotated[str, typer.Argument(help="NAME:VERSION")],
    json_out: JsonOpt = False,
) -> None:
    """Two versions side by side: only the fields that differ."""
    found = model_service.compare(open_context(), first, second)
    if json_out:
        print_json(found)
        return
    table(None, ["field", first, second], [(key, a, b) for key, (a, b) in found["differences"].items()])


def generate(
    model: Annotated[str, typer.Argument(help="NAME (newest version), NAME:VERSION, or a model folder.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to complete.")],
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to sample at most.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.8,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest tokens (0: all).")] = 50,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Sample a completion from a trained model."""
    completion = model_service.generate(
        open_context(),
        model,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
    )
    if json_out:
        print_json(completion)
    else:
        console.print(f"[dim]{completion.model}[/]")
        typer.echo(completion.prompt + completion.completion)


def register(app: typer.Typer) -> None:
    app.add_typer(sub_app, name="models")
    app.command()(generate)
