"""Merging rules: several ops become one.

- Parallel contractions sharing an input (the Q/K/V projections ``X @ Wq``, ``X @ Wk``, ``X @ Wv``;
  inception's 1x1 convs over one input) become one contraction over the weights concatenated along
  the output channel; each old output is a slice of the merged one (a copy op, which the movement
  rules then substitute into its readers).
- An op producing the input of a normalization (a consumer that sums over it and reads it elementwise:
  LayerNorm's mean and variance, RMSNorm) joins that consumer, as the residual add before a LayerNorm.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from rewrite_rules.fusion import elementwise_fusion_sites, merge_nodes
from rewrite_rules.graph_edit import Memo, constant_inputs, constant_locals, rebuild
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue
from superopt.ir.graph import DeferredConstant, Graph, Node
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType


# ---- the output-channel axis of an op ----------------------------------------------------------------
def channel_plan(op: Compute, axis: int, consts: set[str]):
    """Propagate "this is the output channel" from output axis ``axis`` through the op: ({tensor: axis},
    {statement index: dim}); None when the channel is summed over, shifted, or reaches a non-constant input."""
    (out,) = op.outputs
    axes: dict[str, int] = {out: axis}
    dims: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for k, st in enumerate(op.statements):
            if st.out in axes and k not in dims:
                dims[k], changed = st.out_dims[axes[st.out]], True
            for e in st.expr.walk():
                if isinstance(e, IndexValue) and k in dims and dims[k] in e.index.vars():
                    return None
                if not isinstance(e, Access):
                    continue
                for m, ix in enumerate(e.index):
                    chan = axes.get(e.tensor) == m
                    uses = k in dims and dims[k] in ix.vars()
                    if chan and not ix.is_plain_dim or uses and not ix.is_plain_dim:
                        return None
                    if chan and k not in dims:
                        dims[k], changed = ix.terms[0][0], True
                    elif chan and ix.terms[0][0] != dims[k]:
                        return None
                    if uses and e.tensor not in axes:
                        axes[e.tensor], changed = m, True
                    elif uses and axes[e.tensor] != m:
                        return None
            if k in dims and dims[k] not in st.out_dims:
                return None
            if k in dims and st.out in axes and st.out_dims[axes[st.out]] != dims[k]:
                return None
            if k in dims and st.out not in axes:
                axes[st.out], changed = st.out_dims.index(dims[k]), True
    if any(t in op.inputs and t not in consts for t in axes):
        return None
    for st in op.statements:  # whole-axis reads only
        for e in st.expr.accesses():
            if e.tensor in axes and st.extent[e.index[axes[e.tensor]].terms[0][0]] != op.type_of[e.tensor].shape[axes[e.tensor]]:
                return None
    return axes, dims


def resize_channel(op: Compute, plan, n: int) -> Compute:
    axes, dims = plan

    def shape(t: str, ty: TensorType) -> TensorType:
        if t not in axes:
            return ty
        s = list(ty.shape)
        s[axes[t]] = n
        return TensorType(tuple(s), ty.dtype)

    statements = tuple(replace(st, extents=tuple((d, n if d == dims.get(k) else e) for d, e in st.extents))
                       for k, st in enumerate(op.statements))
    return Compute(op.inputs, op.outputs, statements, tuple((t, shape(t, ty)) for t, ty in op.types))


_MEMO = Memo()


def _signature(graph: Graph, node: Node):
    """(key, plan) where nodes with equal keys compute the same thing up to their channel constants."""
    if node.is_extern or len(node.outputs) != 1:
        return None
    key = (node.op.digest(), node.inputs, constant_inputs(graph, node), graph.type_of[node.outputs[0]].rank)
    return _MEMO.get(key, lambda: _signature_of(graph, node))


def _signature_of(graph: Graph, node: Node):
    consts = constant_locals(graph, node)
    if not any(st.reduce == "+=" for st in node.op.statements):
        return None
    for axis in reversed(range(graph.type_of[node.outputs[0]].rank)):
        plan = channel_plan(node.op, axis, set(consts))
        if plan is None or not any(t in consts for t in plan[0]):
            continue
        shared = tuple(g if local not in plan[0] else "#" for local, g in zip(node.op.inputs, node.inputs))
        if not any(g not in graph.constant for g in shared if g != "#"):
            continue
        return (resize_channel(node.op, plan, 1).digest(), axis, shared), plan
    return None


def _groups(graph: Graph) -> dict:
    groups: dict = {}
    for node in graph.nodes:
        sig = _signature(graph, node)
        if sig is not None:
            groups.setdefault(sig[0], []).append(node)
    return {k: v for k, v in groups.items() if len(v) > 1}


def _independent(graph: Graph, nodes: list[Node]) -> bool:
    """No node of the group reads (transitively) another one's output."""
    names = {n.name for n in nodes}
    reach: dict[str, set[str]] = {}
    for n in graph.nodes:
        up = set()
        for i in n.inputs:
            p = graph.producer.get(i)
            if p is not None:
                up |= {p.name} | reach[p.name]
        reach[n.name] = up
    return all(not (reach[n.name] & names) for n in nodes)


def _unfused(graph: Graph) -> set[str]:
    """Nodes whose elementwise reader could still join them: merged first, they would each need a slice
    of the merged output and could no longer absorb it (fuse the bias first, then merge)."""
    return {p for p, _ in elementwise_fusion_sites(graph)}


def parallel_sites(graph: Graph) -> Iterator[Site]:
    groups = _groups(graph)
    unfused = _unfused(graph) if groups else set()
    for nodes in groups.values():
        if _independent(graph, nodes) and not any(n.name in unfused for n in nodes):
            yield tuple(n.name for n in nodes)


def merge_parallel(graph: Graph, site: Site) -> Graph:
    nodes = [node_named(graph, name) for name in site]
    sigs = [_signature(graph, n) for n in nodes]
    if any(s is None for s in sigs) or len({s[0] for s in sigs}) != 1 or not _independent(graph, nodes) \
            or any(n.name in _unfused(graph) for n in nodes):
        raise RuleNotApplicable(f"nodes {site} are not parallel copies of one contraction")
    (_, axis, _), plan = sigs[0]
    widths = [graph.type_of[n.outputs[0]].shape[axis] for n in nodes]
    total = sum(widths)
    first = nodes[0]
    op = resize_channel(first.op, plan, total)
    used = set(graph.type_of)
    inputs, new_consts = list(first.inputs), {}
    for k, local in enumerate(first.op.inputs):
        if local in plan[0]:
            parts = [graph.constant[n.inputs[k]] for n in nodes]
            at = plan[0][local]
            shape = list(parts[0].type.shape)
            shape[at] = sum(p.type.shape[at] for p in parts)
            inputs[k] = fresh_name(f"{first.inputs[k]}_merged", used)
            new_consts[inputs[k]] = DeferredConstant(TensorType(tuple(shape), parts[0].type.dtype),
                                                     f"concatenate on axis {at}", parts,
                                                     lambda *a, at=at: np.concatenate(a, axis=at))
    merged_out = fresh_name(f"{first.name}_merged_out", used)
    merged = Node(fresh_name(f"{first.name}_merged", {n.name for n in graph.nodes}), op, tuple(inputs), (merged_out,))
    slices, off = [], 0
    for n, w in zip(nodes, widths):
        ty = graph.type_of[n.outputs[0]]
        dims = tuple(f"i{k}" for k in range(ty.rank))
        index = tuple(Affine.of({d: 1}, off if k == axis else 0) for k, d in enumerate(dims))
        st = Statement("O", dims, "=", Access("M", index), tuple(zip(dims, ty.shape)))
        slices.append(Node(n.name, Compute(("M",), ("O",), (st,), (("M", op.type_of[op.outputs[0]]), ("O", ty))),
                           (merged_out,), n.outputs))
        off += w
    group = {n.name for n in nodes}
    out: list[Node] = []
    for n in graph.nodes:
        if n.name == first.name:
            out += [merged, *slices]
        elif n.name not in group:
            out.append(n)
    merged_graph = rebuild(graph, out, new_types={merged_out: op.type_of[op.outputs[0]]}, new_constants=new_consts)
    return read_slices_in_place(merged_graph, {s.name for s in slices})


def read_slices_in_place(graph: Graph, slices: set[str]) -> Graph:
    """The slice nodes substituted into their readers where the movement rules allow (through reshapes that
    read them): merging and slicing is then one move whose cost a search sees at once."""
    from rewrite_rules.movement import INLINE_COPY, READ_THROUGH_RESHAPE

    for _ in range(4 * len(slices) + 4):
        outputs = {o for n in graph.nodes if n.name in slices for o in n.outputs}
        producer = graph.producer
        site = next((s for s in READ_THROUGH_RESHAPE.matches(graph) if node_named(graph, s[0]).inputs[0] in outputs), None)
        rule = READ_THROUGH_RESHAPE
        if site is None:
            site, rule = next((s for s in INLINE_COPY.matches(graph) if s[0] in slices), None), INLINE_COPY
        if site is None or not all(o in producer for o in outputs):
            return graph
        graph = rule.apply(graph, site)
    return graph


# ---- a producer joins the normalization reading it ----------------------------------------------------
def _normalization_reads(op: Compute, local: str) -> bool:
    """``local`` is summed over by one statement and read elementwise (at its output index) by another."""
    summed = any(st.reduce == "+=" and any(a.tensor == local for a in st.expr.accesses()) for st in op.statements)
    ident = any(st.reduce == "=" and any(a.tensor == local and a.index == tuple(Affine.dim(d) for d in st.out_dims)
                                         for a in st.expr.accesses()) for st in op.statements)
    plain = all(ix.is_plain_dim for st in op.statements for a in st.expr.accesses() if a.tensor == local for ix in a.index)
    return summed and ident and plain and not any(local in st.pad_value for st in op.statements)


def _norm_pair(graph: Graph, prod: Node | None, consumer: Node) -> bool:
    if prod is None or prod.is_extern or consumer.is_extern or len(prod.outputs) != 1:
        return False
    (t,) = prod.outputs
    if t in graph.outputs or any(n is not consumer for n in graph.consumers.get(t, [])):
        return False
    if prod.op.statements[-1].reduce != "=":
        return False
    locals_ = [x for x, g in zip(consumer.op.inputs, consumer.inputs) if g == t]
    return len(locals_) == 1 and _normalization_reads(consumer.op, locals_[0])


def normalization_sites(graph: Graph) -> Iterator[Site]:
    producer = graph.producer
    for consumer in graph.nodes:
        for t in dict.fromkeys(consumer.inputs):
            prod = producer.get(t)
            if _norm_pair(graph, prod, consumer):
                yield (prod.name, consumer.name)


def fuse_into_normalization(graph: Graph, site: Site) -> Graph:
    prod, consumer = node_named(graph, site[0]), node_named(graph, site[1])
    if not _norm_pair(graph, prod, consumer) or prod.outputs[0] not in consumer.inputs:
        raise RuleNotApplicable(f"{site[1]!r} is no normalization reading {site[0]!r}")
    merged = merge_nodes(prod, consumer)
    nodes = [merged if n is consumer else n for n in graph.nodes if n is not prod]
    return rebuild(graph, nodes)


# ---- examples -------------------------------------------------------------------------------------
def _parallel_examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    out = []
    for bsz, t, d in ((2, 3, 4), (1, 5, 6)):  # Q/K/V: matmul + bias each, the same input
        b = GraphBuilder(f"qkv_{d}")
        x = b.input("x", (bsz, t, d))
        outs = []
        for name in ("q", "k", "v"):
            w = b.constant(rng.standard_normal((d, d)).astype(np.float32), f"w{name}")
            bias = b.constant(rng.standard_normal(d).astype(np.float32), f"b{name}")
            outs.append(b.compute1("P[a,i,j] += X[a,i,k] * W[k,j]\nO[a,i,j] = P[a,i,j] + B[j]", {"X": x, "W": w, "B": bias},
                                   name, outputs=["O"]))
        s = b.compute1("O[a,i,j] += Q[a,i,c] * K[a,j,c]", {"Q": outs[0], "K": outs[1]}, "scores")
        out.append(b.build([s, outs[2]]))
    for c, widths in ((3, (2, 4)), (4, (3, 1, 2))):  # inception-style 1x1 convs of different widths, + bias
        b = GraphBuilder(f"inception_1x1_{len(widths)}")
        x = b.input("x", (1, c, 4, 4))
        outs = []
        for k, w_ in enumerate(widths):
            w = b.constant(rng.standard_normal((w_, c, 1, 1)).astype(np.float32), f"w{k}")
            bias = b.constant(rng.standard_normal(w_).astype(np.float32), f"b{k}")
            outs.append(b.compute1("P[n,o,y,x] += X[n,i,y,x] * W[o,i,0,0]\nO[n,o,y,x] = P[n,o,y,x] + B[o]",
                                   {"X": x, "W": w, "B": bias}, f"conv{k}", outputs=["O"]))
        out.append(b.build(outs))
    return out


def _normalization_examples() -> list[Graph]:
    rng = np.random.default_rng(1)
    out = []
    for bsz, t, d in ((2, 3, 4), (1, 4, 6)):  # residual add, then layer norm over the last axis
        b = GraphBuilder(f"residual_layer_norm_{d}")
        x, r = b.input("x", (bsz, t, d)), b.input("r", (bsz, t, d))
        g = b.constant(rng.standard_normal(d).astype(np.float32), "g")
        s = b.compute1("O[a,i,j] = X[a,i,j] + R[a,i,j]", {"X": x, "R": r}, "residual")
        out.append(b.build([b.compute1(
            "S[a,i] += X[a,i,r]\nD[a,i,j] = X[a,i,j] - S[a,i] * 0.25\nQ[a,i] += D[a,i,r] * D[a,i,r]\n"
            "O[a,i,j] = D[a,i,j] * Q[a,i] * G[j]", {"X": s, "G": g}, "norm", extents={"r": d}, outputs=["O"])]))
    return out


# X @ W1, X @ W2, ... = slices of X @ [W1 | W2 | ...]: one contraction over the concatenated weights
MERGE_PARALLEL = Rule("merge_parallel_contractions", "merging",
                      "(sum_k X*W1[k,c], sum_k X*W2[k,c]) = slices of sum_k X*[W1|W2][k,c]",
                      parallel_sites, merge_parallel, _parallel_examples, polynomial=True)
FUSE_NORMALIZATION = Rule("fuse_producer_into_normalization", "merging",
                          "N(f(x)) = (N . f)(x): the op producing a normalization's input joins it (f's only reader)",
                          normalization_sites, fuse_into_normalization, _normalization_examples, polynomial=True)

RULES = [MERGE_PARALLEL, FUSE_NORMALIZATION]
