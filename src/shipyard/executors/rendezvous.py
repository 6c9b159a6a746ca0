"""The port rank 0 serves the rendezvous on (torch's ``TCPStore``), chosen on its host by the
executor a moment before rank 0 binds it. ``python -m shipyard.executors.rendezvous`` prints one,
for a batch script."""

from __future__ import annotations

import random
import socket
import sys

RENDEZVOUS_PORTS = range(20000, 32000)
"""Below Linux's default ephemeral range (32768-60999), where no outgoing connection of the host
can take the port meanwhile (one drawn by binding port 0 once was, before rank 0 bound it)."""


def free_port() -> int:
    """A port of ``RENDEZVOUS_PORTS`` free on every address of this host. The probe binds the
    wildcard address as ``TCPStore`` does: a port free on the node's own address may still be held
    on loopback by another server, and rank 0 would then fail with EADDRINUSE."""
    for port in random.sample(RENDEZVOUS_PORTS, min(64, len(RENDEZVOUS_PORTS))):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # all drawn were taken: any free one
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    sys.stdout.write(f"{free_port()}\n")
