"""The inventory of a cluster as its agent last recorded it, for the processes that answer
questions about the cluster without joining its engine: the API server.

A process that joins a Ray cluster lives and dies with its head (Ray ends a driver a minute after
its GCS is gone). The server only needs to list nodes and say whether a request could ever run,
so it reads what the agent, the one process that drives the engine, recorded at its last pass;
the server keeps answering while the head is away, and the agent comes back with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from shipyard.executors.base import NodeInventory, Request, feasible_on
from shipyard.scheduling.status import Status

READ_TTL_S = 1.0
"""How long one read of the record serves (a page of the dashboard asks several times)."""


class RecordedInventory:
    """An ``Inventory`` read from the agent's record (``read``); ``engine`` names the engine in
    what it says when nothing was recorded yet."""

    def __init__(self, read: Callable[[], list[NodeInventory]], engine: str) -> None:
        self._read = read
        self._engine = engine
        self._cache: tuple[float, list[NodeInventory]] = (-READ_TTL_S, [])

    def known_nodes(self) -> Sequence[NodeInventory]:
        read_at, nodes = self._cache
        if time.monotonic() - read_at >= READ_TTL_S:
            nodes = self._read()
            self._cache = (time.monotonic(), nodes)
        return nodes

    def nodes(self) -> Sequence[NodeInventory]:
        return [node for node in self.known_nodes() if node.up]

    def check_feasible(self, request: Request) -> Status | None:
        return feasible_on(
            self.known_nodes(),
            request,
            f"no node of the {self._engine} cluster is known yet: the agent records them at its "
            "first pass (start the agent, and join nodes with `shipyard node start`)",
        )
