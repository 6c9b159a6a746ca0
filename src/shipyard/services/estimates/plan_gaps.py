"""Why a job's measured figures differ from the planner's, in words: when tokens/s or memory are
off by more than ``GAP``, which assumption was off.

Tokens/s factor exactly into three parts, each of which the plan and the run both record:
``measured / planned = (run's peak / planner's peak) x (measured MFU / planned MFU) x (planner's
FLOPs per token / runtime's FLOPs per token)``. The part furthest from 1 is named first; the
efficiency part also names what shared the node while the job ran (contention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shipyard.schemas.estimate import Figures

GAP = 2.0
"""A measured figure within this factor of the plan is the planner being roughly right."""
OFF = 1.25
"""A factor further than this from 1 is named as a cause."""


@dataclass(frozen=True)
class Measured:
    tokens_per_s: float | None
    mfu: float | None
    memory_gib: float | None
    flops_per_token: float | None
    """The runtime's model FLOPs per token (its ``start`` record)."""
    world_size: int | None
    accelerator_type: str
    threads_per_process: int | None
    others_on_node: int
    """Attempts of other jobs that ran on the node while this job's newest attempt did."""


def explain(plan: Figures, measured: Measured) -> list[str]:
    """Sentences for ``jobs show`` and the job page; empty when the plan held."""
    found = []
    if (why := _throughput(plan, measured)) is not None:
        found.append(why)
    if (why := _memory(plan, measured)) is not None:
        found.append(why)
    return found


def _throughput(plan: Figures, m: Measured) -> str | None:
    planned, got = plan.tokens_per_s, m.tokens_per_s
    if (ratio := _gap(planned, got)) is None or got is None:
        return None
    head = f"measured tokens/s is {_times(ratio)} the plan"
    peak, mfu, fpt = plan.peak_tflops, plan.mfu, plan.flops_per_token
    if not (peak and mfu and fpt and m.mfu and m.flops_per_token and m.world_size):
        return f"{head}; this job's estimate predates the figures that say why (submit it again)"
    run_peak = got * m.flops_per_token / (m.mfu * m.world_size) / 1e12
    factors = [
        (run_peak / peak, _peak_words(peak, run_peak, m)),
        (m.mfu / mfu, _efficiency_words(plan, m.mfu, m.others_on_node)),
        (fpt / m.flops_per_token, f"FLOPs per token: the planner counted {fpt / 1e6:,.1f} M, "
                                  f"the runtime {m.flops_per_token / 1e6:,.1f} M"),
    ]  # fmt: skip
    off = sorted((f for f in factors if _far(f[0], OFF)), key=lambda f: -abs(math.log(f[0])))
    if not off:  # each part within OFF, together past GAP
        off = [max(factors, key=lambda f: abs(math.log(f[0])))]
    return f"{head}: " + "; ".join(f"{words} ({_times(factor)})" for factor, words in off)


def _peak_words(planned: float, run: float, m: Measured) -> str:
    n = m.threads_per_process
    threads = f", {n} thread{'' if n == 1 else 's'} per process" if m.accelerator_type == "cpu" else ""
    return (
        f"device peak: the planner took {planned:,.3g} TFLOPS per {m.accelerator_type} device, "
        f"the run had {run:,.3g}{threads}"
    )


def _efficiency_words(plan: Figures, measured_mfu: float, others_on_node: int) -> str:
    planned_mfu = plan.mfu or 0.0
    words = (
        f"efficiency: the planner assumed {planned_mfu:.1%} of peak (MFU), the run reached {measured_mfu:.1%}"
    )
    if others_on_node and measured_mfu < planned_mfu:
        words += f", with {others_on_node} other job{'s' if others_on_node > 1 else ''} on the node"
    if plan.host_bound and plan.host_op_us:  # the plan's step was the host queuing kernels
        op_us = plan.host_op_us
        words += f"; the planned step was its host's, queuing kernels at {op_us:.2g} us an operation"
    return words


def _memory(plan: Figures, m: Measured) -> str | None:
    planned, got = plan.memory_gib_per_device, m.memory_gib
    if (ratio := _gap(planned, got)) is None or got is None or planned is None:
        return None
    head = f"measured memory is {_times(ratio)} the plan ({got:.2f} against {planned:.2f} GiB)"
    if m.accelerator_type == "cpu":
        return f"{head}: on the CPU it is the process's peak resident memory, Python and libraries too"
    if got > planned:
        return f"{head}: the rest is what the caching allocator kept beyond the tensors the planner counts"
    return f"{head}: the planner's activation count is high for this model (the run kept fewer)"


def _gap(planned: float | None, measured: float | None) -> float | None:
    """measured / planned where both exist and are more than ``GAP`` apart."""
    if not planned or not measured or not _far(measured / planned, GAP):
        return None
    return measured / planned


def _far(ratio: float, factor: float) -> bool:
    return ratio > factor or ratio < 1 / factor


def _times(ratio: float) -> str:
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:,.0f}x"
