"""Window pools that superopt.ops has no op for: LpPool, and AveragePool with dilations."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import idx, lit
from superopt.ops.pool import _window


def window_sum(b: GraphBuilder, x: str, kernel, strides, pads, dilations, ceil_mode: bool, term: str, post: str,
               name: str) -> str:
    """O = post(sum over each window of term(X)); ``term`` reads the tap as ``{x}``, ``post`` the sum as ``{s}``.
    Taps in the padding read 0 (before ``term``)."""
    sp, win, _outs, ext = _window(b, x, kernel, strides, pads, dilations, ceil_mode)
    o = idx(["n", "c"] + sp)
    read = f"X[{idx(['n', 'c'] + win)}]"
    src = f"S[{o}] += {term.format(x=read)}\nO[{o}] = {post.format(s=f'S[{o}]')}"
    return b.compute1(src, {"X": x}, name, extents=ext, padding={"X": 0.0}, outputs=["O"])


def dilated_avg_pool(b: GraphBuilder, x: str, kernel, strides, pads, dilations, ceil_mode: bool,
                     count_include_pad: bool) -> str:
    """Average over the taps inside the input (or inside input + explicit padding)."""
    xs = b.shape(x)
    nd = len(kernel)
    sp, _win, outs, _ext = _window(b, x, kernel, strides, pads, dilations, ceil_mode)
    counts = []
    for d in range(nd):
        lo, hi = (-pads[d], xs[2 + d] + pads[nd + d]) if count_include_pad else (0, xs[2 + d])
        taps = (np.arange(outs[d]) * strides[d] - pads[d])[:, None] + dilations[d] * np.arange(kernel[d])[None, :]
        counts.append(((taps >= lo) & (taps < hi)).sum(1))
    div = counts[0].astype(np.float64)
    for cnt in counts[1:]:
        div = np.multiply.outer(div, cnt)
    dt = b.type(x).dtype
    total = window_sum(b, x, kernel, strides, pads, dilations, ceil_mode, "{x}", "{s}", "avg_pool_sum")
    return ops.div(b, total, b.constant(div.reshape((1, 1, *div.shape)).astype(dt), dtype=dt))


@_conv("LpPool")
def _lp_pool(c: _Ctx, x):
    """(sum over the window of |x|^p)^(1/p); padding contributes 0."""
    from superopt.frontends.onnx_ops.nn import window_attrs

    kernel, strides, dil, pads = window_attrs(c, x[0])
    p = float(c.attr("p", 2))
    if p <= 0:
        raise OnnxImportError(f"LpPool p must be positive, got {p}")
    if p == 2.0:
        term, post = "{x} * {x}", "sqrt({s})"
    elif p == 1.0:
        term, post = "abs({x})", "{s}"
    else:
        term, post = f"pow(abs({{x}}), {lit(p)})", f"pow({{s}}, {lit(1.0 / p)})"
    return window_sum(c.b, x[0], kernel, strides, pads, dil, bool(c.attr("ceil_mode", 0)), term, post, "lp_pool")


def max_pool_with_indices(b: GraphBuilder, x: str, kernel, strides, pads, dilations, ceil_mode: bool,
                          storage_order: int = 0) -> list[str]:
    """[max, flat index of the first maximum in the whole input] per window (MaxPool's Indices output);
    storage_order 1 numbers the spatial positions column-major."""
    xs = b.shape(x)
    nd = len(kernel)
    sp, win, _outs, ext = _window(b, x, kernel, strides, pads, dilations, ceil_mode)
    spatial = list(xs[2:])
    if storage_order:  # column-major spatial positions: the first spatial axis varies fastest
        strides_pos = [int(np.prod(spatial[:d])) for d in range(nd)]
    else:
        strides_pos = [int(np.prod(spatial[d + 1:])) for d in range(nd)]
    plane = int(np.prod(spatial))
    pos = " + ".join([f"n * {xs[1] * plane}", f"c * {plane}"] + [f"({w}) * {s}" for w, s in zip(win, strides_pos, strict=True)])
    o = idx(["n", "c"] + sp)
    tap = f"X[{idx(['n', 'c'] + win)}]"
    big = np.iinfo(np.int64).max
    src = f"M[{o}] max= {tap}\nI[{o}] min= where({tap} == M[{o}], cast_int64({pos}), {big})"
    return b.compute(src, {"X": x}, "max_pool_indices", extents=ext, padding={"X": -np.inf}, outputs=["M", "I"])


@_conv("MaxUnpool")
def _max_unpool(c: _Ctx, x):
    """Values written at their flat positions (MaxPool's Indices) into zeros of the unpooled shape."""
    from superopt.ops import indexing

    xs = c.b.shape(x[0])
    kernel = list(c.attr("kernel_shape"))
    nd = len(kernel)
    strides = list(c.attr("strides", [1] * nd))
    pads = list(c.attr("pads", [0] * (2 * nd)))
    want = c.ints(x[2] if len(x) > 2 else None, "MaxUnpool output_shape")
    shape = [*xs[:2], *[(xs[2 + d] - 1) * strides[d] - pads[d] - pads[nd + d] + kernel[d] for d in range(nd)]]
    dt = c.b.type(x[0]).dtype
    zeros = c.b.constant(np.zeros(int(np.prod(shape)), dt), dtype=dt)
    where = ops.reshape(c.b, ops.cast(c.b, x[1], "int64"), [-1, 1])
    out = ops.reshape(c.b, indexing.scatter_nd(c.b, zeros, where, ops.reshape(c.b, x[0], [-1])), shape)
    if want is not None and list(want) != shape:  # a larger output_shape: zeros after the unpooled block (as onnx)
        if any(w < s for w, s in zip(want, shape, strict=True)):
            raise OnnxImportError(f"MaxUnpool output_shape {want} is smaller than the unpooled shape {shape}")
        out = ops.pad(c.b, out, [0] * len(shape) + [w - s for w, s in zip(want, shape, strict=True)], 0.0)
    return out
