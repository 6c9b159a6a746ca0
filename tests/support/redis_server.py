"""A Redis of the test's own on loopback (Debian's ``redis-server``): the state store a cluster's
head keeps the cluster's state in (``node start --head --state-store``). Nothing is saved to disk:
the state lives as long as the Redis."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from shipyard.errors import DependencyMissing
from tests.support.ports import quiet_port


@dataclass
class RedisServer:
    folder: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise DependencyMissing("redis-server is not installed", hint="apt-get install redis-server")
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # a probed port is free only until another process binds it
            self.port = quiet_port()
            with open(self.folder / "redis.log", "wb") as log:
                self.process = subprocess.Popen(
                    [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", str(self.folder)],
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            if self._answers(timeout_s):
                return self
        raise AssertionError(f"redis-server never answered: {(self.folder / 'redis.log').read_text()}")

    def _answers(self, timeout_s: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
