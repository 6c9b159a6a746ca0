"""What every use case needs: settings, the database and (lazily) this node's executor."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shipyard.db import Database, open_database
from shipyard.executors import LocalExecutor
from shipyard.hardware import VendorQueries, discover
from shipyard.settings import Settings


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    vendor_queries: VendorQueries | None = None
    """Injected by tests to stand in for hardware this machine lacks."""
    autostart_agent: bool = True

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
