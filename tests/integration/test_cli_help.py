"""Help pages as a newcomer reads them: plain words (no reST), flags without a type, examples."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import typer

from shipyard.cli._examples import EXAMPLES, add_examples
from shipyard.cli.main import build_app
from tests.conftest import Cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "command", [[], ["jobs"], ["jobs", "list"], ["sim", "run"], ["storage", "roots", "ls"], ["server"]]
)
def test_help_reads_as_text_and_flags_take_no_value(cli: Cli, command: list[str]) -> None:
    shown = cli.run(*command, "--help").stdout
    assert "``" not in shown  # the docstrings' reST stays out of the terminal
    assert "<bool>" not in shown  # a flag takes no value, so no type is printed beside it
    assert "--help" in shown


def test_the_top_level_help_ends_with_examples(cli: Cli) -> None:
    shown = cli.run("--help").stdout
    assert "Train and fine-tune LLMs on your own accelerators." in shown
    examples = shown[shown.index("Examples:") :]
    assert "shipyard quickstart" in examples and "shipyard jobs submit" in examples


def _tree() -> Any:  # typer's click.Command
    command = typer.main.get_command(build_app([]))  # every command module registered
    add_examples(command)
    return command


def _walk(command: Any, path: str = "") -> list[tuple[str, Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _walk(sub, f"{path} {name}".strip())
    return found


def test_every_command_ends_its_help_with_examples() -> None:
    missing = [path or "shipyard" for path, command in _walk(_tree()) if not command.epilog]
    assert missing == []
    assert set(EXAMPLES) == {path for path, _ in _walk(_tree())}  # no examples of a gone command


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_each_example_parses_against_the_command_it_illustrates(path: str) -> None:
    root = _tree()
    for line, _ in EXAMPLES[path]:
        words = shlex.split(line.split(" > ")[0])
        assert words[0] == "shipyard" and " ".join(words[1:]).startswith(path), line
        command, rest, parent = root, words[1:], None
        while rest and rest[0] in getattr(command, "commands", {}):
            name = command.name or "shipyard"
            parent = command.make_context(name, [], parent=parent, resilient_parsing=True)
            command, rest = command.commands[rest[0]], rest[1:]
        # raises on an unknown option, a missing argument or a value of the wrong type
        command.make_context(command.name or "shipyard", rest, parent=parent)


def test_a_docstring_paragraph_is_one_line_in_a_command_list(cli: Cli) -> None:
    shown = cli.run("spec", "--help").stdout  # `example`'s docstring spans two source lines
    listed = next(line for line in shown.splitlines() if "example" in line and "starter" in line)
    assert "LoRA of a local model" in listed
