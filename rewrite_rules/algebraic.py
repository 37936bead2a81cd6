"""Algebraic rules: rewrite what a compute op evaluates into an equal, cheaper expression."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields, replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from rewrite_rules.graph_edit import constant_locals
from superopt.builder import GraphBuilder
from superopt.interp import evaluate_compute
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, Const, Expr, IndexValue, substitute_dims
from superopt.ir.graph import Constant, DeferredConstant, Graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType, is_float
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


def hoist_in(compute: Compute, consts: Mapping[str, Constant]) -> tuple[Compute, dict[str, Constant]] | None:
    """Precompute the first maximal constant-only subexpression of ``compute`` as a new input (a deferred
    constant: computed when the program is built, not for each candidate graph of the search)."""
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
                ty = TensorType(shape, dtype)

                def evaluated(*arrays, tmp=tmp, reads=reads, ty=ty) -> np.ndarray:
                    (v,) = evaluate_compute(tmp, dict(zip(reads, arrays)), np.float64)
                    return np.asarray(v).astype(ty.np_dtype)

                found.append((name, DeferredConstant(ty, f"evaluate {tmp.digest()}", [consts[t] for t in reads], evaluated)))
                return Access(name, tuple(Affine.dim(d) for d in dims))
            return _rebuild(e, fold)

        new_expr = fold(st.expr)
        if found:
            name, value = found[0]
            statements = list(compute.statements)
            statements[k] = replace(st, expr=new_expr)
            new = Compute(compute.inputs + (name,), compute.outputs, tuple(statements), compute.types + ((name, value.type),))
            return new, {name: value}
    return None



def _has_constant_subexpression(compute: Compute, consts: set[str]) -> bool:
    for st in compute.statements:
        padded = set(st.pad_value)
        if any(_constant_only(e, consts, padded) for e in st.expr.walk()):
            return True
    return False


def constant_subexpression_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not node.is_extern and _has_constant_subexpression(node.op, set(constant_locals(graph, node))):
            yield (node.name,)


def hoist_constant_subexpressions(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    got = None if node.is_extern else hoist_in(node.op, constant_locals(graph, node))
    if got is None:
        raise RuleNotApplicable(f"node {site[0]!r} has no constant-only subexpression")
    op, ((local, value),) = got[0], got[1].items()
    gname = fresh_name(f"{node.name}_{local}", set(graph.type_of))
    new_node = replace(node, op=op, inputs=node.inputs + (gname,))
    return replace(graph, nodes=tuple(new_node if n is node else n for n in graph.nodes),
                   types=graph.types + ((gname, op.type_of[local]),),
                   constants=graph.constants + ((gname, value),))


def _terms(e: Expr, divide: bool) -> list[tuple[Expr, bool]]:
    """The leaves of ``e``'s product tree as (expr, is a divisor); with ``divide``, ``a / b`` is a's terms
    and the divisor b, else a leaf."""
    if isinstance(e, Binary) and e.op == "*":
        return _terms(e.a, divide) + _terms(e.b, divide)
    if divide and isinstance(e, Binary) and e.op == "/":
        return _terms(e.a, divide) + [(e.b, True)]
    return [(e, False)]


def _combine(terms: list[tuple[Expr, bool]]) -> Expr:
    """The product of the terms, divided by the divisors (a leading 1 when all are divisors)."""
    out = next((e for e, div in terms if not div), None)
    rest = list(terms)
    if out is None:
        out = Const(1.0)
    else:
        rest.remove((out, False))
    for e, div in rest:
        out = Binary("/" if div else "*", out, e)
    return out


def _expanded_terms(compute: Compute, st: Statement, divide: bool) -> tuple[list[tuple[Expr, bool]], set[str]]:
    """The terms of ``st``'s product, reads of a product temporary that only ``st`` reads (once)
    replaced by that temporary's terms, at ``st``'s index; and the temporaries so replaced."""
    defs = {x.out: x for x in compute.statements}
    reads = [a.tensor for x in compute.statements for a in x.expr.accesses()]
    out: list[tuple[Expr, bool]] = []
    used: set[str] = set()
    for f, div in _terms(st.expr, divide):
        d = defs.get(f.tensor) if isinstance(f, Access) and not div else None
        if d is None or d.reduce != "=" or d.padding or f.tensor in compute.outputs or reads.count(f.tensor) != 1 \
                or f.tensor in st.pad_value or len(_terms(d.expr, divide)) < 2:
            out.append((f, div))
            continue
        at = dict(zip(d.out_dims, f.index))
        out += [(substitute_dims(g, at), gdiv) for g, gdiv in _terms(d.expr, divide)]
        used.add(f.tensor)
    return out, used


def _split_terms(compute: Compute, st: Statement, divide: bool):
    """(terms over the reduction, terms constant over it, temporaries substituted) of a float sum of
    products with both kinds of term, and (``divide``) a divisor among the constant ones; else None."""
    if st.reduce != "+=" or not st.reduce_dims or not is_float(compute.type_of[st.out].dtype):
        return None
    terms, used = _expanded_terms(compute, st, divide)
    red = set(st.reduce_dims)

    def over_reduction(e: Expr) -> bool:
        return any(isinstance(x, (Access, IndexValue)) and any(
            red & ix.vars() for ix in (x.index if isinstance(x, Access) else (x.index,))) for x in e.walk())

    inner = [t for t in terms if over_reduction(t[0])]
    outer = [t for t in terms if not over_reduction(t[0])]
    if not any(not div for _, div in inner) or not outer or divide != any(div for _, div in outer):
        return None
    return inner, outer, used


def _factor_sites(divide: bool):
    def sites(graph: Graph) -> Iterator[Site]:
        for node in graph.nodes:
            if node.is_extern:
                continue
            for k, st in enumerate(node.op.statements):
                if _split_terms(node.op, st, divide) is not None:
                    yield (node.name, k)
    return sites


def _factor_out(divide: bool):
    def apply(graph: Graph, site: Site) -> Graph:
        node = node_named(graph, site[0])
        k = site[1]
        op = node.op
        got = None if node.is_extern or k >= len(op.statements) else _split_terms(op, op.statements[k], divide)
        if got is None:
            raise RuleNotApplicable(f"statement {k} of node {site[0]!r} is not a sum of products with a "
                                    f"{'divisor' if divide else 'factor'} constant over its reduction")
        inner, outer, used = got
        st = op.statements[k]
        types = op.type_of
        partial = fresh_name(f"{st.out}_sum", set(types))
        out_ext = tuple((d, n) for d, n in st.extents if d in st.out_dims)
        own = Access(partial, tuple(Affine.dim(d) for d in st.out_dims))
        outer_reads = {a.tensor for e, _ in outer for a in e.accesses()}
        statements = [x for x in op.statements[:k] if x.out not in used]
        statements += [replace(st, out=partial, expr=_combine(inner)),
                       Statement(st.out, st.out_dims, "=", _combine([(own, False), *outer]), out_ext,
                                 tuple((t, v) for t, v in st.padding if t in outer_reads))]
        statements += op.statements[k + 1:]
        new_types = tuple((t, ty) for t, ty in op.types if t not in used) + ((partial, types[st.out]),)
        new_op = Compute(op.inputs, op.outputs, tuple(statements), new_types)
        return replace(graph, nodes=tuple(replace(n, op=new_op) if n is node else n for n in graph.nodes))
    return apply


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


def _factor_examples() -> list[Graph]:
    rng = np.random.default_rng(1)
    b = GraphBuilder("scaled_rows")  # the softmax's normalization times the values (attention)
    e, r, v = b.input("e", (3, 5)), b.input("r", (3, 1)), b.input("v", (5, 4))
    y = b.compute1("P[i,k] = E[i,k] * R[i,0]\nO[i,j] += P[i,k] * V[k,j]", {"E": e, "R": r, "V": v}, "weighted")
    b2 = GraphBuilder("scaled_columns")
    x, s2 = b2.input("x", (2, 3, 6)), b2.input("s", (4,))
    w = b2.constant(rng.standard_normal((6, 4)).astype(np.float32), "w")
    y2 = b2.compute1("O[n,i,j] += X[n,i,k] * (W[k,j] * (S[j] + 1.0))", {"X": x, "W": w, "S": s2}, "mm")
    return [b.build([y]), b2.build([y2])]


def _divide_examples() -> list[Graph]:
    b = GraphBuilder("normalized_rows")  # softmax as the attention op writes it: exp / sum, times the values
    e, v = b.input("e", (3, 5)), b.input("v", (5, 4))
    y = b.compute1("Z[i,u] += E[i,k]\nP[i,k] = E[i,k] / Z[i,0]\nO[i,j] += P[i,k] * V[k,j]", {"E": e, "V": v},
                   "weighted", extents={"u": 1})
    b2 = GraphBuilder("scaled_sum")
    x, s2 = b2.input("x", (4, 6)), b2.input("s", (4,))
    y2 = b2.compute1("O[i] += X[i,k] * 3.0 / (S[i] * S[i] + 1.0)", {"X": x, "S": s2}, "mean")
    return [b.build([y]), b2.build([y2])]


# sum_k (a_k * c) = c * sum_k a_k, where c does not vary over k (the softmax's 1/Z out of the weighted sum)
FACTOR_OUT_OF_SUM = Rule("factor_out_of_sum", "algebraic",
                         "sum_k f(k) * c = c * sum_k f(k) when c does not depend on k",
                         _factor_sites(False), _factor_out(False), _factor_examples, polynomial=True)
# sum_k (a_k / c) = (sum_k a_k) / c: one division per output instead of one per term
DIVIDE_AFTER_SUM = Rule("divide_after_sum", "algebraic",
                        "sum_k f(k) / c = (sum_k f(k)) / c when c does not depend on k",
                        _factor_sites(True), _factor_out(True), _divide_examples)

RULES = [HOIST_CONSTANTS, FACTOR_OUT_OF_SUM, DIVIDE_AFTER_SUM]
