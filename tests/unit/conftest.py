"""What unit tests of the service layer share: a home with its own SQLite database on a node that
advertises two CPU cores and no accelerator (the vendor-query seam)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shipyard.hardware import VendorQueries
from shipyard.hardware.discovery import CpuInfo
from shipyard.services.context import ServiceContext, open_context
from shipyard.settings import Settings

TWO_CORES = VendorQueries(
    nvidia=list, torch_devices=list, cpu=lambda: CpuInfo(model="t", cores=2, mhz=1000.0, flags=frozenset())
)


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[ServiceContext]:
    context = open_context(
        Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}"), vendor_queries=TWO_CORES
    )
    yield context
    context.close()
