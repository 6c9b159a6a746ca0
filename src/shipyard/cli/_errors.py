"""Known errors become ``Error:`` and ``Hint:`` lines and exit code 1 — or, with ``--json``, one
JSON object ``{code, message, hint}`` on standard error; a traceback only with ``SHIPYARD_DEBUG=1``."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable

import typer
from rich.markup import escape

from shipyard.cli._output import err_console
from shipyard.domain.text import printable
from shipyard.errors import ShipyardError


def run_guarded(entry: Callable[[], object], *, as_json: bool = False) -> int:
    """Run a command; ``as_json``: report an error as one JSON object (the command had ``--json``)."""
    debug = os.environ.get("SHIPYARD_DEBUG") == "1"
    try:
        entry()
    except ShipyardError as exc:
        if debug:
            traceback.print_exc()
        report(exc.code, exc.message, exc.hint, as_json=as_json)
        return 1
    except typer.TyperException as exc:  # a usage error, raised rather than printed under --json
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        report("usage_error", message, "run the command with --help for its options", as_json=True)
        return 1
    except typer.Abort:
        return 1
    except SystemExit as exc:
        # Usage errors (a flag missing or of the wrong type) were printed by click with code 2;
        # Shipyard reports every bad input with 1.
        return 1 if exc.code == 2 else exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:  # a bug: say so plainly, keep the traceback for SHIPYARD_DEBUG=1
        if debug:
            traceback.print_exc()
        report(
            "internal_error",
            f"unexpected {type(exc).__name__}: {exc}",
            "run again with SHIPYARD_DEBUG=1 for the traceback, and report it",
            as_json=as_json,
        )
        return 1
    return 0


def report(code: str, message: str, hint: str | None, *, as_json: bool) -> None:
    if as_json:
        sys.stderr.write(json.dumps({"code": code, "message": message, "hint": hint}) + "\n")
        return
    err_console.print(f"[bold red]Error:[/] {escape(printable_lines(message))}")
    if hint:
        err_console.print(f"[bold]Hint:[/] {escape(printable_lines(hint))}")


def printable_lines(text: str) -> str:
    """``text`` safe for a terminal, keeping the line breaks an error message is made of."""
    return "\n".join(map(printable, text.split("\n")))


def exit_code_of(entry: Callable[[], object], argv: list[str] | None = None) -> None:
    sys.exit(run_guarded(entry, as_json="--json" in (sys.argv[1:] if argv is None else argv)))
