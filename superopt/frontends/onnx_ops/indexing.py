"""Data-dependent indexing: GatherElements, GatherND, ScatterElements (and the older Scatter), ScatterND,
OneHot, EyeLike."""

from __future__ import annotations

import numpy as np

from superopt import ops
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


@_conv("TensorScatter")
def _tensor_scatter(c: _Ctx, x):
    """Write ``update`` into a copy of ``past_cache`` along ``axis`` from each batch entry's write index (linear, or
    wrapping around in circular mode) (opset 24); the write indices must be compile-time values."""
    past, upd = x[0], x[1]
    ps, us = c.b.shape(past), c.b.shape(upd)
    rank = len(ps)
    axis = int(c.attr("axis", -2)) % rank
    starts = c.ints(x[2] if len(x) > 2 else None, "TensorScatter write_indices")
    starts = np.zeros(ps[0], np.int64) if starts is None else np.asarray(starts, np.int64)
    pos = starts.reshape([-1] + [1] * (rank - 1)) + np.arange(us[axis]).reshape([-1 if k == axis else 1 for k in range(rank)])
    if str(c.attr("mode", "linear")) == "circular":
        pos = pos % ps[axis]
    elif (pos >= ps[axis]).any():
        raise OnnxImportError(f"TensorScatter: writes past the cache length {ps[axis]} in linear mode")
    index = np.broadcast_to(pos, us).astype(np.int64)
    return indexing.scatter_elements(c.b, past, c.b.constant(np.ascontiguousarray(index), dtype="int64"), upd, axis)


@_conv("Col2Im")
def _col2im(c: _Ctx, x):
    """(N, C * prod(block), L) columns summed back into (N, C, *image): one matmul with the constant 0/1 map
    from (block offset, column) to image position."""
    n, ck, cols = c.b.shape(x[0])
    image, block = c.ints(x[1], "Col2Im image_shape"), c.ints(x[2], "Col2Im block_shape")
    nd = len(image)
    dil = list(c.attr("dilations", [1] * nd))
    pads = list(c.attr("pads", [0] * (2 * nd)))
    strides = list(c.attr("strides", [1] * nd))
    k = int(np.prod(block))
    if ck % k:
        raise OnnxImportError(f"Col2Im: {ck} rows are not a multiple of the block size {k}")
    grid = [(image[d] + pads[d] + pads[nd + d] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1 for d in range(nd)]
    if int(np.prod(grid)) != cols:
        raise OnnxImportError(f"Col2Im: {cols} columns do not match the {grid} grid of block positions")
    size = k * cols * int(np.prod(image))
    if size > 1 << 24:
        raise OnnxImportError(f"Col2Im: the {k * cols} x {int(np.prod(image))} placement matrix is too large")
    dt = c.b.type(x[0]).dtype
    place = np.zeros((k, cols, int(np.prod(image))), dt)
    for off in np.ndindex(*block):
        for col, at in enumerate(np.ndindex(*grid)):
            p = [at[d] * strides[d] - pads[d] + off[d] * dil[d] for d in range(nd)]
            if all(0 <= p[d] < image[d] for d in range(nd)):
                place[np.ravel_multi_index(off, block), col, np.ravel_multi_index(p, image)] = 1
    flat = ops.reshape(c.b, x[0], [n, ck // k, k * cols])
    out = ops.matmul(c.b, flat, c.b.constant(place.reshape(k * cols, -1), dtype=dt))
    return ops.reshape(c.b, out, [n, ck // k, *image])
