"""Train and fine-tune LLMs on your own accelerators."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import typer

from shipyard import __version__
from shipyard.cli._contexts import close_command_contexts
from shipyard.cli._errors import exit_code_of
from shipyard.cli._examples import add_examples
from shipyard.cli._output import JsonOpt, print_json, table

COMMANDS = {
    "jobs": "shipyard.cli.jobs",
    "models": "shipyard.cli.models",
    "generate": "shipyard.cli.models",
    "quickstart": "shipyard.cli.quickstart",
    "plan": "shipyard.cli.plan",
    "sim": "shipyard.cli.sim",
    "queue": "shipyard.cli.queues",
    "queues": "shipyard.cli.queues",
    "audit": "shipyard.cli.audit",
    "server": "shipyard.cli.server",
    "login": "shipyard.cli.server",
    "ui": "shipyard.cli.server",
    "users": "shipyard.cli.accounts",
    "tokens": "shipyard.cli.accounts",
    "projects": "shipyard.cli.accounts",
    "storage": "shipyard.cli.storage",
    "datasets": "shipyard.cli.storage",
    "node": "shipyard.cli.cluster",
    "nodes": "shipyard.cli.cluster",
    "spec": "shipyard.cli.spec",
    "usage": "shipyard.cli.usage",
}
"""Command -> the module that registers it. Only the module a command line needs is imported, so
`shipyard plan` answers without loading the database layer (each module has ``register(app)``)."""


def build_app(argv: list[str]) -> typer.Typer:
    _no_type_beside_flags()
    app = typer.Typer(
        name="shipyard",
        help=__doc__,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    app.command()(devices)
    app.command()(version)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    modules = [COMMANDS[command]] if command in COMMANDS else sorted(set(COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).register(app)
    return app


def _no_type_beside_flags() -> None:
    """typer prints ``<bool>`` beside every flag, ``--help`` included, which reads as if the flag
    took a value: flags show no type."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "flags_untyped", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_untyped = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def devices(json_out: JsonOpt = False) -> None:
    """Devices of this node, each with its accelerator type (the catalog key jobs ask for)."""
    from shipyard.cli._contexts import command_context
    from shipyard.services.cluster.devices import list_devices

    found = list_devices(command_context())
    if json_out:
        print_json(found)
        return
    table(
        None,
        [
            "type",
            "index",
            "name",
            "memory GiB",
            "peak bf16 TFLOPS",
            "peak fp32 TFLOPS",
            "cores",
            "NVLink peers",
        ],
        [
            (
                d.accelerator_type,
                d.index,
                d.name,
                d.memory_gib,
                d.peak_bf16_tflops,
                d.peak_fp32_tflops,
                d.cores or "-",
                ",".join(map(str, d.nvlink_peers)) or "-",
            )
            for d in found
        ],
    )


def version() -> None:
    """Print Shipyard's version."""
    typer.echo(__version__)


def main() -> None:
    try:
        _main(sys.argv[1:])
    finally:
        close_command_contexts()


def _main(argv: list[str]) -> None:
    command = typer.main.get_command(build_app(argv))
    _paragraphs_as_lines(command)
    add_examples(command)
    if "--json" not in argv:
        exit_code_of(lambda: command.main(args=argv, prog_name="shipyard"), argv)
        return
    # With --json, usage errors too become one JSON object: click raises them instead of printing
    # (and hands back the code of a deliberate exit, which must still leave the process).

    def run() -> None:
        code = command.main(args=argv, prog_name="shipyard", standalone_mode=False)
        if isinstance(code, int) and code:
            raise SystemExit(code)

    exit_code_of(run, argv)


def _paragraphs_as_lines(command: Any) -> None:  # typer's click.Command
    """Docstrings are wrapped at the source's width; help pages keep a single line break as it is
    (a command list showed half a sentence a line): each paragraph becomes one line, which the
    terminal's width wraps."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        _paragraphs_as_lines(sub)


if __name__ == "__main__":
    main()
