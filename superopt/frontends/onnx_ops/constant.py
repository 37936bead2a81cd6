"""Ops that only make sense on constants (Shape, Size, ConstantOfShape, Range, Constant): always folded; and the
Optional ops over tensors (OptionalHasElement is a constant, OptionalGetElement of a tensor is that tensor)."""

from __future__ import annotations

import numpy as np
import onnx

from superopt.frontends.onnx_ops.context import ELEM, OnnxImportError, _conv, _Ctx


@_conv("Shape")
def _shape(c: _Ctx, x):
    s = np.array(c.b.shape(x[0]), np.int64)
    start, end = c.attr("start", 0), c.attr("end")
    return c.b.constant(s[start:end], dtype="int64")


@_conv("Size")
def _size(c, x):
    return c.b.constant(np.array(int(np.prod(c.b.shape(x[0]), dtype=np.int64)), np.int64))


@_conv("ConstantOfShape")
def _constant_of_shape(c: _Ctx, x):
    shape = c.ints(x[0], "ConstantOfShape shape")
    v = c.attr("value")
    val = np.zeros(1, np.float32) if v is None else v
    dt = _np_dtype_name(val.dtype)
    return c.b.constant(np.full(shape, val.reshape(-1)[0], dtype=dt))


@_conv("Range")
def _range(c: _Ctx, x):
    s, e, d = (c.const(t, "Range input") for t in x)
    return c.b.constant(np.arange(s.item(), e.item(), d.item()).astype(s.dtype))


@_conv("Constant")
def _constant(c: _Ctx, x):
    a = c.attrs
    if "value" in a:
        v = a["value"]
    elif "value_float" in a:
        v = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], np.int64)
    else:
        raise OnnxImportError(f"Constant with attribute(s) {sorted(a)} is not supported")
    return c.b.constant(v, dtype=_np_dtype_name(v.dtype))


@_conv("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(c: _Ctx, x):
    """Signal windows of a constant length: w[n] of cos(2 pi n / N') with N' = size (periodic) or size - 1."""
    size = int(c.const(x[0], f"{c.node.op_type} size").reshape(-1)[0])
    n = np.arange(size, dtype=np.float64)
    period = size if c.attr("periodic", 1) else size - 1
    ang = 2.0 * np.pi * n / period
    if c.node.op_type == "HannWindow":
        w = 0.5 - 0.5 * np.cos(ang)
    elif c.node.op_type == "HammingWindow":
        w = 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * np.cos(ang)
    else:
        w = 0.42 - 0.5 * np.cos(ang) + 0.08 * np.cos(2.0 * ang)
    dt = ELEM.get(c.attr("output_datatype", onnx.TensorProto.FLOAT))
    if dt is None:
        raise OnnxImportError(f"{c.node.op_type} output_datatype {c.attr('output_datatype')} is not supported")
    return c.b.constant(w.astype(dt), dtype=dt)


@_conv("MelWeightMatrix")
def _mel_weight_matrix(c: _Ctx, x):
    """(dft_length // 2 + 1, num_mel_bins) triangular filters, by the spec's reference formula (its mel step
    divides the range by num_mel_bins + 2)."""
    mels, n, rate = (int(c.const(t, "MelWeightMatrix input").reshape(-1)[0]) for t in x[:3])
    lo, hi = (float(c.const(t, "MelWeightMatrix edge").reshape(-1)[0]) for t in x[3:5])
    to_mel = lambda f: 2595 * np.log1p(f / 700) / np.log(10)  # noqa: E731
    lo_mel, hi_mel = to_mel(lo), to_mel(hi)
    edges = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    edges = (((n + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(int)
    w = np.zeros((n // 2 + 1, mels))
    for i in range(mels):
        left, centre, right = edges[i], edges[i + 1], edges[i + 2]
        if centre == left:
            w[centre, i] = 1
        else:
            for j in range(left, centre + 1):
                w[j, i] = (j - left) / (centre - left)
        for j in range(centre, right):
            w[j, i] = (right - j) / (right - centre)
    dt = ELEM.get(c.attr("output_datatype", onnx.TensorProto.FLOAT))
    if dt is None:
        raise OnnxImportError(f"MelWeightMatrix output_datatype {c.attr('output_datatype')} is not supported")
    return c.b.constant(w.astype(dt), dtype=dt)


def _np_dtype_name(dt) -> str:
    name = np.dtype(dt).name
    if name not in ("float32", "float64", "int64", "int32", "bool"):
        raise OnnxImportError(f"element type {name} is not supported")
    return name


CONST_ONLY = {"Shape", "Size", "ConstantOfShape", "Range", "Constant", "HannWindow", "HammingWindow", "BlackmanWindow",
              "MelWeightMatrix"}


@_conv("OptionalHasElement")
def _optional_has_element(c: _Ctx, x):
    """Whether the optional input holds a value: false with no input, true with a tensor (superopt holds tensors
    only, never an empty optional)."""
    return c.b.constant(np.array(bool(x and x[0] is not None)), dtype="bool")


@_conv("OptionalGetElement")
def _optional_get_element(c: _Ctx, x):
    """A tensor given where an optional is allowed is returned as it is."""
    if not x or x[0] is None:
        raise OnnxImportError("OptionalGetElement of an empty optional")
    return x[0]
