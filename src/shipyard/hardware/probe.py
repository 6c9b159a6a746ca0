"""What this host's CPU sustains, measured in a fraction of a second: a derived peak assumes the
nominal clock and a reference server's memory, where a VM's cores turbo above it and share a few
memory channels, and the per-operation cost of eager PyTorch varies several-fold between machines.
A CPU job's estimate plans with these figures (one thread's, times the job's threads).
"""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

GEMM_SHAPE = (512, 384, 1536)
"""Tokens x in x out of the timed linear layer, whose forward and backward are the three matrix
multiplies training runs (two of them on transposed operands): a small model's MLP, about 20 ms
on one thread."""
COPY_BYTES = 64 * 2**20
"""Larger than any last-level cache a thread sees, so the copy runs at memory speed."""
CHAIN = 50


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
def measure_host() -> HostRates | None:
    """One thread's rates, measured once per process; ``None`` without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
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
