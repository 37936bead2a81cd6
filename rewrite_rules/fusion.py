"""Fusion rules: merge compute nodes so that intermediate tensors never reach memory.

After a merge the scheduler sees one compute op: an elementwise tail is inlined, or applied at a
contraction's register-tile write-back (an epilogue), instead of a separate pass over memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from operator import itemgetter

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, map_expr
from superopt.ir.graph import Graph, Node
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType


def _is_elementwise_reader(c: Compute, local: str) -> bool:
    """Every statement is an assignment over its own box, reading ``local`` only at its output index."""
    shape = c.type_of[local].shape
    for st in c.statements:
        if st.reduce != "=" or local in st.pad_value:
            return False
        ident = tuple(Affine.dim(d) for d in st.out_dims)
        for a in st.expr.accesses():
            if a.tensor == local and (a.index != ident or st.out_shape != shape):
                return False
    return True


def _rename_statement(st: Statement, names: dict[str, str]) -> Statement:
    def sub(e):
        if isinstance(e, Access) and e.tensor in names:
            return Access(names[e.tensor], e.index)
        return e

    return Statement(names.get(st.out, st.out), st.out_dims, st.reduce, map_expr(st.expr, sub), st.extents,
                     tuple((names.get(t, t), v) for t, v in st.padding))


def merge_nodes(producer: Node, consumer: Node) -> Node:
    """One node computing ``consumer`` with ``producer``'s single output as an internal temporary."""
    p, c = producer.op, consumer.op
    (t,) = producer.outputs
    local_of = dict(zip(producer.inputs, p.inputs))  # graph tensor -> local name in the merged op
    local_of[t] = p.outputs[0]
    used = {n for n, _ in p.types}
    names: dict[str, str] = {}
    inputs, graph_inputs, types = list(p.inputs), list(producer.inputs), list(p.types)
    for local, g in zip(c.inputs, consumer.inputs):
        if g not in local_of:
            local_of[g] = fresh_name(local, used)
            inputs.append(local_of[g])
            graph_inputs.append(g)
            types.append((local_of[g], c.type_of[local]))
        names[local] = local_of[g]
    for st in c.statements:
        names[st.out] = fresh_name(st.out, used)
    types += [(names[n], ty) for n, ty in c.types if n not in c.inputs]
    statements = list(p.statements) + [_rename_statement(st, names) for st in c.statements]
    op = Compute(tuple(inputs), tuple(names[o] for o in c.outputs), tuple(statements), tuple(types))
    return Node(consumer.name, op, tuple(graph_inputs), consumer.outputs)



def _fusable(graph: Graph, prod: Node | None, consumer: Node, t: str) -> bool:
    """``consumer`` may absorb ``prod``: it is ``t``'s only reader, reading it elementwise."""
    if consumer.is_extern or prod is None or prod.is_extern or len(prod.outputs) != 1 or t in graph.outputs:
        return False
    if any(n is not consumer for n in graph.consumers.get(t, [])):
        return False
    return all(_is_elementwise_reader(consumer.op, x) for x, g in zip(consumer.op.inputs, consumer.inputs) if g == t)


def elementwise_fusion_sites(graph: Graph) -> Iterator[Site]:
    producer_of = graph.producer
    for consumer in graph.nodes:
        for t in dict.fromkeys(consumer.inputs):
            prod = producer_of.get(t)
            if _fusable(graph, prod, consumer, t):
                yield (prod.name, consumer.name)


def fuse_elementwise_into_producer(graph: Graph, site: Site) -> Graph:
    prod, consumer = node_named(graph, site[0]), node_named(graph, site[1])
    (t,) = prod.outputs if len(prod.outputs) == 1 else (None,)
    if t is None or t not in consumer.inputs or not _fusable(graph, prod, consumer, t):
        raise RuleNotApplicable(f"{site[1]!r} cannot absorb {site[0]!r}")
    merged = merge_nodes(prod, consumer)
    nodes = tuple(merged if n is consumer else n for n in graph.nodes if n is not prod)
    return replace(graph, nodes=nodes, types=_without(graph.types, t))


def _without(types: tuple[tuple[str, TensorType], ...], name: str) -> tuple[tuple[str, TensorType], ...]:
    """``types`` without ``name``'s entries, in order (sliced where it has one: a graph search over a large
    model fuses hundreds of times, and a Python pass over every tensor each time adds up)."""
    names = list(map(itemgetter(0), types))
    if names.count(name) == 1:
        k = names.index(name)
        return types[:k] + types[k + 1:]
    return tuple((n, ty) for n, ty in types if n != name)


def _examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    out = []
    # conv + bias (one op) -> relu -> residual add: the resnet block tail
    b = GraphBuilder("conv_relu_add")
    x = b.input("x", (1, 4, 6, 6))
    w = b.constant(rng.standard_normal((5, 4, 3, 3)).astype(np.float32), "w")
    bias = b.constant(rng.standard_normal(5).astype(np.float32), "bias")
    y = b.compute1("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\nO[n,co,y,x] = P[n,co,y,x] + B[co]",
                   {"X": x, "W": w, "B": bias}, "conv", extents={"y": 6, "x": 6}, padding={"X": 0.0})
    r = b.compute1("O[n,c,y,x] = relu(A[n,c,y,x])", {"A": y}, "relu")
    s = b.input("skip", (1, 5, 6, 6))
    out.append(b.build([b.compute1("O[n,c,y,x] = A[n,c,y,x] + S[n,c,y,x]", {"A": r, "S": s}, "add")]))
    # elementwise chain reading the same input twice, with a name clash between the ops' locals
    b = GraphBuilder("chain")
    x = b.input("x", (3, 7))
    h = b.compute1("O[i,j] = X[i,j] * X[i,j]", {"X": x}, "sq")
    out.append(b.build([b.compute1("O[i,j] = tanh(X[i,j]) + Y[i,j]", {"X": h, "Y": x}, "mix")]))
    return out


# f(g(x)) -> (f . g)(x): an elementwise op joins the op producing its input when it is the only reader
FUSE_ELEMENTWISE = Rule("fuse_elementwise_into_producer", "fusion",
                        "f(g(x)) = (f . g)(x) for elementwise f reading g's only use",
                        elementwise_fusion_sites, fuse_elementwise_into_producer, _examples)

RULES = [FUSE_ELEMENTWISE]
