"""What a training process sees of its host: the signal to stop, and its peak memory."""

from __future__ import annotations

import resource
import signal
from types import FrameType

import torch


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.requested = True
        print(f"received {signal.Signals(signum).name}: checkpointing and stopping", flush=True)


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    """Peak memory: what the device had to hold (the caching allocator's reserve, what runs out
    first) and, on a GPU, the live tensors within it."""
    if device.type == "cuda":
        return {
            "mem_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            "mem_live_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        }
    # ru_maxrss is KiB on Linux (bytes on macOS; close enough for a progress line there).
    return {"mem_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
