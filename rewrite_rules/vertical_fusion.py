"""Vertical fusion: attention as one kernel.

Scores (a contraction, with its scale and mask), a softmax over the scores' last axis and the weighted
sum (a second contraction reading the probabilities) become one compute op, as the ONNX frontend
produces them from MatMul, Div/Mul, Add (mask), Softmax, MatMul (reshapes between them are read
through). Merged, the schedule computes each query row's scores, softmax and weighted sum inside the
weighted sum's row loop (``rows+contraction`` in ``superopt/schedule/default.py``): the score matrix
is never stored, only a row of it lives on the stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, node_named
from rewrite_rules.fusion import merge_nodes
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, Binary, Unary, map_expr, product_accesses
from superopt.ir.graph import Graph, Node
from superopt.ir.statement import Statement


def _is_contraction(st: Statement) -> bool:
    accs = product_accesses(st.expr)
    return st.reduce == "+=" and bool(st.reduce_dims) and accs is not None and len(accs) == 2 and accs[0] != accs[1]


def _is_softmax(c: Compute) -> bool:
    """One input, one output of its shape; a max over the last axis, an exp, a sum, a division."""
    if len(c.inputs) != 1 or len(c.outputs) != 1 or c.type_of[c.inputs[0]].shape != c.type_of[c.outputs[0]].shape:
        return False
    reduces = {st.reduce for st in c.statements}
    has_exp = any(isinstance(x, Unary) and x.fn == "exp" for st in c.statements for x in st.expr.walk())
    has_div = any(isinstance(x, Binary) and x.op == "/" for st in c.statements for x in st.expr.walk())
    return {"max=", "+="} <= reduces and has_exp and has_div and not any(_is_contraction(st) for st in c.statements)


def _through_reshapes(graph: Graph, tensor: str) -> tuple[str, list[Node]] | None:
    """The tensor ``tensor`` is a (chain of) reshape(s) of, and the reshape nodes, each its input's only
    reader; None when a reshape input has another reader or is a graph output."""
    chain: list[Node] = []
    while True:
        prod = graph.producer.get(tensor)
        if prod is None or not prod.is_extern or prod.op.kind != "reshape":
            return tensor, chain[::-1]
        src = prod.inputs[0]
        if len(graph.consumers.get(src, [])) != 1 or src in graph.outputs:
            return None
        chain.append(prod)
        tensor = src


def delinearize(flat: Affine, shape: tuple[int, ...], extents: dict[str, int]) -> tuple[Affine, ...] | None:
    """Per-axis indices into ``shape`` of the row-major offset ``flat`` (affine in dims of the given
    extents), when each axis' index is affine: every term's coefficient is a multiple of the axis'
    stride or the terms below it stay under that stride. None otherwise."""
    strides = [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]
    out: list[Affine] = []
    rem = flat
    for n, st in zip(shape, strides):
        q = Affine.of({d: c // st for d, c in rem.terms if c % st == 0}, rem.const // st)
        r = Affine.of({d: c for d, c in rem.terms if c % st}, rem.const % st)
        try:
            (rlo, rhi), (qlo, qhi) = r.bounds(extents), q.bounds(extents)
        except KeyError:
            return None
        if rlo < 0 or rhi >= st or qlo < 0 or qhi >= n:
            return None
        out.append(q)
        rem = r
    return tuple(out)


def read_through(consumer: Node, local: str, src: str, src_shape: tuple[int, ...]) -> Node | None:
    """``consumer`` reading graph tensor ``src`` (shape ``src_shape``) where it read ``local``, a reshape
    of it: every access re-indexed by its row-major offset; None when an index does not delinearize."""
    c = consumer.op
    shape = c.type_of[local].shape
    strides = [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]
    statements = []
    for st in c.statements:
        if local in st.pad_value:
            return None
        ok = True

        def sub(e, st=st):
            nonlocal ok
            if isinstance(e, Access) and e.tensor == local:
                flat = Affine.of()
                for ix, s in zip(e.index, strides):
                    flat = flat + ix.scale(s)
                index = delinearize(flat, src_shape, st.extent)
                if index is None:
                    ok = False
                    return e
                return Access(local, index)
            return e

        new = Statement(st.out, st.out_dims, st.reduce, map_expr(st.expr, sub), st.extents, st.padding)
        if not ok:
            return None
        statements.append(new)
    src_type = replace(c.type_of[local], shape=tuple(src_shape))
    types = tuple((n, src_type if n == local else t) for n, t in c.types)
    op = Compute(c.inputs, c.outputs, tuple(statements), types)
    inputs = tuple(src if (loc == local) else g for loc, g in zip(c.inputs, consumer.inputs))
    return Node(consumer.name, op, inputs, consumer.outputs)


def _upstream(graph: Graph, consumer: Node, test) -> tuple[Node, str, list[Node]] | None:
    """The compute node passing ``test`` that ``consumer`` reads (through reshapes), its only reader."""
    for local, g in zip(consumer.op.inputs, consumer.inputs):
        found = _through_reshapes(graph, g)
        if found is None:
            continue
        src, chain = found
        prod = graph.producer.get(src)
        if prod is None or prod.is_extern or len(prod.outputs) != 1 or src in graph.outputs:
            continue
        if len(graph.consumers.get(src, [])) != 1 or (chain and len(graph.consumers.get(g, [])) != 1) \
                or consumer.inputs.count(g) != 1 or any(r.outputs[0] in graph.outputs for r in chain):
            continue
        if test(prod.op):
            return prod, local, chain
    return None


def _absorb(graph: Graph, prod: Node, consumer: Node) -> Graph:
    """The graph with ``prod`` merged into ``consumer`` (read through the reshapes between them)."""
    found = _upstream(graph, consumer, lambda c: c is prod.op)
    if found is None:
        raise RuleNotApplicable(f"{consumer.name!r} does not read {prod.name!r} alone")
    _, local, chain = found
    (src,) = prod.outputs
    if chain:
        rewired = read_through(consumer, local, src, graph.type_of[src].shape)
        if rewired is None:
            raise RuleNotApplicable(f"{consumer.name!r} reads {prod.name!r} through a reshape it cannot index")
        consumer = rewired
    merged = merge_nodes(prod, consumer)
    dropped = {prod.name} | {r.name for r in chain}
    gone = {src} | {r.outputs[0] for r in chain}
    nodes = tuple(merged if n.name == consumer.name else n for n in graph.nodes if n.name not in dropped)
    return replace(graph, nodes=nodes, types=tuple((n, t) for n, t in graph.types if n not in gone))


def _candidates(graph: Graph) -> Iterator[Site]:
    for n in graph.nodes:
        if n.is_extern or len(n.op.statements) != 1 or not _is_contraction(n.op.statements[0]):
            continue
        soft = _upstream(graph, n, _is_softmax)
        if soft is None:
            continue
        scores = _upstream(graph, soft[0], lambda c: any(_is_contraction(st) for st in c.statements))
        if scores is not None:
            yield (scores[0].name, soft[0].name, n.name)


def untie_keys(node: Node) -> Node:
    """``node`` with the key operand of its scores contraction read through a local of its own when that
    local is also read elsewhere (Q, K and V as column slices of one fused projection:
    ``X[b,i,64*h+e] * X[b,j,64*h+e+256]``). The key operand is packed for the score tile's vector run
    over keys; a pack re-lays out a whole local, so a shared one stays unpacked (a strided gather per
    key in the score tile's inner loop). The new local is bound to the same tensor."""
    c = node.op
    contractions = [x for x in c.statements if _is_contraction(x)]
    st = contractions[0] if len(contractions) >= 2 else None  # scores ... weighted sum
    accs = product_accesses(st.expr) if st is not None else None
    if not accs or len(accs) != 2 or accs[0] == accs[1]:
        return node
    col = st.out_dims[-1]
    key = next((a for a in accs if any(ix.coeff(col) for ix in a.index)), None)
    if key is None or key.tensor not in c.inputs:
        return node
    reads = [a for x in c.statements for a in x.expr.accesses() if a.tensor == key.tensor]
    if len(reads) < 2:
        return node
    fresh = f"{key.tensor}_keys"
    while fresh in c.type_of:
        fresh += "_"

    def sub(e):
        return Access(fresh, e.index) if e == key else e

    pad = dict(st.padding)
    padding = st.padding + (((fresh, pad[key.tensor]),) if key.tensor in pad else ())
    statements = tuple(replace(x, expr=map_expr(x.expr, sub), padding=padding) if x is st else x for x in c.statements)
    types = c.types + ((fresh, c.type_of[key.tensor]),)
    op = Compute(c.inputs + (fresh,), c.outputs, statements, types)
    return Node(node.name, op, node.inputs + (node.inputs[c.inputs.index(key.tensor)],), node.outputs)


def untie_all_keys(graph: Graph) -> Graph:
    """:func:`untie_keys` on every compute node (attention built whole, e.g. from torch's
    scaled_dot_product_attention, gets its Q/K/V views folded into one local by later fusions)."""
    nodes = tuple(n if n.is_extern else untie_keys(n) for n in graph.nodes)
    return graph if nodes == graph.nodes else replace(graph, nodes=nodes)


def fuse_attention(graph: Graph, site: Site) -> Graph:
    if site not in set(_candidates(graph)):
        raise RuleNotApplicable(f"no attention at {site}")
    scores, soft, out = site
    graph = _absorb(graph, node_named(graph, scores), node_named(graph, soft))
    return _absorb(graph, node_named(graph, soft), node_named(graph, out))


def attention_sites(graph: Graph) -> Iterator[Site]:
    """Scores -> softmax -> weighted sum chains that merge (every read through a reshape re-indexes)."""
    for site in _candidates(graph):
        try:
            fuse_attention(graph, site)
        except RuleNotApplicable:
            continue
        yield site


def _examples() -> list[Graph]:
    from superopt import ops

    rng = np.random.default_rng(0)
    out = []
    for batch, heads, seq, hd, flat in [(2, 2, 5, 4, False), (1, 3, 7, 8, True)]:
        b = GraphBuilder(f"attention_{seq}")
        q = b.input("q", (batch, heads, seq, hd))
        k = b.input("k", (batch, heads, seq, hd))
        v = b.input("v", (batch, heads, seq, hd))
        mask = b.constant(np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0.0).astype(np.float32), "mask")
        s = b.compute1(f"S[b,h,i,j] += Q[b,h,i,e] * K[b,h,j,e]\nO[b,h,i,j] = S[b,h,i,j] * {1 / float(np.sqrt(hd))!r} "
                       "+ M[b,0,0,j]", {"Q": q, "K": k, "M": mask}, "scores", outputs=["O"])
        p = b.compute1("M[b,h,i,u] max= X[b,h,i,j]\nE[b,h,i,j] = exp(X[b,h,i,j] - M[b,h,i,0])\n"
                       "Z[b,h,i,u] += E[b,h,i,j]\nO[b,h,i,j] = E[b,h,i,j] / Z[b,h,i,0]", {"X": s}, "softmax",
                       extents={"u": 1})
        if flat:  # the weighted sum reads a 2-D view of the probabilities (as ONNX's MatMul on a reshape)
            p = ops.reshape(b, p, (batch * heads * seq, seq))
            ctx = f"O[b,h,i,f] += P[{heads * seq}*b + {seq}*h + i, j] * V[b,h,j,f]"
        else:
            ctx = "O[b,h,i,f] += P[b,h,i,j] * V[b,h,j,f]"
        out.append(b.build([b.compute1(ctx, {"P": p, "V": v}, "context")]))
    return out


# softmax(scale * Q K^T + mask) V as one op: computed per query row, the score matrix is never stored
FUSE_ATTENTION = Rule("fuse_attention", "vertical_fusion",
                      "(softmax(s(QK^T)) V) computed as one op = the three ops in sequence (a merge of definitions)",
                      attention_sites, fuse_attention, _examples)

RULES = [FUSE_ATTENTION]
