"""What every use case needs: settings, the database and (lazily) this node's executor."""

from __future__ import annotations

import dataclasses
import functools
import getpass
import socket
from dataclasses import dataclass, field

from shipyard.db import Database, open_database
from shipyard.executors import LocalExecutor
from shipyard.hardware import VendorQueries, discover
from shipyard.services.audit import Actor, audit_key
from shipyard.services.verified_tokens import VerifiedTokens
from shipyard.settings import Settings

LOCAL_PREFIX = "local:"
"""Names of the machine's users acting embedded (``local:alice``), admins of their home."""


def local_actor(role: str = "cli") -> Actor:
    """The person at this machine (embedded mode trusts the operating system's login)."""
    return Actor(
        name=f"{LOCAL_PREFIX}{getpass.getuser()}", source=f"{role}@{socket.gethostname()}", is_admin=True
    )


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    vendor_queries: VendorQueries | None = None
    """Injected by tests to stand in for hardware this machine lacks."""
    autostart_agent: bool = True
    actor: Actor = field(default_factory=local_actor)
    """Who the use cases act for: the local user embedded, the authenticated caller on a server."""
    verified_tokens: VerifiedTokens | None = None
    """A server's recently checked tokens (shared by the contexts of its requests)."""

    @property
    def trusts_paths(self) -> bool:
        """Whether the caller may name any path on this machine: only its own user, embedded.
        Callers through the server read only inside their project's data roots."""
        return self.actor.name.startswith(LOCAL_PREFIX)

    @functools.cached_property
    def audit_key(self) -> bytes:
        return audit_key(self.settings)

    @functools.cached_property
    def executor(self) -> LocalExecutor:
        # Discovery may import torch or NVML: only pay for it in commands that place work.
        return LocalExecutor(discover(self.vendor_queries))

    def acting_as(self, actor: Actor) -> ServiceContext:
        """The same platform, for another caller (the server makes one per request); the
        discovered devices and the audit key are shared, not looked up again."""
        other = dataclasses.replace(self, actor=actor)
        for shared in ("executor", "audit_key"):
            if shared in self.__dict__:
                other.__dict__[shared] = self.__dict__[shared]
        return other

    def close(self) -> None:
        self.db.close()


def open_context(settings: Settings | None = None, **options: object) -> ServiceContext:
    settings = settings or Settings.from_env()
    settings.home.mkdir(parents=True, exist_ok=True)
    db = open_database(settings.db_url, settings.home)
    return ServiceContext(settings=settings, db=db, **options)  # type: ignore[arg-type]
