"""A grouped convolution as one ordinary convolution per group, concatenated along the channels.

The ONNX frontend writes a conv with ``group`` G as one op over a group axis:
``P[n,g,co,y,x] += X[n,ci+Cin*g,..] * W[co+Cout*g,ci,..]`` into a rank-5 tensor that a reshape merges
back to ``[n, G*Cout, y, x]``. That op has no channel axis the layout pass can block, so it keeps the NCHW
schedule while every other conv of the model runs on NCHWc tensors with vector tiles over output
channels. Split, each group is the conv everything else already handles: its input a channel slice
``X_k[n,c,y,x] = X[n,c+Cin*k,y,x]``, its weights and bias the constant slices of group k, and a concat
of the G outputs is the reshape's output (``Y[n, Cout*k + co] = O_k[n, co]``).

The rule grows the graph, so it belongs to the layout pass (``search.graph.layout``), which splits a grouped
conv when its per-group channel counts are multiples of the block, never to the greedy driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue, map_expr
from superopt.ir.graph import DeferredConstant, Graph, Node
from superopt.ir.prune import prune_graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType

FAMILY = "layout_pass"  # applied by search.graph.layout on its blocked candidates, never by the graph search
MAX_GROUPS = 16  # a depthwise conv (a group per channel) is no ordinary conv per group


@dataclass(frozen=True)
class GroupedConv:
    """What the split needs to know: the group count, each slice of an input, the reshape after the op."""

    node: str
    reshape: str
    groups: int
    in_per_group: int  # channels of each activation slice
    out_per_group: int
    slices: tuple[tuple[str, int, int], ...]  # (input local, axis, per-group extent) sliced by group


def _group_term(ix: Affine, g: str) -> tuple[str, int] | None:
    """``d + m*g`` -> (d, m); None when the index does not read that way."""
    m = ix.coeff(g)
    rest = [(d, c) for d, c in ix.terms if d != g]
    if m > 0 and ix.const == 0 and len(rest) == 1 and rest[0][1] == 1 and isinstance(rest[0][0], str):
        return rest[0][0], m
    return None


def analyse(graph: Graph, node: Node) -> GroupedConv:
    """The grouped conv at ``node``, or RuleNotApplicable with the reason."""
    if node.is_extern or len(node.outputs) != 1:
        raise RuleNotApplicable(f"{node.name} is no single-output compute op")
    c = node.op
    out_t = c.type_of[c.outputs[0]]
    users = graph.consumers.get(node.outputs[0], [])
    if out_t.rank != 5 or len(users) != 1 or not users[0].is_extern or users[0].op.kind != "reshape" \
            or node.outputs[0] in graph.outputs:
        raise RuleNotApplicable(f"{node.name} does not write [n, G, C, y, x] into one reshape")
    n, groups, cg, h, w = out_t.shape
    if graph.type_of[users[0].outputs[0]].shape != (n, groups * cg, h, w) or not 1 < groups <= MAX_GROUPS:
        raise RuleNotApplicable(f"{node.name}: the reshape does not merge {groups} groups into the channels")
    consts = {local for local, gname in zip(c.inputs, node.inputs) if gname in graph.constant}
    pre = _channel_stages(c, consts)
    produced = {st.out for st in c.statements} - pre
    slices: dict[str, tuple[int, int]] = {}
    if not any(st.reduce == "+=" and st.reduce_dims for st in c.statements):
        raise RuleNotApplicable(f"{node.name} contracts nothing")
    for st in c.statements:
        if st.out in pre:
            continue
        t = c.type_of[st.out]
        if t.rank != 5 or t.shape[1] != groups:
            raise RuleNotApplicable(f"{node.name}: {st.out} has no group axis")
        g = st.out_dims[1]
        for e in st.expr.walk():
            if isinstance(e, IndexValue) and g in e.index.dims:
                raise RuleNotApplicable(f"{node.name} uses the group index as a value")
            if not isinstance(e, Access):
                continue
            axes = [k for k, ix in enumerate(e.index) if g in ix.dims]
            if e.tensor in produced:
                if axes != [1] or not e.index[1].is_plain_dim:
                    raise RuleNotApplicable(f"{node.name}: {e} reads its group axis otherwise")
                continue
            if len(axes) != 1 or _group_term(e.index[axes[0]], g) is None:
                raise RuleNotApplicable(f"{node.name}: {e} is not read as one slice per group")
            k = axes[0]
            m = _group_term(e.index[k], g)[1]
            if e.tensor not in consts and (k != 1 or c.type_of[e.tensor].rank != 4):
                raise RuleNotApplicable(f"{node.name}: activation {e.tensor} is not sliced on its channels")
            if c.type_of[e.tensor].shape[k] != groups * m or slices.setdefault(e.tensor, (k, m)) != (k, m):
                raise RuleNotApplicable(f"{node.name}: {e.tensor} is sliced two ways or not whole")
    for st in c.statements:  # a stage before the contraction (its pad copy) reads its input channel by channel
        if st.out in pre:
            if st.out not in slices:
                raise RuleNotApplicable(f"{node.name}: {st.out} is not read by group")
            for a in st.expr.accesses():
                if a.tensor not in consts and slices.setdefault(a.tensor, slices[st.out]) != slices[st.out]:
                    raise RuleNotApplicable(f"{node.name}: {a.tensor} is sliced two ways")
    acts = [(local, k, m) for local, (k, m) in slices.items() if local not in consts]
    if not acts or len({m for _, _, m in acts}) != 1:
        raise RuleNotApplicable(f"{node.name} reads no activation sliced by group")
    return GroupedConv(node.name, users[0].name, groups, acts[0][2], cg,
                       tuple((local, k, m) for local, (k, m) in slices.items()))


def _channel_stages(c: Compute, consts: set[str]) -> set[str]:
    """Rank-4 stages that read activation inputs at their own channel (``T[n,c,p,q] = X[n,c,p-1,q-1]``,
    the pad copy fusion puts in front of a conv): per group they read the group's slice."""
    out = set()
    for st in c.statements:
        if c.type_of[st.out].rank != 4 or st.reduce_dims or st.out in c.outputs:
            continue
        ch = st.out_dims[1]
        reads = list(st.expr.accesses())
        if reads and all(a.tensor in c.inputs and a.tensor not in consts and c.type_of[a.tensor].rank == 4
                         and a.index[1].is_plain_dim and a.index[1].dims[0] == ch
                         and not any(ch in ix.dims for ix in (a.index[0], *a.index[2:])) for a in reads) \
                and not any(isinstance(e, IndexValue) for e in st.expr.walk()):
            out.add(st.out)
    return out


def grouped_conv_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        try:
            analyse(graph, node)
        except RuleNotApplicable:
            continue
        yield (node.name,)


def _slice_compute(shape: tuple[int, ...], per_group: int, k: int, dtype: str) -> Compute:
    n, _, h, w = shape
    ext = (("n", n), ("c", per_group), ("y", h), ("x", w))
    read = Access("X", (Affine.dim("n"), Affine.of({"c": 1}, per_group * k), Affine.dim("y"), Affine.dim("x")))
    st = Statement("O", ("n", "c", "y", "x"), "=", read, ext)
    return Compute(("X",), ("O",), (st,), (("X", TensorType(shape, dtype)), ("O", TensorType((n, per_group, h, w), dtype))))


def _concat_compute(shape: tuple[int, ...], groups: int, dtype: str) -> Compute:
    from superopt.builder import GraphBuilder
    from superopt.ops.movement import concat

    b = GraphBuilder("concat")
    parts = [b.input(f"p{k}", shape, dtype) for k in range(groups)]
    g = b.build([concat(b, parts, 1)])
    (node,) = g.nodes
    return node.op


def _group_op(c: Compute, gc: GroupedConv, k: int) -> Compute:
    """The op of group ``k``: the group axis dropped, each sliced input read at its slice."""
    sliced = {local: (ax, m) for local, ax, m in gc.slices}
    produced = {st.out for st in c.statements} - set(sliced)
    statements = []
    for st in c.statements:
        if st.out in sliced:  # a channel stage: the slice's channels
            ch, m = st.out_dims[1], sliced[st.out][1]
            statements.append(replace(st, extents=tuple((d, m if d == ch else n) for d, n in st.extents)))
            continue
        g = st.out_dims[1]

        def rewrite(e, g=g):
            if not isinstance(e, Access):
                return e
            if e.tensor in produced:
                return Access(e.tensor, (e.index[0], *e.index[2:]))
            if e.tensor in sliced:
                ax, _ = sliced[e.tensor]
                d, _ = _group_term(e.index[ax], g)
                return Access(e.tensor, tuple(Affine.dim(d) if i == ax else ix for i, ix in enumerate(e.index)))
            return e

        statements.append(Statement(st.out, tuple(d for d in st.out_dims if d != g), st.reduce, map_expr(st.expr, rewrite),
                                    tuple((d, n) for d, n in st.extents if d != g), st.padding))
    types = []
    for name, t in c.types:
        if name in produced:
            t = TensorType((t.shape[0], *t.shape[2:]), t.dtype)
        elif name in sliced:
            ax, m = sliced[name]
            t = TensorType(tuple(m if i == ax else s for i, s in enumerate(t.shape)), t.dtype)
        types.append((name, t))
    return Compute(c.inputs, c.outputs, tuple(statements), tuple(types))


def split_grouped_conv(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    gc = analyse(graph, node)
    c = node.op
    types = dict(graph.types)
    constants = dict(graph.constants)
    used_t = set(types) | {n.name for n in graph.nodes}
    used_n = {n.name for n in graph.nodes}
    sliced = {local: (ax, m) for local, ax, m in gc.slices}
    new_nodes: list[Node] = []
    outs = []
    for k in range(gc.groups):
        op = _group_op(c, gc, k)
        inputs = []
        for local, gname in zip(c.inputs, node.inputs):
            if local not in sliced:
                inputs.append(gname)
                continue
            ax, m = sliced[local]
            if gname in graph.constant:
                src = graph.constant[gname]
                part_shape = tuple(m if i == ax else n for i, n in enumerate(src.type.shape))
                key = fresh_name(f"{gname}_group{k}", used_t)
                constants[key] = DeferredConstant(
                    TensorType(part_shape, src.type.dtype), f"slice {m * k}:{m * (k + 1)} of axis {ax}", (src,),
                    lambda a, ax=ax, lo=m * k, m=m: np.take(a, range(lo, lo + m), axis=ax))
                types[key] = constants[key].type
                inputs.append(key)
            else:
                t = types[gname]
                part = fresh_name(f"{gname}_group{k}", used_t)
                types[part] = TensorType((t.shape[0], m, *t.shape[2:]), t.dtype)
                new_nodes.append(Node(fresh_name(f"{node.name}_slice{k}", used_n),
                                      _slice_compute(t.shape, m, k, t.dtype), (gname,), (part,)))
                inputs.append(part)
        out_t = op.type_of[op.outputs[0]]
        out = fresh_name(f"{node.outputs[0]}_group{k}", used_t)
        types[out] = out_t
        new_nodes.append(Node(fresh_name(f"{node.name}_group{k}", used_n), op, tuple(inputs), (out,)))
        outs.append(out)
    reshape = node_named(graph, gc.reshape)
    out_t = types[outs[0]]
    new_nodes.append(Node(fresh_name(f"{node.name}_concat", used_n), _concat_compute(out_t.shape, gc.groups, out_t.dtype),
                          tuple(outs), reshape.outputs))
    nodes = []
    for n in graph.nodes:
        if n.name == node.name:
            nodes += new_nodes
        elif n.name != reshape.name:
            nodes.append(n)
    del types[node.outputs[0]]
    g = replace(graph, nodes=tuple(nodes), types=tuple(types.items()), constants=tuple(constants.items()))
    return prune_graph(g)


def split_where(graph: Graph, block: int) -> Graph:
    """Every grouped conv whose per-group input and output channels are multiples of ``block``, split."""
    for _ in range(len(graph.nodes)):
        for (name,) in grouped_conv_sites(graph):
            gc = analyse(graph, node_named(graph, name))
            if gc.in_per_group % block == 0 and gc.out_per_group % block == 0:
                graph = split_grouped_conv(graph, (name,))
                break
        else:
            return graph
    return graph


def _examples() -> list[Graph]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from superopt.frontends.onnx_frontend import import_onnx_model

    out = []
    for groups, cin, cout, k, relu in ((2, 16, 32, 3, True), (3, 24, 24, 1, False)):
        rng = np.random.default_rng(groups)
        w = numpy_helper.from_array(rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32), "w")
        b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], pads=[k // 2] * 4, group=groups)]
        if relu:
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        g = helper.make_graph(nodes, f"grouped{groups}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 6, 6])], [w, b])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        out.append(import_onnx_model(m).graph)
    return out


SPLIT_GROUPED_CONV = Rule("split_grouped_conv", FAMILY,
                          "conv_G(X, W)[n, Cout*k+co] = conv(X[n, Cin*k:Cin*(k+1)], W[Cout*k:Cout*(k+1)])[n, co], k < G",
                          grouped_conv_sites, split_grouped_conv, _examples)
RULES: list[Rule] = [SPLIT_GROUPED_CONV]
