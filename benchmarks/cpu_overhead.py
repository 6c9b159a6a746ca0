"""What eager PyTorch spends outside the math when the CPU trains Shipyard's LLaMA, in units of the
host probe's operation (one autograd operation on a tiny tensor, forward and backward): the
planner.s ``OPS_PER_BLOCK``, ``OPS_PER_MICRO_BATCH`` and ``OPS_PER_BLOCK_OPTIMIZER``.

    .venv/bin/python benchmarks/cpu_overhead.py [--json]

A model 64 wide on 8 tokens does almost no arithmetic, so its time is dispatch: the forward and
backward of models of 1, 2, 4 and 8 blocks fit a line whose slope is a block's cost and whose
intercept is the embedding, final norm and loss; the fused AdamW step of 1 and 8 blocks gives a
block's share of the optimizer. One thread, medians of 30 runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from shipyard.hardware.probe import measure_host
from shipyard.schemas.presets import PRESETS
from shipyard.training.model import Transformer

LAYERS = (1, 2, 4, 8)


def median_s(fn: Callable[[], object], runs: int = 30) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = PRESETS["llama-tiny"].with_vocab(64)
    batch = torch.randint(0, 64, (1, 9))
    forward_backward, optimizer_step = {}, {}
    for layers in LAYERS:
        model = Transformer(replace(base, n_layers=layers))
        forward_backward[layers] = median_s(lambda m=model: m(batch[:, :-1], batch[:, 1:]).backward())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        optimizer_step[layers] = median_s(optimizer.step)
    slope = statistics.linear_regression(list(LAYERS), [forward_backward[n] for n in LAYERS])
    per_block_optimizer = (optimizer_step[LAYERS[-1]] - optimizer_step[LAYERS[0]]) / (LAYERS[-1] - LAYERS[0])
    rates = measure_host()
    assert rates is not None
    op_s = rates.op_overhead_us * 1e-6
    figures = {
        "op_overhead_us": rates.op_overhead_us,
        "block_us": slope.slope * 1e6,
        "micro_batch_us": slope.intercept * 1e6,
        "block_optimizer_us": per_block_optimizer * 1e6,
        "ops_per_block": slope.slope / op_s,
        "ops_per_micro_batch": slope.intercept / op_s,
        "ops_per_block_optimizer": per_block_optimizer / op_s,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"one probe operation: {figures['op_overhead_us']:.2f} us")
    for what, key in (
        ("a block, forward + backward", "block"),
        ("a micro-batch's embedding, norm and loss", "micro_batch"),
        ("a block's AdamW step", "block_optimizer"),
    ):
        print(f"  {what:<42} {figures[key + '_us']:8.0f} us = {figures['ops_per_' + key]:6.0f} operations")


if __name__ == "__main__":
    main()
