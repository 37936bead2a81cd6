"""Extern kinds for data movement: ``reshape`` (an alias), ``gather`` with run-time indices, ``bitcast``."""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

# reshape(shape): same elements in row-major order, new shape (an alias: no data moves).
register(
    "reshape",
    lambda xs, a: [np.reshape(xs[0], a["shape"])],
    lambda ts, a: [TensorType(tuple(a["shape"]), ts[0].dtype)],
)


def _gather(xs, a):
    data, idx = xs
    idx = np.where(idx < 0, idx + data.shape[a["axis"]], idx)
    return [np.take(data, idx, axis=a["axis"])]


def _gather_type(ts, a):
    d, i = ts
    ax = a["axis"]
    return [TensorType(d.shape[:ax] + i.shape + d.shape[ax + 1:], d.dtype)]


# gather(axis): out[..., i..., ...] = data[..., idx[i...], ...] with run-time indices.
register("gather", _gather, _gather_type)


def _bitcast(xs, a):
    x = np.array(xs[0], dtype=a["from_dtype"])  # a contiguous copy (the reference interpreter may widen floats)
    return [x.view(a["dtype"])]


def _bitcast_type(ts, a):
    x = ts[0]
    src, dst = np.dtype(a["from_dtype"]), np.dtype(a["dtype"])
    if x.dtype != a["from_dtype"]:
        raise TypeError(f"bitcast: the input is {x.dtype}, not {a['from_dtype']}")
    if src.itemsize != dst.itemsize or "bool" in (x.dtype, a["dtype"]):
        raise TypeError(f"bitcast: {x.dtype} and {a['dtype']} differ in size (or one is bool)")
    return [TensorType(x.shape, a["dtype"])]


# bitcast(from_dtype, dtype): the same bytes read as another element type of the same size (ONNX BitCast).
register("bitcast", _bitcast, _bitcast_type)
