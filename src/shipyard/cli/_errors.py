"""Known errors become ``Error:`` and ``Hint:`` lines and exit code 1; a traceback only with
``SHIPYARD_DEBUG=1``."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from rich.markup import escape

from shipyard.cli._output import err_console
from shipyard.errors import ShipyardError


def run_guarded(entry: Callable[[], object]) -> int:
    debug = os.environ.get("SHIPYARD_DEBUG") == "1"
    try:
        entry()
    except ShipyardError as exc:
        if debug:
            traceback.print_exc()
        err_console.print(f"[bold red]Error:[/] {escape(exc.message)}")
        if exc.hint:
            err_console.print(f"[bold]Hint:[/] {escape(exc.hint)}")
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
        err_console.print(f"[bold red]Error:[/] unexpected {type(exc).__name__}: {escape(str(exc))}")
        err_console.print("[bold]Hint:[/] run again with SHIPYARD_DEBUG=1 for the traceback, and report it")
        return 1
    return 0


def exit_code_of(entry: Callable[[], object]) -> None:
    sys.exit(run_guarded(entry))
