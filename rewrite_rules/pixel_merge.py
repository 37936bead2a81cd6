"""A pointwise conv's two pixel axes as one: ``O[.., y, x] = f(X[.., y, x], W)`` over ``p = y*W + x``.

A 1x1, stride-1, unpadded conv on NCHW tensors (ShuffleNet's grouped ones: ``P[n,g,co,y,x] += X[n,ci+Cin*g,y,x] *
W[co+Cout*g,ci]``) reads and writes each pixel plane as one contiguous run, but its kernel walks it as rows of
``x``: the register tile's vector columns then split the fused ``y, x`` loop only by whole rows (a 7 x 7 plane as
28 columns, less than two 16-lane vectors), since a loop split across rows is a linear loop that cannot carry
the epilogue or the packed weights. Over one pixel axis of ``H*W`` the columns split in whole vectors (49 as one
tile of 4 vectors, 196 as 64-wide tiles). The op's tensors indexed by the pixel axes (its image inputs,
temporaries and outputs) are reshaped to ``[.., H*W]``, free aliases; weights and per-channel constants are
untouched.

It applies to ops whose every statement indexes every pixel-indexed tensor by the same two trailing plain
dims (a 1x1 window's unit reduction dims count as none), so it is a layout move of the layout pass
(``search.graph.rewrite``) on the kernels that keep NCHW, never a graph search move: the movement rules
would split the merged loop again.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rewrite_rules import Rule, RuleNotApplicable, Site, node_named
from rewrite_rules.graph_edit import reads_constant, with_reshaped_tensors
from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, IndexValue, map_expr
from superopt.ir.graph import Graph
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType

FAMILY = "layout_pass"


def _without_unit_dims(ix: Affine, st: Statement) -> Affine:
    """``ix`` with the terms of the statement's reduction dims of extent 1 dropped (a 1x1 window's k0, k1)."""
    ext = st.extent
    return Affine.of({d: c for d, c in ix.terms if not (d in st.reduce_dims and ext[d] == 1)}, ix.const)


def _plan(op: Compute) -> dict[str, tuple[str, str]] | None:
    """Statement output -> its (y, x) dims when the pixel axes of ``op`` merge; None otherwise."""
    if not any(st.reduce == "+=" and st.reduce_dims for st in op.statements):
        return None
    types = op.type_of
    plane: tuple[int, int] | None = None
    merged: set[str] = set()
    pixels: dict[str, tuple[str, str]] = {}
    for st in op.statements:
        if len(st.out_dims) < 3:
            return None
        y, x = st.out_dims[-2:]
        ext = st.extent
        if plane is None:
            plane = (ext[y], ext[x])
        if (ext[y], ext[x]) != plane:
            return None
        pixels[st.out] = (y, x)
        merged.add(st.out)
        for a in st.expr.walk():
            if isinstance(a, IndexValue) and {y, x} & set(a.index.vars()):
                return None
            if not isinstance(a, Access):
                continue
            index = [_without_unit_dims(ix, st) for ix in a.index]
            uses = [k for k, ix in enumerate(index) if {y, x} & set(ix.vars())]
            if not uses:
                continue
            n = len(index)
            if uses != [n - 2, n - 1] or index[-2] != Affine.dim(y) or index[-1] != Affine.dim(x) \
                    or a.tensor in st.pad_value or tuple(types[a.tensor].shape[-2:]) != plane:
                return None
            merged.add(a.tensor)
    # every access of a merged tensor, in every statement, must be by its statement's pixel dims
    for st in op.statements:
        y, x = pixels[st.out]
        for a in st.expr.accesses():
            if a.tensor in merged:
                index = [_without_unit_dims(ix, st) for ix in a.index]
                if len(index) < 2 or index[-2] != Affine.dim(y) or index[-1] != Affine.dim(x):
                    return None
    return pixels


def _merge_op(op: Compute, pixels: dict[str, tuple[str, str]]) -> tuple[Compute, set[str]]:
    types = op.type_of
    merged = set(pixels)
    for st in op.statements:
        y, x = pixels[st.out]
        for a in st.expr.accesses():
            if {y, x} & {d for ix in a.index for d in ix.vars()}:
                merged.add(a.tensor)
    statements = []
    for st in op.statements:
        y, x = pixels[st.out]
        ext = st.extent

        def sub(e, st=st, y=y):
            if isinstance(e, Access) and e.tensor in merged:
                return Access(e.tensor, tuple(e.index[:-2]) + (Affine.dim(y),))
            return e

        extents = tuple((d, ext[y] * ext[x] if d == y else n) for d, n in st.extents if d != x)
        statements.append(Statement(st.out, tuple(d for d in st.out_dims if d != x), st.reduce,
                                    map_expr(st.expr, sub), extents, st.padding))
    new_types = tuple((t, TensorType(tt.shape[:-2] + (tt.shape[-2] * tt.shape[-1],), tt.dtype) if t in merged else tt)
                      for t, tt in types.items())
    return Compute(op.inputs, op.outputs, tuple(statements), new_types), merged


def pixel_merge_sites(graph: Graph) -> Iterator[Site]:
    for node in graph.nodes:
        if node.is_extern:
            continue
        pixels = _plan(node.op)
        if pixels is None:
            continue
        if not reads_constant(graph, node, _merge_op(node.op, pixels)[1]):
            yield (node.name,)  # (a constant pixel map reshaped would be a pass of its own)


def merge_pixels(graph: Graph, site: Site) -> Graph:
    node = node_named(graph, site[0])
    if node.is_extern or (pixels := _plan(node.op)) is None:
        raise RuleNotApplicable(f"{site[0]!r} is no op whose pixel axes merge")
    op, merged = _merge_op(node.op, pixels)
    return with_reshaped_tensors(graph, node, op, merged, "pixels")


def merge_pixels_where(graph: Graph, lanes: int) -> Graph:
    """Every NCHW pointwise conv (and the ops fused with it) whose rows are no multiple of ``lanes``, over one
    pixel axis (a grouped conv's 4 x 68 channels, 2 threads, AVX-512: 14 x 14 pixels 25 -> 47 GFLOP/s, 7 x 7 22
    -> 69, 28 x 28 57 -> 75)."""
    for (name,) in list(pixel_merge_sites(graph)):
        node = node_named(graph, name)
        st = next(s for s in node.op.statements if s.reduce == "+=" and s.reduce_dims)
        h, w = (st.extent[d] for d in st.out_dims[-2:])
        if w % lanes and h > 1:
            graph = merge_pixels(graph, (name,))
    return graph


def _examples() -> list[Graph]:
    from superopt.builder import GraphBuilder

    out = []
    rng = np.random.default_rng(3)
    b = GraphBuilder("grouped_pointwise")
    x = b.input("X", (1, 12, 5, 7))
    w = b.constant(rng.standard_normal((12, 4)).astype(np.float32), "W")
    s = b.constant(rng.standard_normal(12).astype(np.float32), "S")
    y = b.compute1("P[n,g,co,y,x] += X[n,4*g+ci,y,x] * W[4*g+co,ci]\nO[n,g,co,y,x] = relu(P[n,g,co,y,x] * S[4*g+co])",
                   {"X": x, "W": w, "S": s}, "gconv", outputs=["O"], extents={"g": 3, "co": 4})
    out.append(b.build([y]))
    b = GraphBuilder("pointwise_residual")
    x = b.input("X", (1, 8, 3, 3))
    r = b.input("R", (1, 6, 3, 3))
    w = b.constant(rng.standard_normal((6, 8, 1, 1)).astype(np.float32), "W")
    y = b.compute1("P[n,co,y,x] += X[n,ci,y+k0,x+k1] * W[co,ci,k0,k1]\nO[n,co,y,x] = P[n,co,y,x] + R[n,co,y,x]",
                   {"X": x, "W": w, "R": r}, "conv", outputs=["O"])
    out.append(b.build([y]))
    return out


MERGE_PIXELS = Rule("merge_pixel_axes_of_pointwise_conv", FAMILY,
                    "sum_ci X[.., ci, y, x] * W[co, ci] over (y, x) = the same over p = y*W + x of reshape(X, (.., H*W))",
                    pixel_merge_sites, merge_pixels, _examples, polynomial=True)
RULES: list[Rule] = [MERGE_PIXELS]
