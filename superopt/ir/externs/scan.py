"""Extern kind ``cumulative(fn, axis, exclusive, reverse)``: running sum or product along an axis.

``exclusive`` leaves out the element itself (the first output is 0 for sums, 1 for products);
``reverse`` runs from the end of the axis. The result keeps the input's element type (ONNX CumSum).
"""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType

SCANS = {"sum": (np.cumsum, 0), "prod": (np.cumprod, 1)}


def _cumulative(xs, a):
    x = xs[0]
    axis = a["axis"]
    scan, identity = SCANS[a["fn"]]
    y = np.flip(x, axis) if a["reverse"] else x
    out = scan(y, axis=axis, dtype=x.dtype)
    if a["exclusive"] and x.shape[axis]:
        head = np.full_like(np.take(out, [0], axis=axis), identity)
        out = np.concatenate([head, np.take(out, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(out, axis) if a["reverse"] else out]


def _cumulative_type(ts, a):
    x = ts[0]
    name = f"cum{a['fn']}"
    if a["fn"] not in SCANS:
        raise ValueError(f"cumulative: fn must be one of {sorted(SCANS)}, not {a['fn']!r}")
    if x.dtype == "bool":
        raise TypeError(f"{name}: bool input is not supported (cast it to a number first)")
    if not 0 <= a["axis"] < x.rank:
        raise ValueError(f"{name}: axis {a['axis']} is out of range for rank {x.rank}")
    return [TensorType(x.shape, x.dtype)]


register("cumulative", _cumulative, _cumulative_type)
