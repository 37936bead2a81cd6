"""Folding rules: a constant affine map applied to a contraction's output goes into its weights and bias.

``P[..c..] += X[...] * W[..c..]`` followed by elementwise statements that are affine in P with constant,
per-output-channel coefficients (``O = (P - M[c]) * S[c] + B[c]``: a batch norm in inference; a scalar
Mul; a bias add, another bias add) becomes ``P' += X * W'`` with ``W' = W * a[c]`` and one bias add
``O = P' + b[c]``: the per-channel mean/scale arithmetic is gone from every output element.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from rewrite_rules.fusion import merge_nodes
from rewrite_rules.graph_edit import Memo, constant_inputs, constant_locals, drop_unread_inputs, rebuild, swap_nodes
from superopt.builder import GraphBuilder
from superopt.interp import evaluate_compute
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, Const, Expr, IndexValue, Unary, substitute_dims
from superopt.ir.graph import Constant, DeferredConstant, Graph, Node
from superopt.ir.statement import Statement

ONE = Const(1.0)


# ---- affine forms a * P + b over expressions (None is zero) ---------------------------------------
def _add(x: Expr | None, y: Expr | None) -> Expr | None:
    return y if x is None else x if y is None else Binary("+", x, y)


def _mul(x: Expr | None, y: Expr | None) -> Expr | None:
    if x is None or y is None:
        return None
    return y if x == ONE else x if y == ONE else Binary("*", x, y)


def _neg(x: Expr | None) -> Expr | None:
    return None if x is None else Unary("neg", x)


def _reads(e: Expr, t: str) -> bool:
    return any(a.tensor == t for a in e.accesses())


def affine_in(e: Expr, p: str) -> tuple[Expr | None, Expr | None] | None:
    """(a, b) with ``e = a * p + b`` where neither a nor b reads ``p``; None when e is not affine in p."""
    if not _reads(e, p):
        return None, e
    if isinstance(e, Access):
        return ONE, None
    if isinstance(e, Unary) and e.fn == "neg":
        inner = affine_in(e.x, p)
        return None if inner is None else (_neg(inner[0]), _neg(inner[1]))
    if not isinstance(e, Binary) or e.op not in ("+", "-", "*", "/"):
        return None
    if e.op in ("+", "-"):
        left, right = affine_in(e.a, p), affine_in(e.b, p)
        if left is None or right is None:
            return None
        if e.op == "-":
            right = (_neg(right[0]), _neg(right[1]))
        return _add(left[0], right[0]), _add(left[1], right[1])
    if e.op == "*" and not _reads(e.a, p):
        e = Binary("*", e.b, e.a)
    if _reads(e.b, p):  # p * p, or dividing by p
        return None
    inner = affine_in(e.a, p)
    if inner is None:
        return None
    if e.op == "*":
        return _mul(inner[0], e.b), _mul(inner[1], e.b)
    return (None if inner[0] is None else Binary("/", inner[0], e.b),
            None if inner[1] is None else Binary("/", inner[1], e.b))


def _constant_expr(e: Expr | None, consts: set[str]) -> bool:
    return e is None or all(isinstance(x, Access) and x.tensor in consts or not isinstance(x, (Access, IndexValue))
                            for x in e.walk())


def _dims_of(e: Expr | None) -> set[str]:
    return set() if e is None else {d for a in e.accesses() for ix in a.index for d in ix.vars()}


# ---- the fold inside one compute op ---------------------------------------------------------------
def _product_factors(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "*":
        return _product_factors(e.a) + _product_factors(e.b)
    return [e]


def _readers(op: Compute, t: str) -> list[int]:
    return [k for k, st in enumerate(op.statements) if _reads(st.expr, t)]


def _identity_reader(st: Statement, t: str, shape: tuple[int, ...]) -> bool:
    ident = tuple(Affine.dim(d) for d in st.out_dims)
    return (st.reduce == "=" and not st.padding and st.out_shape == shape
            and all(a.index == ident for a in st.expr.accesses() if a.tensor == t))


@dataclass(frozen=True)
class Fold:
    contraction: int  # statement index of P += ... * W ...
    chain: tuple[int, ...]  # the affine statements folded, in order; the last one stays as O = P + b
    weight: str  # local name of the constant factor scaled
    scale: Expr  # over the contraction's output dims
    bias: Expr | None


def _weight_axes(st: Statement, w: str) -> dict[str, int] | None:
    (acc,) = [a for a in st.expr.accesses() if a.tensor == w]
    return {ix.terms[0][0]: axis for axis, ix in enumerate(acc.index) if ix.is_plain_dim}


def find_fold(op: Compute, consts: set[str], k: int) -> Fold | None:
    """The fold of the affine statements after contraction statement ``k``, when there is one worth doing."""
    s = op.statements[k]
    if s.reduce != "+=" or s.out in op.outputs or s.padding and any(t in consts for t, _ in s.padding):
        return None
    scale, bias, chain, cur = ONE, None, [], s.out
    shape = op.type_of[s.out].shape
    while cur not in op.outputs:
        readers = _readers(op, cur)
        if len(readers) != 1 or not _identity_reader(op.statements[readers[0]], cur, shape):
            break
        e = op.statements[readers[0]]
        form = affine_in(e.expr, cur)
        if form is None or form[0] is None or not (_constant_expr(form[0], consts) and _constant_expr(form[1], consts)):
            break
        to_s = {d: Affine.dim(c) for d, c in zip(e.out_dims, s.out_dims)}
        a, b = (None if x is None else substitute_dims(x, to_s) for x in form)
        scale, bias = _mul(scale, a), _add(_mul(bias, a), b)
        chain.append(readers[0])
        cur = e.out
    if not chain or (scale == ONE and len(chain) < 2):
        return None
    weights = [f.tensor for f in _product_factors(s.expr) if isinstance(f, Access) and f.tensor in consts
               and sum(a.tensor == f.tensor for st in op.statements for a in st.expr.accesses()) == 1]
    for w in weights:
        axes = _weight_axes(s, w)
        if scale == ONE or _dims_of(scale) <= set(axes):
            return Fold(k, tuple(chain), w, scale, bias)
    return None


def scaled_weight(op: Compute, fold: Fold, consts: dict[str, np.ndarray]) -> np.ndarray:
    """W * scale, evaluated over W's box (float64, stored in W's dtype)."""
    s = op.statements[fold.contraction]
    w = fold.weight
    wtype = op.type_of[w]
    axes = _weight_axes(s, w)
    dims = tuple(f"w{i}" for i in range(wtype.rank))
    scale = substitute_dims(fold.scale, {d: Affine.dim(dims[axis]) for d, axis in axes.items()})
    reads = sorted({a.tensor for a in scale.accesses()} | {w})
    expr = Binary("*", Access(w, tuple(Affine.dim(d) for d in dims)), scale)
    tmp = Compute(tuple(reads), ("Wf",), (Statement("Wf", dims, "=", expr, tuple(zip(dims, wtype.shape))),),
                  tuple((t, op.type_of[t]) for t in reads) + (("Wf", wtype),))
    (value,) = evaluate_compute(tmp, {t: consts[t] for t in reads}, np.float64)
    return np.asarray(value).astype(wtype.np_dtype)


def folded_op(op: Compute, fold: Fold) -> Compute:
    """The op with the chain replaced by one statement ``O = P + bias`` (the weight itself is swapped by the caller)."""
    s = op.statements[fold.contraction]
    last = op.statements[fold.chain[-1]]
    p = Access(s.out, tuple(Affine.dim(d) for d in s.out_dims))
    tail = Statement(last.out, s.out_dims, "=", p if fold.bias is None else Binary("+", p, fold.bias),
                     tuple((d, s.extent[d]) for d in s.out_dims))
    gone = {op.statements[j].out for j in fold.chain[:-1]}
    statements = tuple(tail if j == fold.chain[-1] else st for j, st in enumerate(op.statements) if j not in fold.chain[:-1])
    return Compute(op.inputs, op.outputs, statements, tuple((n, t) for n, t in op.types if n not in gone))


def fold_node(graph: Graph, node: Node, k: int, used: set[str]) -> tuple[Node, dict[str, Constant]] | None:
    consts = constant_locals(graph, node)
    fold = find_fold(node.op, set(consts), k)
    if fold is None:
        return None
    reads = sorted(({a.tensor for a in fold.scale.accesses()} | {fold.weight}) & consts.keys())
    op = node.op
    value = DeferredConstant(op.type_of[fold.weight], f"fold {op.digest()} {fold!r}", [consts[r] for r in reads],
                             lambda *arrays: scaled_weight(op, fold, dict(zip(reads, arrays))))
    pos = node.op.inputs.index(fold.weight)
    gname = fresh_name(f"{node.name}_{fold.weight}_folded", used)
    inputs = node.inputs[:pos] + (gname,) + node.inputs[pos + 1:]
    return drop_unread_inputs(replace(node, op=folded_op(node.op, fold), inputs=inputs)), {gname: value}


def _contractions(op: Compute) -> list[int]:
    return [k for k, st in enumerate(op.statements) if st.reduce == "+="]


# ---- rule: inside one node ------------------------------------------------------------------------
_MEMO = Memo()


def _folds_in(graph: Graph, node: Node) -> tuple[str, ...]:
    """The contraction outputs of the node with a fold (memoized by op and constant inputs)."""
    consts = constant_inputs(graph, node)

    def compute() -> tuple[str, ...]:
        local = {lo for lo, g in zip(node.op.inputs, node.inputs) if g in consts}
        return tuple(node.op.statements[k].out for k in _contractions(node.op) if find_fold(node.op, local, k) is not None)

    return _MEMO.get(("in", node.op.digest(), node.inputs, consts), compute)


def fold_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not node.is_extern:
            for out in _folds_in(graph, node):
                yield (node.name, out)


def fold_into_contraction(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    ks = [] if node.is_extern else [k for k in _contractions(node.op) if node.op.statements[k].out == site[1]]
    got = fold_node(graph, node, ks[0], set(graph.type_of)) if ks else None
    if got is None:
        raise RuleNotApplicable(f"no affine epilogue of {site[1]!r} to fold in node {site[0]!r}")
    new, consts = got
    return rebuild(graph, [new if n is node else n for n in graph.nodes], new_constants=consts)


# ---- rule: the affine op is the next node (as the ONNX frontend emits conv -> batch_norm) ---------
def _merge_candidate(graph: Graph, prod: Node, consumer: Node) -> tuple[Node, int] | None:
    """The merged node and its contraction whose fold reaches into ``consumer``'s statements."""
    if prod.is_extern or consumer.is_extern or len(prod.outputs) != 1:
        return None
    (t,) = prod.outputs
    if t in graph.outputs or any(n is not consumer for n in graph.consumers.get(t, [])) or not _contractions(prod.op):
        return None
    locals_of_t = [x for x, g in zip(consumer.op.inputs, consumer.inputs) if g == t]
    readers = [st for st in consumer.op.statements if any(_reads(st.expr, x) for x in locals_of_t)]
    if len(locals_of_t) != 1 or len(readers) != 1 or not _identity_reader(readers[0], locals_of_t[0], graph.type_of[t].shape) \
            or (affine_in(readers[0].expr, locals_of_t[0]) or (None,))[0] is None:
        return None
    merged = merge_nodes(prod, consumer)
    consts = set(constant_locals(graph, merged))
    first_consumer_stmt = len(prod.op.statements)
    for k in _contractions(prod.op):
        fold = find_fold(merged.op, consts, k)
        if fold is not None and fold.chain[-1] >= first_consumer_stmt:
            return merged, k
    return None


def cross_node_sites(graph: Graph) -> Iterator[Site]:
    producer_of = graph.producer
    for consumer in graph.nodes:
        for t in dict.fromkeys(consumer.inputs):
            prod = producer_of.get(t)
            if prod is None or prod.is_extern or consumer.is_extern:
                continue
            key = ("node", prod.op.digest(), consumer.op.digest(), prod.inputs, prod.outputs, consumer.inputs,
                   constant_inputs(graph, prod) | constant_inputs(graph, consumer), t in graph.outputs,
                   tuple(n.name for n in graph.consumers.get(t, [])) == (consumer.name,) * len(graph.consumers.get(t, [])))
            if _MEMO.get(key, lambda prod=prod, consumer=consumer: _merge_candidate(graph, prod, consumer) is not None):
                yield (prod.name, consumer.name)


def fold_node_into_contraction(graph: Graph, site: Site) -> Graph:
    prod, consumer = node_named(graph, site[0]), node_named(graph, site[1])
    got = _merge_candidate(graph, prod, consumer)
    if got is None:
        raise RuleNotApplicable(f"{site[1]!r} is not an affine map of {site[0]!r}'s contraction")
    merged, k = got
    new, consts = fold_node(graph, merged, k, set(graph.type_of))
    return rebuild(graph, swap_nodes(graph, [prod, consumer], new, consumer), new_constants=consts)


# ---- rule: inputs a node no longer reads (left by hoisting and folding) ----------------------------
def unread_input_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if drop_unread_inputs(node) is not node:
            yield (node.name,)


def drop_unread_node_inputs(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    new = drop_unread_inputs(node)
    if new is node:
        raise RuleNotApplicable(f"node {site[0]!r} reads every input")
    return rebuild(graph, [new if n is node else n for n in graph.nodes])


# ---- examples -------------------------------------------------------------------------------------
def _bn_constants(b: GraphBuilder, rng: np.random.Generator, c: int) -> dict[str, str]:
    return {"G": b.constant(rng.uniform(0.5, 1.0, c).astype(np.float32), "gamma"),
            "B": b.constant(rng.standard_normal(c).astype(np.float32), "beta"),
            "M": b.constant(rng.standard_normal(c).astype(np.float32), "mean"),
            "V": b.constant(rng.uniform(0.5, 1.5, c).astype(np.float32), "var")}


BN = "(((X[i0,i1,i2,i3] - M[i1]) * (G[i1] * rsqrt(V[i1] + 0.00001))) + B[i1])"


def _in_node_examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    out = []
    for n, ci, co, hw, k in ((1, 3, 4, 5, 3), (2, 5, 6, 4, 1)):  # conv + bias + batch norm + relu in one node
        b = GraphBuilder(f"conv_bias_bn_relu_{co}")
        x = b.input("x", (n, ci, hw, hw))
        w = b.constant(rng.standard_normal((co, ci, k, k)).astype(np.float32), "w")
        bias = b.constant(rng.standard_normal(co).astype(np.float32), "bias")
        p = k // 2
        y = b.compute1(f"P[n,co,y,x] += X[n,ci,y+kh-{p},x+kw-{p}] * W[co,ci,kh,kw]\n"
                       "Q[n,co,y,x] = P[n,co,y,x] + Bias[co]\n"
                       "O[n,c,y,x] = ((Q[n,c,y,x] - M[c]) * (G[c] * rsqrt(V[c] + 0.00001))) + B[c]\n"
                       "R[n,c,y,x] = relu(O[n,c,y,x])",
                       {"X": x, "W": w, "Bias": bias, **_bn_constants(b, rng, co)}, "conv_bn",
                       extents={"y": hw, "x": hw}, padding={"X": 0.0}, outputs=["R"])
        out.append(b.build([y]))
    for m, k, n in ((3, 4, 6), (5, 7, 2)):  # gemm, then a scalar Mul and a per-column constant Add
        b = GraphBuilder(f"gemm_scale_shift_{n}")
        x = b.input("x", (m, k))
        w = b.constant(rng.standard_normal((n, k)).astype(np.float32), "w")  # transposed weight (Gemm transB)
        c = b.constant(rng.standard_normal(n).astype(np.float32), "c")
        out.append(b.build([b.compute1("P[i,j] += X[i,k] * W[j,k]\nO[i,j] = (P[i,j] * 0.5 - C[j]) / 4.0",
                                       {"X": x, "W": w, "C": c}, "gemm", outputs=["O"])]))
    return out


def _cross_node_examples() -> list[Graph]:
    rng = np.random.default_rng(1)
    out = []
    for n, ci, co, hw in ((1, 3, 4, 6), (1, 4, 8, 3)):  # conv node -> batch norm node -> relu node, as imported
        b = GraphBuilder(f"conv_then_bn_{co}")
        x = b.input("x", (n, ci, hw, hw))
        w = b.constant(rng.standard_normal((co, ci, 3, 3)).astype(np.float32), "w")
        y = b.compute1("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]", {"X": x, "W": w}, "conv",
                       extents={"y": hw, "x": hw}, padding={"X": 0.0})
        z = b.compute1(f"O[i0,i1,i2,i3] = {BN}", {"X": y, **_bn_constants(b, rng, co)}, "batch_norm")
        out.append(b.build([b.compute1("O[i0,i1,i2,i3] = relu(A[i0,i1,i2,i3])", {"A": z}, "relu")]))
    b = GraphBuilder("matmul_then_mul")  # a MatMul node, then a per-column constant Mul node
    x = b.input("x", (2, 3, 5))
    w = b.constant(rng.standard_normal((5, 4)).astype(np.float32), "w")
    s = b.constant(rng.standard_normal(4).astype(np.float32), "s")
    y = b.compute1("O[b,i,j] += X[b,i,k] * W[k,j]", {"X": x, "W": w}, "matmul")
    out.append(b.build([b.compute1("O[a,i,j] = A[a,i,j] * S[j]", {"A": y, "S": s}, "mul")]))
    return out


def _unread_examples() -> list[Graph]:
    rng = np.random.default_rng(2)
    out = []
    for shape in ((3, 4), (2, 5, 6)):
        b = GraphBuilder(f"unread_{len(shape)}")
        x = b.input("x", shape)
        m = b.constant(rng.standard_normal(shape[-1]).astype(np.float32), "m")
        c = b.constant(rng.standard_normal(shape[-1]).astype(np.float32), "c")
        dims = ",".join(f"i{k}" for k in range(len(shape)))
        g = b.build([b.compute1(f"O[{dims}] = X[{dims}] + C[i{len(shape) - 1}]", {"X": x, "C": c}, "add")])
        node = g.nodes[0]  # the add as hoisting leaves it: still taking the constant it no longer reads
        op = node.op
        op = Compute(op.inputs + ("M",), op.outputs, op.statements, op.types + (("M", Constant(b.constants[m]).type),))
        node = replace(node, op=op, inputs=node.inputs + (m,))
        out.append(rebuild(g, [node], new_constants={m: b.constants[m]}))
    return out


# sum_k X*W, then *a[c] + b[c] with constant a, b  =  sum_k X*(W*a[c]) + b[c]: batch norm and constant Mul/Add folded
FOLD_AFFINE = Rule("fold_affine_into_contraction", "folding",
                   "(sum_k X[..k..] * W[c,..k..]) * a[c] + b[c] = sum_k X[..k..] * (W[c,..k..] * a[c]) + b[c]",
                   fold_sites, fold_into_contraction, _in_node_examples, polynomial=False)
FOLD_AFFINE_NODE = Rule("fold_affine_node_into_contraction", "folding",
                        "node O = a[c] * P + b[c] after node P = sum_k X*W[c,..]  =  one node sum_k X*(W*a[c]) + b[c]",
                        cross_node_sites, fold_node_into_contraction, _cross_node_examples, polynomial=False)

DROP_UNREAD_INPUTS = Rule("drop_unread_node_inputs", "folding",
                          "a node's input that no statement reads is no input: f(x, y) = f(x) when f ignores y",
                          unread_input_sites, drop_unread_node_inputs, _unread_examples, polynomial=True)

RULES = [FOLD_AFFINE, FOLD_AFFINE_NODE, DROP_UNREAD_INPUTS]
