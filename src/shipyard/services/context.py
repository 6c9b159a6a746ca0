"""What every use case needs: settings, the database and (lazily) the executor and its nodes."""

from __future__ import annotations

import dataclasses
import functools
import getpass
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select

from shipyard.audit import audit_key
from shipyard.db import ClusterNode, Database, open_database
from shipyard.domain.actor import Actor
from shipyard.domain.clock import SYSTEM_CLOCK, Clock
from shipyard.domain.paths import make_private
from shipyard.errors import InvalidSpec
from shipyard.executors import Executor, NodeInventory, devices_of
from shipyard.executors.base import Inventory
from shipyard.executors.recorded import RecordedInventory
from shipyard.executors.registry import engine_named
from shipyard.hardware import Device, VendorQueries
from shipyard.services.caches.submitted_jobs import SubmittedJobs
from shipyard.services.caches.verified_tokens import VerifiedTokens
from shipyard.settings import Settings
from shipyard.storage import config as storage_config

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
    start_agent: Callable[[Settings], None] | None = None
    """Called once jobs are queued, to make sure an agent serves them (the CLI's and the server's
    ``daemon.supervisor.Supervisor``); None: whoever runs this platform starts agents itself."""
    actor: Actor = field(default_factory=local_actor)
    """Who the use cases act for: the local user embedded, the authenticated caller on a server."""
    verified_tokens: VerifiedTokens | None = None
    """A server's recently checked tokens (shared by the contexts of its requests)."""
    submitted_jobs: SubmittedJobs = field(default_factory=SubmittedJobs)
    """What the scheduler read of each job (shared by the contexts of a process's requests)."""
    clock: Clock = SYSTEM_CLOCK
    """What token expiry and login throttling read the time from (tests move a fake one)."""
    inventory_from_agent: bool = False
    """Read a cluster's nodes from the agent's record instead of joining its engine (the API
    server: it must keep answering while a cluster's head is away)."""

    @property
    def trusts_paths(self) -> bool:
        """Whether the caller may name any path on this machine: only its own user, embedded.
        Callers through the server read only inside their project's data roots."""
        return self.actor.name.startswith(LOCAL_PREFIX)

    @functools.cached_property
    def audit_key(self) -> bytes:
        return audit_key(self.settings)

    @functools.cached_property
    def executor(self) -> Executor:
        engine = engine_named(self.settings.executor)
        if engine.shared_store:
            _refuse_local_store(self.settings)
        return engine.make(self.settings, self.vendor_queries)

    @property
    def reads_recorded_inventory(self) -> bool:
        """Whether this process sees a cluster through its agent's record (then an agent must
        run for as long as this process does, to keep the record current)."""
        return self.inventory_from_agent and engine_named(self.settings.executor).shared_store

    @functools.cached_property
    def inventory(self) -> Inventory:
        """The nodes the use cases list and check requests against: the executor's own, or, for
        a cluster seen from a process that does not drive it, what its agent recorded."""
        if self.reads_recorded_inventory:
            return RecordedInventory(lambda: _recorded_nodes(self.db), self.settings.executor)
        return self.executor

    def devices(self) -> list[Device]:
        """Every device of the executor's nodes."""
        return devices_of(self.inventory.nodes())

    def acting_as(self, actor: Actor) -> ServiceContext:
        """The same platform, for another caller (the server makes one per request); the
        discovered devices and the audit key are shared, not looked up again."""
        other = dataclasses.replace(self, actor=actor)
        for shared in ("executor", "inventory", "audit_key"):
            if shared in self.__dict__:
                other.__dict__[shared] = self.__dict__[shared]
        return other

    def close(self) -> None:
        self.db.close()


def _refuse_local_store(settings: Settings) -> None:
    """A cluster needs a store every node reads: a relaunch elsewhere resumes from it."""
    backend = storage_config.load(settings.home).backend
    if backend != "s3":
        raise InvalidSpec(
            f"the {settings.executor} executor needs an artifact store every node sees, but "
            f"storage.yaml in {settings.home} says backend: {backend}",
            hint="point the store at an S3-compatible service (SeaweedFS, MinIO, Ceph): "
            "backend: s3 with an s3: section (docs/operations.md: Artifact storage)",
        )


def _recorded_nodes(db: Database) -> list[NodeInventory]:
    with db.read() as session:
        rows = session.scalars(select(ClusterNode).order_by(ClusterNode.node))
        return [NodeInventory.from_record(row.inventory) for row in rows]


def open_context(settings: Settings | None = None, **options: object) -> ServiceContext:
    settings = settings or Settings.from_env()
    make_private(settings.home)  # the database, the audit key, runs and stores live in it
    db = open_database(settings.db_url, settings.home)
    return ServiceContext(settings=settings, db=db, **options)  # type: ignore[arg-type]
