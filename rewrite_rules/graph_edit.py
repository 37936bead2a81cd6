"""Small graph surgery shared by the rules: rebuild a graph from new nodes (dropping the types and constants
nothing reads any more), drop a node's unread inputs, run a node's op on reshaped tensors (the pixel and dim
merges)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from rewrite_rules import fresh_name
from superopt.ir.compute import Compute
from superopt.ir.graph import Constant, Extern, Graph, Node
from superopt.ir.types import TensorType


def rebuild(graph: Graph, nodes: Sequence[Node], new_types: Mapping[str, TensorType] | None = None,
            new_constants: Mapping[str, np.ndarray | Constant] | None = None) -> Graph:
    """``graph`` with ``nodes`` (in topological order); types and constants kept only where still used."""
    new_types = dict(new_types or {})
    constants = dict(graph.constants)
    constants.update({k: v if isinstance(v, Constant) else Constant(v) for k, v in (new_constants or {}).items()})
    for k in new_constants or {}:
        new_types.setdefault(k, constants[k].type)
    read = set(graph.outputs) | {i for n in nodes for i in n.inputs}
    defined = set(graph.inputs) | {o for n in nodes for o in n.outputs}
    kept_constants = tuple((k, c) for k, c in constants.items() if k in read and k not in defined)
    names = defined | {k for k, _ in kept_constants}
    types = {**dict(graph.types), **new_types}
    return replace(graph, nodes=tuple(nodes), constants=kept_constants,
                   types=tuple((k, t) for k, t in types.items() if k in names))


def drop_unread_inputs(node: Node) -> Node:
    """``node`` without the op inputs no statement reads."""
    if node.is_extern:
        return node
    op = node.op
    read = {a.tensor for st in op.statements for a in st.expr.accesses()}
    keep = [k for k, local in enumerate(op.inputs) if local in read]
    if len(keep) == len(op.inputs):
        return node
    inputs = tuple(op.inputs[k] for k in keep)
    gone = set(op.inputs) - set(inputs)
    new_op = Compute(inputs, op.outputs, op.statements, tuple((n, t) for n, t in op.types if n not in gone))
    return replace(node, op=new_op, inputs=tuple(node.inputs[k] for k in keep))


def constant_locals(graph: Graph, node: Node) -> dict[str, Constant]:
    """Local name -> constant, for every input of a compute node that is a graph constant (its ``array`` is
    read only where a rule needs the value: a deferred constant's read computes it)."""
    constant = graph.constant
    return {local: constant[g] for local, g in zip(node.op.inputs, node.inputs) if g in constant}


def swap_nodes(graph: Graph, old: Iterable[Node], new: Node, at: Node) -> list[Node]:
    """The node list with every node of ``old`` removed and ``new`` placed where ``at`` was."""
    old_names = {n.name for n in old}
    return [new if n.name == at.name else n for n in graph.nodes if n.name not in old_names or n.name == at.name]


class Memo:
    """A bounded cache for what a rule's matcher computes per op: the graph search enumerates every rule's
    sites on each graph it expands, and most nodes (their ops shared, by object) recur from graph to graph."""

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self.values: dict = {}

    def get(self, key, compute):
        if key not in self.values:
            if len(self.values) >= self.limit:
                self.values.clear()
            self.values[key] = compute()
        return self.values[key]


def constant_inputs(graph: Graph, node: Node) -> frozenset[str]:
    """The node's inputs that are graph constants (their names)."""
    constant = graph.constant
    return frozenset(g for g in node.inputs if g in constant)


def with_reshaped_tensors(graph: Graph, node: Node, op: Compute, reshaped: set[str], tag: str) -> Graph:
    """``node`` running ``op`` instead, whose tensors in ``reshaped`` (the op's own names) take ``op``'s shapes: a
    reshape extern before it for each such input and after it for each such output (free aliases of the same
    memory), the graph's tensors keeping their shapes."""
    used = set(graph.type_of)
    names = {n.name for n in graph.nodes}
    new_types: dict[str, TensorType] = {}
    before, after = [], []
    inputs, outputs = list(node.inputs), list(node.outputs)
    for k, (local, g) in enumerate(zip(node.op.inputs, node.inputs)):
        if local in reshaped:
            inputs[k] = fresh_name(f"{g}_{tag}", used)
            new_types[inputs[k]] = op.type_of[local]
            before.append(Node(fresh_name(f"{node.name}_{tag}", names), Extern.of("reshape", shape=op.type_of[local].shape),
                               (g,), (inputs[k],)))
    for k, (local, g) in enumerate(zip(node.op.outputs, node.outputs)):
        if local in reshaped:
            outputs[k] = fresh_name(f"{g}_{tag}", used)
            new_types[outputs[k]] = op.type_of[local]
            after.append(Node(fresh_name(f"{node.name}_un{tag}", names), Extern.of("reshape", shape=graph.type_of[g].shape),
                              (outputs[k],), (g,)))
    new = Node(node.name, op, tuple(inputs), tuple(outputs))
    nodes = []
    for n in graph.nodes:
        nodes += [*before, new, *after] if n is node else [n]
    return rebuild(graph, nodes, new_types=new_types)


def reads_constant(graph: Graph, node: Node, local: set[str]) -> bool:
    """Whether any of ``node``'s inputs named ``local`` (the op's own names) is a constant of the graph."""
    consts = dict(graph.constants)
    return any(g in consts for name, g in zip(node.op.inputs, node.inputs) if name in local)
