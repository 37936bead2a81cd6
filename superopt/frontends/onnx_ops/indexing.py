"""Data-dependent indexing: GatherElements, GatherND, ScatterElements (and the older Scatter), ScatterND,
OneHot, EyeLike."""

from __future__ import annotations

import numpy as np

from superopt.frontends.onnx_ops.context import ELEM, OnnxImportError, _conv, _Ctx
from superopt.ops import indexing


def _reduction(c: _Ctx) -> str:
    """Scatter reductions: none before opset 16, add/mul from 16, max/min from 18."""
    red = str(c.attr("reduction", "none"))
    allowed = ("none",) if c.opset < 16 else ("none", "add", "mul") if c.opset < 18 else ("none", "add", "mul", "max", "min")
    if red not in allowed:
        raise OnnxImportError(f"{c.node.op_type} reduction {red!r} is not defined at opset {c.opset}")
    return red


@_conv("GatherElements")
def _gather_elements(c: _Ctx, x):
    return indexing.gather_elements(c.b, x[0], x[1], c.attr("axis", 0))


@_conv("GatherND")
def _gather_nd(c: _Ctx, x):
    return indexing.gather_nd(c.b, x[0], x[1], c.attr("batch_dims", 0))


@_conv("ScatterElements", "Scatter")
def _scatter_elements(c: _Ctx, x):
    return indexing.scatter_elements(c.b, x[0], x[1], x[2], c.attr("axis", 0), _reduction(c))


@_conv("ScatterND")
def _scatter_nd(c: _Ctx, x):
    return indexing.scatter_nd(c.b, x[0], x[1], x[2], _reduction(c))


@_conv("OneHot")
def _one_hot(c: _Ctx, x):
    depth = c.const(x[1], "OneHot depth")
    if depth.size != 1:
        raise OnnxImportError(f"OneHot depth must hold one value, got shape {depth.shape}")
    return indexing.one_hot(c.b, x[0], int(depth.reshape(-1)[0]), x[2], c.attr("axis", -1))


@_conv("EyeLike")
def _eye_like(c: _Ctx, x):
    """Ones on the k-th diagonal of a 2-D shape: a constant (only the input's shape matters)."""
    shape = c.b.shape(x[0])
    if len(shape) != 2:
        raise OnnxImportError(f"EyeLike needs a 2-D input, got shape {shape}")
    to = c.attr("dtype")
    if to is not None and to not in ELEM:
        raise OnnxImportError(f"EyeLike dtype {to} is not supported")
    dt = ELEM[to] if to is not None else c.b.type(x[0]).dtype
    return c.b.constant(np.eye(shape[0], shape[1], int(c.attr("k", 0)), dtype=dt), dtype=dt)
