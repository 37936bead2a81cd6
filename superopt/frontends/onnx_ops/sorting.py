"""Sorting, arg-reductions and scans: TopK, ArgMax, ArgMin, Hardmax, CumSum, CumProd."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops import indexing, scan, sorting
from superopt.ops._util import norm_axis


@_conv("TopK")
def _topk(c: _Ctx, x):
    """k as an attribute before opset 10, as a constant input after; ``sorted`` from opset 11 (always sorted here)."""
    if c.opset < 10:
        k = c.attr("k")
    else:
        kv = c.ints(x[1], "TopK k")
        if len(kv) != 1:
            raise OnnxImportError(f"TopK k must hold one value, got {kv}")
        k = kv[0]
    largest = bool(c.attr("largest", 1)) if c.opset >= 11 else True
    return sorting.topk(c.b, x[0], int(k), c.attr("axis", -1), largest, True)


@_conv("ArgMax", "ArgMin")
def _arg_reduce(c: _Ctx, x):
    fn = sorting.argmax if c.node.op_type == "ArgMax" else sorting.argmin
    last = bool(c.attr("select_last_index", 0)) if c.opset >= 12 else False
    return fn(c.b, x[0], c.attr("axis", 0), bool(c.attr("keepdims", 1)), last)


@_conv("Hardmax")
def _hardmax(c: _Ctx, x):
    """1 at the first maximum along ``axis``, 0 elsewhere; before opset 13 over the 2-D flattening at ``axis``."""
    shape = c.b.shape(x[0])
    if c.opset >= 13:
        axis = norm_axis(c.attr("axis", -1), len(shape))
        src = x[0]
    else:
        src = ops.flatten(c.b, x[0], c.attr("axis", 1))
        axis = 1
    pos = sorting.argmax(c.b, src, axis, keepdims=True)
    depth = c.b.shape(src)[axis]
    dt = c.b.type(x[0]).dtype
    onoff = c.b.constant(np.array([0, 1], dtype=dt), dtype=dt)
    hot = ops.squeeze(c.b, indexing.one_hot(c.b, pos, depth, onoff, axis + 1), [axis])
    return ops.reshape(c.b, hot, shape)


@_conv("CumSum", "CumProd")
def _cumulative(c: _Ctx, x):
    axis = c.ints(x[1], f"{c.node.op_type} axis")
    if len(axis) != 1:
        raise OnnxImportError(f"{c.node.op_type} axis must hold one value, got {axis}")
    fn = scan.cumsum if c.node.op_type == "CumSum" else scan.cumprod
    return fn(c.b, x[0], axis[0], bool(c.attr("exclusive", 0)), bool(c.attr("reverse", 0)))
