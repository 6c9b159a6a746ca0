"""What every use case needs: settings, the database and (lazily) this node's executor."""

from __future__ import annotations

import functools
import getpass
import socket
from dataclasses import dataclass, field

from shipyard.db import Database, open_database
from shipyard.executors import LocalExecutor
from shipyard.hardware import VendorQueries, discover
from shipyard.services.audit import Actor, audit_key
from shipyard.settings import Settings


def local_actor(role: str = "cli") -> Actor:
    """The person at this machine (embedded mode trusts the operating system's login)."""
    return Actor(name=f"local:{getpass.getuser()}", source=f"{role}@{socket.gethostname()}")


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    vendor_queries: VendorQueries | None = None
    """Injected by tests to stand in for hardware this machine lacks."""
    autostart_agent: bool = True
    actor: Actor = field(default_factory=local_actor)
    """Who the use cases act for: the local user embedded, the authenticated caller on a server."""

    @functools.cached_property
    def audit_key(self) -> bytes:
        return audit_key(self.settings)

    @functools.cached_property
    def executor(self) -> LocalExecutor:
        # Discovery may import torch or NVML: only pay for it in commands that place work.
        return LocalExecutor(discover(self.vendor_queries))

    def close(self) -> None:
        self.db.close()


def open_context(settings: Settings | None = None, **options: object) -> ServiceContext:
    settings = settings or Settings.from_env()
    settings.home.mkdir(parents=True, exist_ok=True)
    db = open_database(settings.db_url, settings.home)
    return ServiceContext(settings=settings, db=db, **options)  # type: ignore[arg-type]
