"""How the agent names a running attempt to its engine: the handle stored with the attempt."""

from __future__ import annotations

from shipyard.db import Attempt
from shipyard.executors.base import (
    AttemptHandle,
)
from shipyard.services.context import ServiceContext


def handle_of(ctx: ServiceContext, attempt: Attempt) -> AttemptHandle:
    """How the executor knows the attempt."""
    return handle_from(ctx, attempt.node, attempt.handle, attempt.pid)


def handle_from(ctx: ServiceContext, node: str | None, handle: str | None, pid: int | None) -> AttemptHandle:
    """An attempt's handle from its recorded columns; one that recorded no node ran on the
    agent's machine."""
    return AttemptHandle.recorded(node or ctx.executor.nodes()[0].id, handle or str(pid), pid)
