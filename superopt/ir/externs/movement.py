"""Extern kinds for data movement: ``reshape`` (an alias) and ``gather`` with run-time indices."""

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
