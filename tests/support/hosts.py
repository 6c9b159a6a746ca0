"""Machines of a test cluster as Linux network namespaces: each host has a network stack, an
address and a host name of its own, and a bridge joins them, and this machine (their router, at
``.254``), as a switch joins machines. Processes run on a host through ``ip netns exec`` in a UTS
namespace of their own. Needs root (``ip netns``); ``DependencyMissing`` where it cannot."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from shipyard.errors import DependencyMissing


@dataclass
class Hosts:
    names: tuple[str, ...]
    tag: str = field(default_factory=lambda: f"sy{os.getpid() % 10000}")
    """Names this set's namespaces and links by (one set per test process)."""
    made: list[list[str]] = field(default_factory=list)

    @property
    def subnet(self) -> str:
        return f"10.231.{os.getpid() % 250}"

    @property
    def router(self) -> str:
        """This machine's address on the hosts' network."""
        return f"{self.subnet}.254"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def up(self) -> Hosts:
        bridge = f"{self.tag}b"
        try:
            self._ip("link", "add", bridge, "type", "bridge", undo=["link", "del", bridge])
            self._ip("addr", "add", f"{self.router}/24", "dev", bridge)
            self._ip("link", "set", bridge, "up")
            for i, name in enumerate(self.names):
                namespace, veth = f"{self.tag}h{i}", f"{self.tag}v{i}"
                self._ip("netns", "add", namespace, undo=["netns", "del", namespace])
                self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                self._ip("link", "set", veth, "master", bridge, "up")
                self._ip("-n", namespace, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                self._ip("-n", namespace, "link", "set", "eth0", "up")
                self._ip("-n", namespace, "link", "set", "lo", "up")
                self._ip("-n", namespace, "route", "add", "default", "via", self.router)
        except (OSError, subprocess.CalledProcessError) as exc:
            self.down()
            raise DependencyMissing(
                f"network namespaces cannot be made here ({exc})", hint="run the tests as root on Linux"
            ) from exc
        return self

    def _ip(self, *args: str, undo: list[str] | None = None) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)
        if undo is not None:
            self.made.append(undo)

    def run(
        self, name: str, command: list[str], env: Mapping[str, str], timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``command`` on host ``name``, under its own host name (a UTS namespace of its own)."""
        namespace = f"{self.tag}h{self.names.index(name)}"
        named = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name]
        return subprocess.run(
            ["ip", "netns", "exec", namespace, *named, *command],
            env=dict(env), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def down(self) -> None:
        for undo in reversed(self.made):  # the namespaces (and their ends of the links), the bridge
            subprocess.run(["ip", *undo], capture_output=True, timeout=30)
        self.made.clear()
