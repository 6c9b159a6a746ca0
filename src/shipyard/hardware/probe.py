"""What this host's CPU sustains, measured in a fraction of a second: a derived peak assumes the
nominal clock and a reference server's memory, where a VM's cores turbo above it and share a few
memory channels, and the per-operation cost of eager PyTorch varies several-fold between machines.
A CPU job's estimate plans with these figures (one thread's, times the job's threads).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from shipyard.durable import write_json_atomic

GEMM_SHAPE = (512, 384, 1536)
"""Tokens x in x out of the timed linear layer, whose forward and backward are the three matrix
multiplies training runs (two of them on transposed operands): a small model's MLP, about 20 ms
on one thread."""
COPY_BYTES = 64 * 2**20
"""Larger than any last-level cache a thread sees, so the copy runs at memory speed."""
CHAIN = 50
KEPT_S = 24 * 3600
"""How long a measurement kept on disk stands for the machine (a reboot or another torch ends it
sooner)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRates:
    gemm_gflops_per_thread: float
    memory_gb_per_s_per_thread: float
    op_overhead_us: float
    """One autograd operation on a tiny tensor, forward and backward, averaged."""


def _fastest(fn: Callable[[], object], repeats: int) -> float:
    """What the host can do: slower runs met other work (at submit, the agent may be starting)."""
    fn()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return min(samples)


@functools.cache
def measure_host(kept_in: Path | None = None) -> HostRates | None:
    """One thread's rates, measured once per process and kept in the folder ``kept_in`` for the
    next process on this machine: measuring imports torch, two seconds on every command that
    places a job. ``None`` without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    kept = kept_in / "host-rates.json" if kept_in is not None else None
    machine = _machine()
    if kept is not None:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            record = json.loads(kept.read_text())
            if record["machine"] == machine and time.time() - record["measured_at"] < KEPT_S:
                return HostRates(**record["rates"])
    rates = _measure()
    if kept is not None:
        with contextlib.suppress(OSError):  # a read-only home measures again next time
            write_json_atomic(kept, {"machine": machine, "measured_at": time.time(), "rates": asdict(rates)})
    return rates


def _machine() -> str:
    """This boot of this machine, the cores this process may use and the torch measuring."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: the day's limit alone
        boot = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{socket.gethostname()}|{boot}|{cores}|torch {importlib.metadata.version('torch')}"


def _measure() -> HostRates:
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        tokens, width_in, width_out = GEMM_SHAPE
        x = torch.randn(tokens, width_in, generator=generator, requires_grad=True)
        weight = torch.randn(width_out, width_in, generator=generator, requires_grad=True)
        gemm_s = _fastest(lambda: F.linear(x, weight).sum().backward(), 5)  # type: ignore[no-untyped-call]
        source = torch.empty(COPY_BYTES // 4)
        target = torch.empty_like(source)
        copy_s = _fastest(lambda: target.copy_(source), 3)
        leaf = torch.randn(8, requires_grad=True)

        def chain() -> None:
            y = leaf
            for _ in range(CHAIN):
                y = y * 1.0001
            y.sum().backward()  # type: ignore[no-untyped-call]

        chain_s = _fastest(chain, 5)
    finally:
        torch.set_num_threads(threads)
    return HostRates(
        gemm_gflops_per_thread=3 * 2 * tokens * width_in * width_out / gemm_s / 1e9,
        memory_gb_per_s_per_thread=2 * COPY_BYTES / copy_s / 1e9,
        # The chain's forward and backward: CHAIN multiplies each way, the sum and its gradient.
        op_overhead_us=chain_s / (2 * CHAIN + 2) * 1e6,
    )
