"""Reductions, softmax, normalization, contractions (MatMul, Gemm, Conv) and pooling."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise

# op type -> (elementwise map before, reduction, elementwise map after); None: identity
_REDUCE = {
    "ReduceSum": (None, "sum", None),
    "ReduceMean": (None, "mean", None),
    "ReduceMax": (None, "max", None),
    "ReduceMin": (None, "min", None),
    "ReduceProd": (None, "prod", None),
    "ReduceSumSquare": ("{0} * {0}", "sum", None),
    "ReduceL1": ("abs({0})", "sum", None),
    "ReduceL2": ("{0} * {0}", "sum", "sqrt({0})"),
    "ReduceLogSum": (None, "sum", "log({0})"),
    "ReduceLogSumExp": (None, "logsumexp", None),
}


@_conv(*_REDUCE)
def _reduce(c: _Ctx, x):
    op = c.node.op_type
    axes_as_input = c.opset >= 18 or (op == "ReduceSum" and c.opset >= 13)
    axes = c.ints(x[1] if len(x) > 1 else None, f"{op} axes") if axes_as_input else c.attr("axes")
    keep = bool(c.attr("keepdims", 1))
    pre, kind, post = _REDUCE[op]
    if not axes and c.attr("noop_with_empty_axes", 0):  # reduce over no axis: only the elementwise parts
        out = x[0]
        for f in (pre, post):
            out = out if f is None else ewise(c.b, f, [out], op)
        return out
    if 0 in c.b.shape(x[0]):
        return _reduce_empty(c, x[0], axes, keep)
    src = x[0] if pre is None else ewise(c.b, pre, [x[0]], op)
    if kind == "logsumexp":  # max + log(sum(exp(x - max))), with the max of finite values (as the spec's reference)
        m = ops.reduce(c.b, src, "max", axes or None, keepdims=True)
        s = ops.reduce(c.b, ewise(c.b, "exp({0} - {1})", [src, m], "exp_shifted"), "sum", axes or None, keepdims=True)
        out = ewise(c.b, "log({0}) + {1}", [s, m], "logsumexp")
        if not keep:
            out = ops.squeeze(c.b, out, _norm_axes(axes, len(c.b.shape(x[0]))))
        return out
    out = ops.reduce(c.b, src, kind, axes or None, keepdims=keep)
    return out if post is None else ewise(c.b, post, [out], op)


def _reduce_empty(c: _Ctx, x: str, axes, keep: bool) -> str:
    """A reduction of a tensor with no elements: the reduction's identity, as a constant."""
    shape, dt = c.b.shape(x), np.dtype(c.b.type(x).dtype)
    red = _norm_axes(axes, len(shape))
    out = [1 if k in red else s for k, s in enumerate(shape) if keep or k not in red]
    big = np.iinfo(dt).max if dt.kind in "iu" else (True if dt.kind == "b" else np.inf)
    small = np.iinfo(dt).min if dt.kind in "iu" else (False if dt.kind == "b" else -np.inf)
    value = {"ReduceProd": 1, "ReduceMax": small, "ReduceMin": big, "ReduceLogSum": -np.inf,
             "ReduceLogSumExp": -np.inf}.get(c.node.op_type, 0)
    return c.b.constant(np.full(out, value, dt), dtype=dt.name)


def _norm_axes(axes, rank: int) -> list[int]:
    return list(range(rank)) if not axes else sorted({a % rank for a in axes})


@_conv("Softmax", "LogSoftmax")
def _softmax(c: _Ctx, x):
    fn = ops.softmax if c.node.op_type == "Softmax" else ops.log_softmax
    shape = c.b.shape(x[0])
    if c.opset >= 13:
        return fn(c.b, x[0], c.attr("axis", -1))
    axis = c.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    flat = ops.flatten(c.b, x[0], axis)
    return ops.reshape(c.b, fn(c.b, flat, 1), shape)


@_conv("LayerNormalization")
def _layer_norm(c: _Ctx, x):
    from superopt.ops.normalization import layer_norm_with_stats

    if c.b.type(x[0]).dtype != "float32" and any(o for o in c.node.output[1:]):
        raise OnnxImportError("LayerNormalization statistics outputs are only supported for float32")
    return layer_norm_with_stats(c.b, x[0], x[1], x[2] if len(x) > 2 else None, c.attr("axis", -1), c.attr("epsilon", 1e-5))


@_conv("BatchNormalization")
def _batch_norm(c: _Ctx, x):
    eps = c.attr("epsilon", 1e-5)
    training = bool(c.attr("training_mode", 0)) or any(o for o in c.node.output[1:])
    if not training:
        return ops.batch_norm(c.b, x[0], x[1], x[2], x[3], x[4], eps)
    if c.opset < 14:
        raise OnnxImportError("BatchNormalization training outputs before opset 14 (saved mean/var) are not supported")
    # training (opset 14+): normalize with the batch statistics, and update the running ones by momentum
    rank = len(c.b.shape(x[0]))
    axes = [0, *range(2, rank)]
    mean = ops.reduce(c.b, x[0], "mean", axes, keepdims=False)
    bshape = [1, -1] + [1] * (rank - 2)
    centred = ops.sub(c.b, x[0], ops.reshape(c.b, mean, bshape))
    var = ops.reduce(c.b, ops.mul(c.b, centred, centred), "mean", axes, keepdims=False)
    y = ops.batch_norm(c.b, x[0], x[1], x[2], mean, var, eps)
    m = float(c.attr("momentum", 0.9))
    blend = f"{{0}} * {m!r} + {{1}} * {1.0 - m!r}"
    return [y, ewise(c.b, blend, [x[3], mean], "running_mean"), ewise(c.b, blend, [x[4], var], "running_var")]


@_conv("LRN")
def _lrn(c: _Ctx, x):
    return ops.lrn(c.b, x[0], c.attr("size"), c.attr("alpha", 1e-4), c.attr("beta", 0.75), c.attr("bias", 1.0))


# ---- contractions and pooling ----------------------------------------------------------------------
@_conv("MatMul")
def _matmul(c, x):
    return ops.matmul(c.b, x[0], x[1])


@_conv("Gemm")
def _gemm(c: _Ctx, x):
    return ops.gemm(
        c.b,
        x[0],
        x[1],
        x[2] if len(x) > 2 else None,
        c.attr("alpha", 1.0),
        c.attr("beta", 1.0),
        bool(c.attr("transA", 0)),
        bool(c.attr("transB", 0)),
    )


def _auto_pads(c: _Ctx, in_sp, kernel, strides, dilations) -> list[int]:
    nd = len(kernel)
    auto = c.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        return list(c.attr("pads", [0] * (2 * nd)))
    if auto == "VALID":
        return [0] * (2 * nd)
    pads = [0] * (2 * nd)
    for d in range(nd):
        out = -(-in_sp[d] // strides[d])
        total = max(0, (out - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_sp[d])
        small, big = total // 2, total - total // 2
        pads[d], pads[nd + d] = (small, big) if auto == "SAME_UPPER" else (big, small)
    return pads


@_conv("Conv")
def _conv_op(c: _Ctx, x):
    xs, ws = c.b.shape(x[0]), c.b.shape(x[1])
    nd = len(xs) - 2
    kernel = list(c.attr("kernel_shape", ws[2:]))
    strides = list(c.attr("strides", [1] * nd))
    dil = list(c.attr("dilations", [1] * nd))
    pads = _auto_pads(c, xs[2:], kernel, strides, dil)
    return ops.convnd(c.b, x[0], x[1], x[2] if len(x) > 2 else None, strides, pads, dil, c.attr("group", 1))


def window_attrs(c: _Ctx, x: str) -> tuple[list[int], list[int], list[int], list[int]]:
    """A pooling node's (kernel, strides, dilations, pads), auto_pad resolved, for input ``x``."""
    kernel = list(c.attr("kernel_shape"))
    nd = len(kernel)
    strides = list(c.attr("strides", [1] * nd))
    dil = list(c.attr("dilations", [1] * nd))
    return kernel, strides, dil, _auto_pads(c, c.b.shape(x)[2:], kernel, strides, dil)


@_conv("MaxPool", "AveragePool")
def _pool(c: _Ctx, x):
    kernel, strides, dil, pads = window_attrs(c, x[0])
    ceil_mode = bool(c.attr("ceil_mode", 0))
    if c.node.op_type == "MaxPool":
        if len(c.node.output) > 1 and c.node.output[1]:
            from superopt.frontends.onnx_ops.pooling import max_pool_with_indices

            order = int(c.attr("storage_order", 0))
            return max_pool_with_indices(c.b, x[0], kernel, strides, pads, dil, ceil_mode, order)
        return ops.max_pool(c.b, x[0], kernel, strides, pads, dil, ceil_mode)
    if any(d != 1 for d in dil):
        from superopt.frontends.onnx_ops.pooling import dilated_avg_pool

        return dilated_avg_pool(c.b, x[0], kernel, strides, pads, dil, ceil_mode, bool(c.attr("count_include_pad", 0)))
    return ops.avg_pool(c.b, x[0], kernel, strides, pads, ceil_mode, bool(c.attr("count_include_pad", 0)))


@_conv("GlobalAveragePool")
def _gap(c, x):
    return ops.global_avg_pool(c.b, x[0])


@_conv("GlobalMaxPool")
def _gmp(c, x):
    return ops.global_max_pool(c.b, x[0])


@_conv("ConvTranspose")
def _conv_transpose(c: _Ctx, x):
    xs, ws = c.b.shape(x[0]), c.b.shape(x[1])
    nd = len(xs) - 2
    kernel = list(c.attr("kernel_shape", ws[2:]))
    if list(kernel) != list(ws[2:]):
        raise OnnxImportError(f"ConvTranspose kernel_shape {kernel} differs from the weight's {list(ws[2:])}")
    strides = list(c.attr("strides", [1] * nd))
    dil = list(c.attr("dilations", [1] * nd))
    out_pad = list(c.attr("output_padding", [0] * nd))[:nd]
    auto = c.attr("auto_pad", "NOTSET") or "NOTSET"
    out_shape = c.attr("output_shape")
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [xs[2 + d] * strides[d] for d in range(nd)]
    if out_shape is not None:  # pads follow from the wanted output size (the spec's formula)
        out_shape = list(out_shape)[-nd:]
        total = [strides[d] * (xs[2 + d] - 1) + out_pad[d] + (kernel[d] - 1) * dil[d] + 1 - out_shape[d] for d in range(nd)]
        if auto == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    elif auto == "VALID" or auto == "NOTSET":
        pads = list(c.attr("pads", [0] * (2 * nd)))
        if auto == "VALID":
            pads = [0] * (2 * nd)
    else:
        raise OnnxImportError(f"ConvTranspose auto_pad {auto!r} is not supported")
    return ops.conv_transpose(c.b, x[0], x[1], x[2] if len(x) > 2 else None, strides, pads, dil, c.attr("group", 1), out_pad)


@_conv("Einsum")
def _einsum(c: _Ctx, x):
    return ops.einsum(c.b, str(c.attr("equation")).replace(" ", ""), *x)


@_conv("CausalConvWithState")
def _causal_conv_with_state(c: _Ctx, x):
    """Depthwise causal conv1d over [past_state (or zeros), input], optional SiLU; the new state is the last k-1
    positions of that concatenation (opset 28)."""
    inp, w = x[0], x[1]
    bias = x[2] if len(x) > 2 else None
    past = x[3] if len(x) > 3 else None
    bsz, ch, _ = c.b.shape(inp)
    k = c.b.shape(w)[2]
    dt = c.b.type(inp).dtype
    if past is None:
        past = c.b.constant(np.zeros((bsz, ch, k - 1), dt), dtype=dt)
    padded = ops.concat(c.b, [past, inp], 2) if k > 1 else inp
    y = ops.convnd(c.b, padded, w, bias, [1], [0, 0], [1], ch)
    act = str(c.attr("activation", "none"))
    if act in ("silu", "swish"):
        y = ops.silu(c.b, y)
    elif act != "none":
        raise OnnxImportError(f"CausalConvWithState activation {act!r} is not one of none, silu, swish")
    total = c.b.shape(padded)[2]
    state = (ops.slice_(c.b, padded, [total - (k - 1)], [total], [2]) if k > 1
             else c.b.constant(np.zeros((bsz, ch, 0), dt), dtype=dt))
    return [y, state]
