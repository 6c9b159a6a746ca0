"""Loopback ports for the servers the tests start, chosen below the kernel's ephemeral range
(32768 up): a port handed out by ``bind(0)`` comes from that range, which outgoing connections
draw from too, so on a busy machine one could take it between choosing it and the server binding
it (a filer and a slurmd each failed so). Above Ray's worker ports (10002-19999)."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence

SEAWEED = range(20000, 22768)
"""SeaweedFS's servers; each puts gRPC 10000 above, under 32768."""
SLURM = range(23000, 29000)
SERVERS = range(29000, 30000)
"""Every other server a test starts: Ray's head, Redis, Shipyard's own."""


def quiet_ports(choices: range, count: int = 1, offsets: Sequence[int] = (0,)) -> list[int]:
    """``count`` distinct ports of ``choices`` free now, each with port + offset free for every
    offset (a range and its offsets must not meet: SeaweedFS's 20000-22767 and 30000-32767)."""
    found: list[int] = []
    for _ in range(200 * count):
        port = random.choice(choices)
        if port in found or not all(_free(port + offset) for offset in offsets):
            continue
        found.append(port)
        if len(found) == count:
            return found
    raise OSError(f"no {count} free loopback ports in {choices.start}-{choices.stop - 1}")


def quiet_port() -> int:
    """One port of ``SERVERS`` free now."""
    return quiet_ports(SERVERS)[0]


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
