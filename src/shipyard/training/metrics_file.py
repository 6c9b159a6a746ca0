"""``metrics.jsonl``: one JSON line per event of a run (start, train, eval, checkpoint, resume...),
appended by rank 0 and read by the agent while the run goes on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class MetricsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._appended = False
        """Whether this attempt has appended a line yet."""

    def append(self, **metrics: Any) -> None:
        """One line, in one write, so a reader sees it whole or not at all. The attempt's first
        line starts on a line of its own: a killed attempt may have left half of one behind."""
        line = (json.dumps({**metrics, "time": round(time.time(), 3)}) + "\n").encode()
        descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if not self._appended:
                size = os.fstat(descriptor).st_size
                if size and os.pread(descriptor, 1, size - 1) != b"\n":
                    line = b"\n" + line
                self._appended = True
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
