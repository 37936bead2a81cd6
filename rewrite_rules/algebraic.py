"""Algebraic rules: rewrite what a compute op evaluates into an equal, cheaper expression."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields, replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.interp import evaluate_compute
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Const, Expr, IndexValue
from superopt.ir.graph import Constant, Graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.lang.parser import infer_dtype


def _constant_only(e: Expr, consts: set[str], padded: set[str]) -> bool:
    """An operation (not a bare read) whose every read is of a constant, unpadded tensor."""
    if isinstance(e, (Access, Const)):
        return False
    nodes = list(e.walk())
    reads = [x for x in nodes if isinstance(x, Access)]
    return bool(reads) and not any(isinstance(x, IndexValue) for x in nodes) and all(
        a.tensor in consts and a.tensor not in padded for a in reads)


def _rebuild(e: Expr, fold) -> Expr:
    """``e`` with every Expr-valued field passed through ``fold``."""
    kw = {f.name: fold(getattr(e, f.name)) for f in fields(e) if isinstance(getattr(e, f.name), Expr)}
    return replace(e, **kw) if kw else e


def hoist_in(compute: Compute, consts: dict[str, np.ndarray]) -> tuple[Compute, dict[str, np.ndarray]] | None:
    """Precompute the first maximal constant-only subexpression of ``compute`` as a new input."""
    found: list = []
    types = compute.type_of

    for k, st in enumerate(compute.statements):
        padded = set(st.pad_value)

        def fold(e: Expr, st=st, padded=padded) -> Expr:
            if found:
                return e
            if _constant_only(e, set(consts), padded):
                dims = [d for d, _ in st.extents if any(d in ix.dims for a in e.accesses() for ix in a.index)]
                dtype = infer_dtype(e, types, "float32")
                name = fresh_name("C", set(types))
                shape = tuple(st.extent[d] for d in dims)
                reads = sorted({a.tensor for a in e.accesses()})
                tmp = Compute(tuple(reads), (name,), (Statement(name, tuple(dims), "=", e, tuple(
                    (d, st.extent[d]) for d in dims)),), tuple((t, types[t]) for t in reads) + (
                    (name, TensorType(shape, dtype)),))
                (value,) = evaluate_compute(tmp, {t: consts[t] for t in reads}, np.float64)
                found.append((name, np.asarray(value).astype(TensorType(shape, dtype).np_dtype), dtype))
                return Access(name, tuple(Affine.dim(d) for d in dims))
            return _rebuild(e, fold)

        new_expr = fold(st.expr)
        if found:
            name, value, dtype = found[0]
            statements = list(compute.statements)
            statements[k] = replace(st, expr=new_expr)
            new = Compute(compute.inputs + (name,), compute.outputs, tuple(statements),
                          compute.types + ((name, TensorType(value.shape, dtype)),))
            return new, {name: value}
    return None



def _constant_locals(graph: Graph, node) -> dict[str, np.ndarray]:
    constant = graph.constant
    return {local: constant[g].array for local, g in zip(node.op.inputs, node.inputs) if g in constant}


def _has_constant_subexpression(compute: Compute, consts: set[str]) -> bool:
    for st in compute.statements:
        padded = set(st.pad_value)
        if any(_constant_only(e, consts, padded) for e in st.expr.walk()):
            return True
    return False


def constant_subexpression_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not node.is_extern and _has_constant_subexpression(node.op, set(_constant_locals(graph, node))):
            yield (node.name,)


def hoist_constant_subexpressions(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    got = None if node.is_extern else hoist_in(node.op, _constant_locals(graph, node))
    if got is None:
        raise RuleNotApplicable(f"node {site[0]!r} has no constant-only subexpression")
    op, ((local, value),) = got[0], got[1].items()
    gname = fresh_name(f"{node.name}_{local}", set(graph.type_of))
    new_node = replace(node, op=op, inputs=node.inputs + (gname,))
    return replace(graph, nodes=tuple(new_node if n is node else n for n in graph.nodes),
                   types=graph.types + ((gname, op.type_of[local]),),
                   constants=graph.constants + ((gname, Constant(value)),))


def _examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    b = GraphBuilder("conv_batchnorm")
    x = b.input("x", (1, 3, 5, 5))
    w = b.constant(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    g, bias, mean = (b.constant(rng.standard_normal(4).astype(np.float32), n) for n in ("g", "b", "m"))
    var = b.constant(rng.random(4).astype(np.float32) + 0.5, "v")
    y = b.compute1("P[n,co,y,x] += X[n,ci,y,x] * W[co,ci,0,0]\n"
                   "O[n,co,y,x] = (P[n,co,y,x] - M[co]) * (G[co] * rsqrt(V[co] + 0.00001)) + B[co]",
                   {"X": x, "W": w, "G": g, "B": bias, "M": mean, "V": var}, "conv_bn")
    b2 = GraphBuilder("scaled_weights")
    x2 = b2.input("x", (3, 4))
    w2 = b2.constant(rng.standard_normal((4, 6)).astype(np.float32), "w")
    y2 = b2.compute1("O[i,j] += X[i,k] * (W[k,j] * 0.5)", {"X": x2, "W": w2}, "mm")
    return [b.build([y]), b2.build([y2])]


# e(c_1..c_k) with every c_i constant = C, a constant computed once (batch norm's gamma / sqrt(var + eps))
HOIST_CONSTANTS = Rule("hoist_constant_subexpressions", "algebraic",
                       "e(c_1, ..., c_k) over constants only = a precomputed constant tensor",
                       constant_subexpression_sites, hoist_constant_subexpressions, _examples)

RULES = [HOIST_CONSTANTS]
