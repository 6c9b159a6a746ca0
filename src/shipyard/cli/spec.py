"""``shipyard spec`` (the job spec's reference, from the models that validate it) and ``shipyard
spec example`` (a starter spec to edit)."""

from __future__ import annotations

import json
import os
import sysconfig
import textwrap
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from shipyard.cli._output import JsonOpt, console, err_console
from shipyard.errors import InvalidSpec
from shipyard.schemas.spec_reference import STARTERS, FieldDoc, reference, select, starter

spec_app = typer.Typer(
    help="The job spec: every section and field, and starter files to edit.",
    invoke_without_command=True,
)


@spec_app.callback()
def spec(
    ctx: typer.Context,
    section: Annotated[
        str | None, typer.Option(help="Only this section, e.g. training or training.optimizer.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Every section and field of a job spec (apiVersion: shipyard/v1): its type, default, valid
    values and what it is for. Read off the models `jobs submit` validates with."""
    if ctx.invoked_subcommand is not None:
        return
    docs = select(reference(), section)
    if json_out:
        typer.echo(json.dumps([d.to_dict() for d in docs], indent=2))
        return
    if section is None:
        console.print(Text("Job spec (apiVersion: shipyard/v1): YAML, unknown fields refused.", style="bold"))
    width = max(60, min(console.width, 100))
    for doc in docs:
        _print_field(doc, width)


def _print_field(doc: FieldDoc, width: int) -> None:
    depth = doc.path.count(".")
    indent = "  " * depth
    facts = [doc.type, "required" if doc.required else ""]
    if doc.default not in (None, "null"):  # "optional" says the rest
        facts.append(f"default {doc.default}")
    facts.append(doc.valid)
    line = Text(indent)
    if doc.section:
        console.print()
    line.append(doc.path, style="bold cyan" if doc.section else "bold")
    line.append("  " + ", ".join(f for f in facts if f), style="dim")
    console.print(line, soft_wrap=True)
    if doc.why:
        console.print(Text(textwrap.fill(doc.why, width, initial_indent=indent + "    ",
                                         subsequent_indent=indent + "    ")))  # fmt: skip


DATA_HELP = (
    "The data: a file, folder or glob (pretrain's default: the Python standard library's source, "
    "which every machine has; a placeholder otherwise)."
)


@spec_app.command("example")
def example(
    kind: Annotated[str, typer.Argument(help=f"Which starter: {', '.join(STARTERS)}.")] = "pretrain",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write it to this file (default: print it).")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help=DATA_HELP),
    ] = None,
    model: Annotated[
        str, typer.Option(help="finetune: the Hugging Face model folder to adapt.")
    ] = "./my-model",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output file.")] = False,
) -> None:
    """A starter job spec to edit: pretrain (runs as it is, on the CPU too), finetune (LoRA of a
    local model on chat records) or multi-node (a 7B-shaped model over two 8-GPU machines)."""
    text = starter(kind, data=data or _default_data(kind), model=model)
    if output is None:
        typer.echo(text, nl=False)
        return
    if output.exists() and not force:
        raise InvalidSpec(f"{output} exists", hint="give another --output, or --force to replace it")
    staging = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        staging.write_text(text)
        os.replace(staging, output)
    except OSError as exc:
        staging.unlink(missing_ok=True)
        raise InvalidSpec(f"cannot write {output}: {exc.strerror}", hint="give a writable path") from None
    err_console.print(f"wrote {output}: {STARTERS[kind]}; `shipyard jobs submit {output}` runs it")


def _default_data(kind: str) -> str:
    if kind == "pretrain":  # every machine with Python has this corpus: the starter runs as it is
        return str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")
    if kind == "finetune":
        return "./chats.jsonl"
    return "/shared/corpus/*.txt"


def register(app: typer.Typer) -> None:
    app.add_typer(spec_app, name="spec")
