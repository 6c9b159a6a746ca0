"""The layouts a plan searches: tensor, pipeline and data parallel degrees, micro-batches,
interleaving, ZeRO stages and recomputation, as the request allows."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from shipyard.errors import InvalidSpec
from shipyard.planner.workload import RECOMPUTE_CHOICES, Cluster, Layout, LayoutRequest, TrainingWorkload


def check_request(workload: TrainingWorkload, cluster: Cluster, request: LayoutRequest) -> None:
    count = cluster.count
    if request.tp is not None and request.tp > count:
        raise InvalidSpec(
            f"--tp {request.tp} is larger than --count {count}",
            hint=f"tensor parallelism splits layers over devices: use --tp {count} or less",
        )
    if request.tp is not None and workload.model.heads % request.tp:
        raise InvalidSpec(
            f"--tp {request.tp} does not divide --heads {workload.model.heads}",
            hint="tensor parallelism splits attention heads evenly; pick a divisor of the head count",
        )
    if request.pp is not None and request.pp > workload.model.layers:
        raise InvalidSpec(
            f"--pp {request.pp} is more stages than the model's {workload.model.layers} layers",
            hint=f"use --pp {workload.model.layers} or less",
        )
    model_parallel = (request.tp or 1) * (request.pp or 1)
    if count % model_parallel:
        raise InvalidSpec(
            f"--tp x --pp = {model_parallel} does not divide --count {count}: "
            "tp x pp x dp must equal the device count",
            hint=f"pick a --count that is a multiple of {model_parallel}, or other --tp/--pp",
        )
    dp = count // model_parallel
    if request.tp is not None and request.pp is not None and dp > workload.sequences_per_step:
        raise InvalidSpec(
            f"tp={request.tp} x pp={request.pp} leaves dp={dp} data-parallel replicas but a step holds only "
            f"{workload.sequences_per_step} sequences",
            hint="raise --global-batch-tokens or use fewer devices",
        )


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _micro_batches(sequences: int) -> list[int]:
    """Powers of two up to 64, and the whole per-replica batch when it is small and not one."""
    sizes = _powers_of_two(min(sequences, 64))
    if sequences <= 64 and sequences not in sizes:
        sizes.append(sequences)
    return sizes


def _interleaves(layers: int, pp: int, requested: int | None) -> list[int]:
    """Virtual stages per device, each of at least one layer (stages may differ by a layer, as
    Megatron and torchtitan allow); no interleaving without a pipeline."""
    if pp == 1:
        return [1]
    if requested is not None:
        return [requested]
    return [v for v in (1, 2, 4, 8) if pp * v <= layers]


RECOMPUTE_EVERIES = (1, 2, 4, 8)
"""Full recomputation of one block in this many, the others keeping everything (torchtitan's
block-selective checkpointing, Megatron's ``--recompute-num-layers``): searched when the
recomputation is."""


def _recompute_everies(recompute: str, layers: int, request: LayoutRequest) -> list[int]:
    if recompute != "full":
        return [1]
    if request.recompute is not None:
        return [request.recompute_every]
    return [e for e in RECOMPUTE_EVERIES if e == 1 or e < layers]


def candidate_layouts(
    workload: TrainingWorkload, cluster: Cluster, request: LayoutRequest
) -> Iterator[Layout]:
    m = workload.model
    count = cluster.count
    tps = (
        [request.tp]
        if request.tp
        else [
            t
            for t in _powers_of_two(min(count, cluster.devices_per_node))
            if m.heads % t == 0 and m.kv_heads % t == 0
        ]
    )
    zeros = [request.zero] if request.zero is not None else list(request.zero_choices)
    recomputes = [request.recompute] if request.recompute else list(RECOMPUTE_CHOICES)
    if workload.flash_attention and request.recompute is None:
        # Fused attention already stores no scores: selective recompute would save nothing.
        recomputes.remove("selective")
    for tp in tps:
        rest = count // tp
        if count % tp:
            continue
        pps = [request.pp] if request.pp else [p for p in range(1, min(rest, m.layers) + 1) if rest % p == 0]
        for pp in pps:
            if rest % pp:
                continue
            dp = rest // pp
            sequences = workload.sequences_per_step // dp
            if sequences < 1:
                continue
            micro_batches = [request.micro_batch] if request.micro_batch else _micro_batches(sequences)
            interleaves = _interleaves(m.layers, pp, request.interleave)
            for zero, recompute, micro_batch, interleave in itertools.product(
                zeros, recomputes, micro_batches, interleaves
            ):
                for every in _recompute_everies(recompute, m.layers, request):
                    yield Layout(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        zero=zero if dp > 1 else 0,
                        recompute=recompute,
                        micro_batch=micro_batch,
                        sequence_parallel=tp > 1
                        if request.sequence_parallel is None
                        else request.sequence_parallel,
                        interleave=interleave,
                        recompute_every=every,
                    )
