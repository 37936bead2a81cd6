"""Dead-code elimination on graphs: unused nodes, unused compute outputs, unused statements.

An output of a compute node that nothing reads becomes a temporary of that compute. That is more
than tidiness: a temporary can be computed row by row inside its consumer's loops (compute_at)
and never touch memory, while an output must be written out whole. The ONNX LayerNormalization
op, for example, always computes its mean and inverse standard deviation; few models read them.
"""

from __future__ import annotations

from dataclasses import replace

from superopt.ir.compute import Compute
from superopt.ir.graph import Graph, Node


def prune_compute(compute: Compute, keep: set[str]) -> Compute:
    """Keep only the outputs in ``keep`` (at least one) and the statements they depend on."""
    outputs = tuple(o for o in compute.outputs if o in keep)
    if not outputs:
        raise ValueError("prune_compute must keep at least one output")
    needed = set(outputs)
    statements = []
    for st in reversed(compute.statements):
        if st.out in needed:
            statements.append(st)
            needed |= {a.tensor for a in st.expr.accesses()}
    statements.reverse()
    inputs = tuple(i for i in compute.inputs if i in needed)
    names = set(inputs) | {st.out for st in statements}
    types = tuple((n, t) for n, t in compute.types if n in names)
    return Compute(inputs, outputs, tuple(statements), types)


def prune_graph(graph: Graph) -> Graph:
    """Drop nodes, compute outputs and statements that no graph output depends on."""
    live = set(graph.outputs)
    kept_outputs: set[str] = set()  # every output of a node kept whole (an extern's unread outputs keep types)
    nodes: list[Node] = []
    for node in reversed(graph.nodes):
        used = [o for o in node.outputs if o in live]
        if not used:
            continue
        if node.is_extern or len(used) == len(node.outputs):
            nodes.append(node)
            live |= set(node.inputs)
            kept_outputs |= set(node.outputs)
            continue
        local = dict(zip(node.outputs, node.op.outputs))
        op = prune_compute(node.op, {local[o] for o in used})
        by_local = dict(zip(node.op.inputs, node.inputs))
        inputs = tuple(by_local[i] for i in op.inputs)
        nodes.append(replace(node, op=op, inputs=inputs, outputs=tuple(used)))
        live |= set(inputs)
    nodes.reverse()
    names = live | kept_outputs | set(graph.inputs)
    return replace(
        graph,
        nodes=tuple(nodes),
        types=tuple((n, t) for n, t in graph.types if n in names),
        constants=tuple((n, c) for n, c in graph.constants if n in live),
    )
