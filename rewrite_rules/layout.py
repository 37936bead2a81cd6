"""Layout rules: change how a compute op lays out the data it reads, never what it computes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, fresh_name, node_named
from superopt.builder import GraphBuilder
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, map_expr
from superopt.ir.graph import Graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType

MIN_WINDOW = 4  # reads per output element below which bounds checks are cheaper than a padded copy


def _pad_box(st: Statement, tensor: str, shape: tuple[int, ...]) -> tuple[list[int], list[int]] | None:
    """Per axis: how far the reads of ``tensor`` reach below 0 and the padded extent; None if in range."""
    ext = st.extent
    lo = [0] * len(shape)
    hi = [n - 1 for n in shape]
    for a in st.expr.accesses():
        if a.tensor != tensor:
            continue
        for axis, ix in enumerate(a.index):
            b_lo, b_hi = ix.bounds(ext)
            lo[axis], hi[axis] = min(lo[axis], b_lo), max(hi[axis], b_hi)
    if all(x == 0 for x in lo) and all(h == n - 1 for h, n in zip(hi, shape)):
        return None
    return [-x for x in lo], [h - x + 1 for h, x in zip(hi, lo)]


def materialize_padding_in(compute: Compute) -> Compute | None:
    """The first windowed statement reading a tensor with padding reads a padded copy instead."""
    types = compute.type_of
    used = set(types)
    for k, st in enumerate(compute.statements):
        window = int(np.prod([n for d, n in st.extents if d in st.reduce_dims]))
        if window < MIN_WINDOW:
            continue
        for tensor, value in st.padding:
            box = _pad_box(st, tensor, types[tensor].shape)
            if box is None:
                continue
            off, size = box
            name = fresh_name(f"{tensor}_pad", used)
            dims = tuple(f"p{i}" for i in range(len(size)))
            copy = Statement(name, dims, "=",
                             Access(tensor, tuple(Affine.of({d: 1}, -o) for d, o in zip(dims, off))),
                             tuple(zip(dims, size)), ((tensor, value),))

            def shift(e, tensor=tensor, name=name, off=off):
                if isinstance(e, Access) and e.tensor == tensor:
                    return Access(name, tuple(ix + Affine.of({}, o) for ix, o in zip(e.index, off)))
                return e

            body = Statement(st.out, st.out_dims, st.reduce, map_expr(st.expr, shift), st.extents,
                             tuple((t, v) for t, v in st.padding if t != tensor))
            statements = compute.statements[:k] + (copy, body) + compute.statements[k + 1:]
            new_types = compute.types + ((name, TensorType(tuple(size), types[tensor].dtype)),)
            return Compute(compute.inputs, compute.outputs, statements, new_types)
    return None



def padding_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if not node.is_extern and materialize_padding_in(node.op) is not None:
            yield (node.name,)


def materialize_padding(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    op = None if node.is_extern else materialize_padding_in(node.op)
    if op is None:
        raise RuleNotApplicable(f"node {site[0]!r} reads no padded window")
    return replace(graph, nodes=tuple(replace(n, op=op) if n is node else n for n in graph.nodes))


def _examples() -> list[Graph]:
    rng = np.random.default_rng(0)
    out = []
    b = GraphBuilder("max_pool_pad1")
    x = b.input("x", (1, 3, 9, 9))
    out.append(b.build([b.compute1("O[n,c,y,x] max= X[n,c,k0+y-1,k1+x-1]", {"X": x}, "pool",
                                   extents={"k0": 3, "k1": 3, "y": 9, "x": 9}, padding={"X": float("-inf")})]))
    b = GraphBuilder("conv_pad_stride2")
    x = b.input("x", (1, 4, 11, 10))
    w = b.constant(rng.standard_normal((5, 4, 3, 3)).astype(np.float32), "w")
    out.append(b.build([b.compute1("P[n,co,y,x] += X[n,ci,2*y+kh-1,2*x+kw-1] * W[co,ci,kh,kw]", {"X": x, "W": w},
                                   "conv", extents={"y": 6, "x": 5}, padding={"X": 0.0})]))
    b = GraphBuilder("lrn_channels")
    x = b.input("x", (1, 6, 4, 5))
    out.append(b.build([b.compute1(
        "S[n,c,y,x] += X[n,c+k-2,y,x] * X[n,c+k-2,y,x]\nO[n,c,y,x] = X[n,c,y,x] / (1.0 + S[n,c,y,x])",
        {"X": x}, "lrn", extents={"k": 5, "c": 6}, padding={"X": 0.0}, outputs=["O"])]))
    return out


# T[i + d] with zero (or -inf) outside T  =  Tp[i + d + o] where Tp = T padded by o: no bounds checks in the window
MATERIALIZE_PADDING = Rule("materialize_padding", "layout",
                           "reads of T with padding = reads of an explicitly padded copy of T, shifted",
                           padding_sites, materialize_padding, _examples)

RULES = [MATERIALIZE_PADDING]
