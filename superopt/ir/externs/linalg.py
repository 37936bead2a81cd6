"""Extern kind ``det``: the determinant of each square matrix in the last two axes (LU with partial pivoting,
numpy's ``linalg.det``); the result keeps the input's float type."""

from __future__ import annotations

import numpy as np

from superopt.ir.externs.registry import register
from superopt.ir.types import TensorType, is_float


def _det(xs, a):
    x = xs[0]
    return [np.asarray(np.linalg.det(x), dtype=x.dtype)]


def _det_type(ts, a):
    x = ts[0]
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"det: the input {x.shape} does not end in square matrices")
    if not is_float(x.dtype):
        raise TypeError(f"det: the input is {x.dtype}; a float type is needed")
    return [TensorType(x.shape[:-2], x.dtype)]


register("det", _det, _det_type)
