"""The rendezvous port: free on every address of the host, as torch's TCPStore binds it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from shipyard.executors import rendezvous
from tests.support.ports import quiet_ports


def test_a_port_held_on_loopback_only_is_not_handed_to_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # A server of the host on 127.0.0.1 (a store, a database) leaves the port free on the node's
    # own address, but rank 0's TCPStore binds 0.0.0.0 and would fail with EADDRINUSE.
    held, spare = quiet_ports(range(20000, 22768), count=2)
    monkeypatch.setattr(rendezvous, "RENDEZVOUS_PORTS", [held, spare])
    with socket.socket() as server:
        server.bind(("127.0.0.1", held))
        server.listen()
        assert {rendezvous.free_port() for _ in range(20)} == {spare}


def test_a_batch_script_gets_its_port_from_the_module() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "shipyard.executors.rendezvous"], capture_output=True, text=True, check=True
    ).stdout
    assert int(printed) in rendezvous.RENDEZVOUS_PORTS
