"""The host's share of a training step: the operations it dispatches (on a CPU, in series with the
math) or queues (on a GPU, while the device runs what was queued before), and what each costs."""

from __future__ import annotations

from shipyard.hardware.catalog import AcceleratorSpec
from shipyard.planner.calibration import CALIBRATION, Calibration

OPS_PER_BLOCK = 198
OPS_PER_MICRO_BATCH = 100
OPS_PER_BLOCK_OPTIMIZER = 14
"""Host operations of Shipyard's LLaMA on a CPU, in units of one autograd operation on a tiny
tensor (what ``hardware.probe`` times): a block's forward and backward, the embedding, final norm
and loss of a micro-batch, and a block's share of the fused AdamW step. Measured with
``benchmarks/cpu_overhead.py`` on a 2-core EPYC VM, where one such operation took 3.9 us; over
five runs a block cost 170-248 operations, a micro-batch -26-230 (the intercept of a noisy line),
a block's optimizer step 11-17."""
OPS_PER_QUEUED_BLOCK = 449
"""Host time to queue one block's kernels on a GPU (forward, backward and its share of the fused
AdamW step), in the same units: Shipyard compiles each block, and every compiled graph call, its
guards and its kernel launches cost the host time while the GPU runs what was queued before. Fitted
through the origin on ``benchmarks/host_dispatch.py`` on one H200 (Xeon host, 5.42 us an operation):
2.2-2.5 ms a block at one sequence a step, for models of 6, 8, 12 and 22 blocks."""


def host_op_us(spec: AcceleratorSpec, calibration: Calibration = CALIBRATION) -> float:
    """The host's cost of an operation a plan takes: as measured, else for a GPU the reference
    Xeon's (a CPU not measured counts no dispatch)."""
    if spec.op_overhead_us or spec.architecture == "cpu":
        return spec.op_overhead_us
    return calibration.gpu_host_op_us
