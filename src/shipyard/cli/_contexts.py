"""The embedded platform a command opens, closed when the command ends: its database connections
(a PostgreSQL pool, SQLite handles) are given back by the command, not left to the process's exit
(or, when the CLI runs inside another program, to the garbage collector)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shipyard.services.context import ServiceContext

_opened: list[ServiceContext] = []


def command_context(**options: object) -> ServiceContext:
    """``open_context(**options)``, closed by ``close_command_contexts`` when the command ends."""
    from shipyard.services.context import open_context

    ctx = open_context(None, **options)
    _opened.append(ctx)
    return ctx


def close_command_contexts() -> None:
    while _opened:
        _opened.pop().close()
