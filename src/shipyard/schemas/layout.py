"""The arithmetic of a job's layout: parallelism degrees, the steps a token budget makes, the
gradient accumulation a global batch needs. Pure functions the spec's sections and the planner
call; nothing here reads a file."""

from __future__ import annotations

import math

from shipyard.errors import InvalidSpec


def resolve_degrees(
    tp: int | None, shard: int | None, replicate: int | None, world: int
) -> tuple[int, int, int]:
    """Every degree a number, their product ``world``: a ``-1`` takes what the others leave;
    anything left open is 1, but for the replicas (plain data parallel), which take the rest.
    Raises ``InvalidSpec`` when the degrees do not multiply to ``world``."""
    given = (tp, shard, replicate)
    tp = tp or 1
    if shard in (None, -1) and replicate in (None, -1):
        if shard == -1:
            shard, replicate = world // tp, 1
        else:
            shard, replicate = 1, world // tp
    elif shard in (None, -1):
        shard = world // (tp * (replicate or 1))
    elif replicate in (None, -1):
        replicate = world // (tp * shard)
    assert shard is not None and replicate is not None
    if tp * shard * replicate != world or min(shard, replicate) < 1:
        raise InvalidSpec(
            f"training.parallelism tp={given[0]}, dp_shard={given[1]}, "
            f"dp_replicate={given[2]} does not multiply to the job's {world} devices",
            hint="make tp x dp_shard x dp_replicate = resources.devices x resources.nodes, "
            "or give -1 for the one that takes the rest",
        )
    return tp, shard, replicate


def tp_degrees(heads: int, kv_heads: int, devices_per_node: int | None = None) -> list[int]:
    """The tensor-parallel degrees that split the attention and key/value heads evenly (and the
    devices of a node, when given)."""
    limit = devices_per_node or kv_heads
    return [t for t in range(1, limit + 1) if heads % t == 0 and kv_heads % t == 0 and limit % t == 0]


def total_steps(steps: int | None, tokens: int | None, global_batch_tokens: int) -> int:
    """Optimizer steps of a training section that gives either ``steps`` or ``tokens``."""
    if steps is not None:
        return steps
    assert tokens is not None
    return math.ceil(tokens / global_batch_tokens)


def grad_accum_steps(global_batch_tokens: int, micro_batch_size: int, seq_len: int, world_size: int) -> int:
    """Micro-steps per optimizer step on each device, as llm.c derives it."""
    tokens_per_fwdbwd = micro_batch_size * seq_len * world_size
    if global_batch_tokens % tokens_per_fwdbwd:
        raise InvalidSpec(
            f"training.global_batch_tokens ({global_batch_tokens}) is not a multiple of "
            f"micro_batch_size × seq_len × devices ({micro_batch_size} × {seq_len} × "
            f"{world_size} = {tokens_per_fwdbwd})",
            hint="change global_batch_tokens, micro_batch_size or resources.devices so it divides",
        )
    return global_batch_tokens // tokens_per_fwdbwd


def elastic_sizes(
    devices: tuple[int, int], nodes: tuple[int, int], tp: int, samples_per_step: int
) -> list[tuple[int, int]]:
    """The (nodes, devices per node) an elastic job may run on, within the (fewest, most) of
    each, one per size in all, fewest nodes first, smallest size first: those tensor
    parallelism divides and whose data-parallel ranks split the step's samples evenly (the
    global batch stays the spec's at every size)."""
    by_size: dict[int, tuple[int, int]] = {}
    for node_count in range(nodes[0], nodes[1] + 1):
        for per_node in range(devices[0], devices[1] + 1):
            size = node_count * per_node
            if per_node % tp == 0 and samples_per_step % (size // tp) == 0:
                by_size.setdefault(size, (node_count, per_node))
    return [by_size[size] for size in sorted(by_size)]


def micro_batch_for(samples_per_rank: int, wanted: int) -> int:
    """The largest micro-batch no larger than ``wanted`` that divides a rank's samples per step:
    at another size the rank's share changes, the step's batch does not."""
    return max(m for m in range(1, min(wanted, samples_per_rank) + 1) if samples_per_rank % m == 0)
