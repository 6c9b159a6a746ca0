"""Time as the platform reads it, behind one seam so that tests of expiry and throttling move it
instead of sleeping."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The wall-clock time, timezone-aware UTC (stored and compared with the database's)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for ages of cached entries)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
