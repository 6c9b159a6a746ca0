"""A PostgreSQL of a benchmark's own: initdb in its scratch folder, on a free loopback port, so
a run may crash it or fill it without touching the machine's."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
from pathlib import Path


class Postgres:
    """PostgreSQL's own binaries, run as its user (it refuses root), over ``scratch/postgres``."""

    def __init__(self, scratch: Path) -> None:
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not binaries:
            raise SystemExit("PostgreSQL's binaries are not installed (/usr/lib/postgresql/*/bin)")
        self.bin = binaries[-1].parent
        self.dir = scratch / "postgres"
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.as_owner: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            scratch.chmod(0o755)  # its own user reaches its folder through the scratch folder
            os.chown(self.dir, pwd.getpwnam("postgres").pw_uid, -1)
            self.as_owner = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._pg_ctl("start")
        self.execute("CREATE DATABASE shipyard")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/shipyard"

    def _options(self) -> str:
        return f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"

    def _pg_ctl(self, action: str, *args: str) -> None:
        # The log file is named on every start: else the server inherits pg_ctl's output pipe
        # and waiting for pg_ctl to finish waits for the server to end.
        log = str(self.dir / "log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-w", action, *args, "-o", self._options())

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_owner, str(self.bin / tool), *args], check=True, capture_output=True)

    def execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as db:
            db.execute(statement)  # type: ignore[arg-type]

    def crash(self) -> None:
        """Stop at once, as a crash does (no checkpoint: recovery replays the WAL), and start."""
        self._pg_ctl("restart", "-m", "immediate")

    def drop_connections(self) -> None:
        self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = 'shipyard' AND pid <> pg_backend_pid()"
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
