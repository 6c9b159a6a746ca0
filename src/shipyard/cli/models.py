"""``shipyard models list | register | promote | show | compare | delete`` (on the server given by
SHIPYARD_URL or ``shipyard login`` when there is one) and ``shipyard generate`` (on this machine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from shipyard.cli._contexts import command_context
from shipyard.cli._output import JsonOpt, console, print_json, table
from shipyard.cli._remote import either
from shipyard.errors import Conflict, InvalidSpec, NotFound
from shipyard.services.models import models as model_service

if TYPE_CHECKING:
    from shipyard.client import Client
    from shipyard.schemas.views import ModelComparisonView

T = TypeVar("T")
REF = "[PROJECT/]NAME[:VERSION] (no version: the newest; no project: the one of yours that has it)"
sub_app = typer.Typer(help="Registered model versions.", no_args_is_help=True)


@sub_app.command("list")
def list_(
    name: Annotated[str | None, typer.Argument(help="Only versions of this model.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Model versions, newest first per name, with the job that made each."""
    versions = either(lambda c: c.list_models(name), lambda ctx: model_service.list_versions(ctx, name))
    if json_out:
        print_json(versions)
        return
    table(
        None,
        ["model", "version", "stage", "job", "step", "eval loss", "size", "created", "path"],
        [
            (
                f"{v.project}/{v.name}",
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
    version: Annotated[str, typer.Argument(help=REF)],
    stage: Annotated[str, typer.Argument(help="none, staging, production or archived")],
) -> None:
    """Move a version to a stage (the version of that model in production before is archived)."""
    moved = either(
        lambda c: _remote(c, version, lambda name, number, project: c.promote_model(
            name, number, stage, project=project
        )),
        lambda ctx: model_service.promote(ctx, version, stage),
    )  # fmt: skip
    typer.echo(f"{moved.project}/{moved.name}:{moved.version} is now {moved.stage}")


@sub_app.command()
def delete(version: Annotated[str, typer.Argument(help=REF)]) -> None:
    """Forget a version (refused while it is in production; its files stay with its job)."""
    either(
        lambda c: _remote(c, version, lambda name, number, project: c.delete_model(
            name, number, project=project
        )),
        lambda ctx: model_service.delete(ctx, version),
    )  # fmt: skip
    typer.echo(f"deleted {version}")


@sub_app.command()
def show(version: Annotated[str, typer.Argument(help=REF)], json_out: JsonOpt = False) -> None:
    """Where a version comes from: job, attempts, dataset and its digest, base model, checkpoint
    step, measured metrics beside the planner's estimate."""
    found = either(
        lambda c: _remote(c, version, lambda name, number, project: c.model_lineage(
            name, number, project=project
        )),
        lambda ctx: model_service.lineage(ctx, version),
    )  # fmt: skip
    if json_out:
        print_json(found)
        return
    table(None, ["field", "value"], sorted(model_service.flatten(found.model_dump(mode="json")).items()))


@sub_app.command()
def compare(
    first: Annotated[str, typer.Argument(help=REF)],
    second: Annotated[str, typer.Argument(help=REF)],
    json_out: JsonOpt = False,
) -> None:
    """Two versions side by side: only the fields that differ."""
    found = either(
        lambda c: _compare_remote(c, first, second), lambda ctx: model_service.compare(ctx, first, second)
    )
    if json_out:
        print_json(found)
        return
    table(None, ["field", first, second], [(key, a, b) for key, (a, b) in found.differences.items()])


@sub_app.command("register")
def register_version(
    job: Annotated[str, typer.Argument(help="A job that succeeded with an export.")],
    name: Annotated[str | None, typer.Option(help="The model's name (default: the job's).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Publish a finished job's export as a new model version (maintainers and owners; a job of
    someone who may publish is published as it finishes)."""
    published = either(
        lambda c: c.register_model(job, name or c.get_job(job).name),
        lambda ctx: model_service.register(ctx, job, name),
    )
    if json_out:
        print_json(published)
    else:
        typer.echo(
            f"{published.project}/{published.name}:{published.version} published from job {published.job_id}"
        )


def _numbered(remote: Client, ref: str) -> tuple[str, int, str | None]:
    """``[PROJECT/]NAME[:VERSION]`` -> (name, version, project); no version: the newest. A name
    without a project is the server's to resolve, except for the newest version, read here."""
    wanted = model_service.ModelRef.parse(ref)
    if wanted.version:
        if not wanted.version.isdigit():
            raise InvalidSpec(f"{ref!r} is not [PROJECT/]NAME:VERSION", hint="e.g. research/quickstart:2")
        return wanted.name, int(wanted.version), wanted.project
    versions = remote.list_models(wanted.name, wanted.project)
    projects = sorted({v.project for v in versions})
    if not versions:
        raise NotFound(f"no model named {ref!r}", hint="`shipyard models list` shows them")
    if len(projects) > 1:
        raise Conflict(
            f"model {wanted.name!r} is a model of several projects you can see: {', '.join(projects)}",
            hint=f"name the project, e.g. {projects[0]}/{wanted.name}",
        )
    return wanted.name, max(v.version for v in versions), projects[0]


def _remote(remote: Client, ref: str, call: Callable[[str, int, str | None], T]) -> T:
    return call(*_numbered(remote, ref))


def _compare_remote(remote: Client, first: str, second: str) -> ModelComparisonView:
    (name, a, project), (other, b, other_project) = _numbered(remote, first), _numbered(remote, second)
    if (name, project) != (other, other_project):
        raise InvalidSpec("the server compares versions of one model", hint=f"e.g. {name}:{a} {name}:{b}")
    return remote.compare_models(name, a, b, project=project)


def generate(
    model: Annotated[str, typer.Argument(help=f"{REF}, or a model folder.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to complete.")],
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to sample at most.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.8,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest tokens (0: all).")] = 50,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Sample a completion from a trained model."""
    completion = model_service.generate(
        command_context(),
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
