"""Why a job waits: a stable code (what a program matches on) and the message a person reads.

Messages count over nodes as Kubernetes does: ``0/3 nodes: 2 insufficient free v100, 1 wrong
accelerator type (v100: 1 of 8 free, needs 4)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from shipyard.scheduling.model import Job, Node
from shipyard.scheduling.status import Reason, Status


def pending_reasons(
    waiting: Sequence[Job],
    nodes: Sequence[Node],
    node_free: Mapping[str, int],
    refused: Mapping[str, Status] | None = None,
) -> dict[str, Status]:
    """Why each waiting job waits after the round's leases took ``node_free``'s complement;
    nodes in ``refused`` (turned away by a filter) count as such, not as free."""
    refused = refused or {}
    capacity: dict[str, int] = {}
    free: dict[str, int] = {}
    free_by_node: dict[str, list[int]] = {}
    shut: dict[str, list[Node]] = {}
    """Refused nodes with free devices, by type."""
    largest_of: dict[str, int] = {}  # once per type, not once per job over every node
    for node in nodes:
        kind = node.accelerator_type
        largest_of[kind] = max(largest_of.get(kind, 0), node.devices)
        capacity[kind] = capacity.get(kind, 0) + node.devices
        free.setdefault(kind, 0)
        free_by_node.setdefault(kind, [])
        if node.id in refused:
            shut.setdefault(kind, []).append(node)
            continue
        free[kind] += node_free[node.id]
        free_by_node[kind].append(node_free[node.id])
    node_free = {n: 0 if n in refused else f for n, f in node_free.items()}
    reasons: dict[str, Status] = {}
    for job in waiting:
        allowed = sorted(k for k in capacity if job.allows(k))
        if not allowed:
            types = ", ".join(job.accelerator_types)
            reasons[job.id] = Status(
                Reason.NO_SUCH_ACCELERATOR, f"0/{len(nodes)} nodes: no device of type {types}"
            )
            continue
        largest_node = max(largest_of[k] for k in allowed)
        if job.per_node and (job.node_count > 1 or largest_node < job.per_node):
            # Several nodes, or one larger than any: name the nodes (one fits: count as below).
            reasons[job.id] = _whole_nodes_reason(job, allowed, nodes, node_free)
            continue
        largest = max(capacity[k] for k in allowed)
        if largest < job.devices:
            message = f"needs {job.devices} devices of one type; the largest type here has {largest}"
            reasons[job.id] = Status(Reason.GANG_TOO_LARGE, message)
            continue
        counts: dict[str, int] = {}
        closed = [n for k in allowed for n in shut.get(k, ())]
        wrong = len(nodes) - sum(len(free_by_node[k]) for k in allowed) - len(closed)
        if wrong:
            counts["wrong accelerator type"] = wrong
        if closed:
            counts[f"cordoned ({refused[closed[0].id].message})"] = len(closed)
        ranked_behind = "free devices given to jobs the policy ranks first"
        for k in allowed:
            if free[k] >= job.devices:
                # Room on the type (maybe spread over nodes): the policy ranked other jobs first.
                counts[ranked_behind] = counts.get(ranked_behind, 0) + len(free_by_node[k])
            elif free_by_node[k]:
                counts[f"insufficient free {k}"] = len(free_by_node[k])
        summary = ", ".join(f"{n} {why}" for why, n in counts.items())
        detail = "; ".join(f"{k}: {free[k]} of {capacity[k]} free, needs {job.devices}" for k in allowed)
        code = Reason.RANKED_BEHIND if ranked_behind in counts else Reason.INSUFFICIENT_DEVICES
        if closed and code == Reason.INSUFFICIENT_DEVICES:
            code = Reason.CORDONED  # the cordoned nodes are what it waits for
        reasons[job.id] = Status(code, f"0/{len(nodes)} nodes: {summary} ({detail})")
    return reasons


def _whole_nodes_reason(
    job: Job, allowed: Sequence[str], nodes: Sequence[Node], node_free: Mapping[str, int]
) -> Status:
    """Why a gang of whole nodes (``per_node`` devices on each of ``node_count`` nodes) waits,
    naming the nodes that are too small or too busy for it."""
    of_type = [n for n in nodes if n.accelerator_type in allowed]
    count = job.node_count
    wanted = f"{count} node{'s' if count > 1 else ''} with {job.per_node} {'/'.join(allowed)} each"
    large = [n for n in of_type if n.devices >= job.per_node]
    if len(large) < count:
        small = _named(f"{n.id} has {n.devices}" for n in of_type if n.devices < job.per_node)
        return Status(
            Reason.GANG_TOO_LARGE,
            f"needs {wanted}; {len(large)} of {len(nodes)} nodes are that large ({small or 'no such nodes'})",
        )
    free = [n for n in large if node_free[n.id] >= job.per_node]
    if len(free) >= count:
        return Status(
            Reason.RANKED_BEHIND,
            f"0/{len(nodes)} nodes: free devices given to jobs the policy ranks first (needs {wanted})",
        )
    busy = _named(f"{n.id} {node_free[n.id]} of {n.devices} free" for n in large if n not in free)
    return Status(
        Reason.INSUFFICIENT_DEVICES,
        f"0/{len(nodes)} nodes: needs {wanted}, {len(free)} of them free now ({busy})",
    )


def _named(items: Iterable[str], limit: int = 8) -> str:
    listed = list(items)
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return ", ".join(listed[:limit]) + more
