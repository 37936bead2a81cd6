"""Small graph surgery shared by the folding, merging and movement rules: rebuild a graph from new
nodes (dropping the types and constants nothing reads any more), drop a node's unread inputs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.graph import Constant, Graph, Node
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
