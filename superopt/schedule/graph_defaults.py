"""The default schedule pass over a graph: one trace per compute node, from the heuristic.

The database and search passes (``search/``) produce the same mapping; the executor takes it as
it is and never schedules anything itself.
"""

from __future__ import annotations

from superopt.ir.graph import Graph, Node
from superopt.schedule.default import default_schedule
from superopt.schedule.primitives import Primitive
from superopt.target import Target


def constant_inputs(graph: Graph, node: Node) -> frozenset[str]:
    """The node's local input names bound to graph constants (packed once, ahead of time)."""
    return frozenset(local for local, g in zip(node.op.inputs, node.inputs) if g in graph.constant)


def default_schedules(graph: Graph, target: Target) -> dict[str, list[Primitive]]:
    """Node name -> the default heuristic's trace, for every compute node (equal kernels computed once)."""
    cache: dict[tuple[str, frozenset[str]], list[Primitive]] = {}
    out: dict[str, list[Primitive]] = {}
    for n in graph.nodes:
        if n.is_extern:
            continue
        key = (n.op.digest(), constant_inputs(graph, n))
        if key not in cache:
            cache[key] = default_schedule(n.op, target, key[1])
        out[n.name] = cache[key]
    return out
