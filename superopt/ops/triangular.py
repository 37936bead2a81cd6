"""Triangular parts of matrices (ONNX Trilu, numpy triu/tril): a condition on the two last index variables."""

from __future__ import annotations

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ops._util import dims, idx, lit


def trilu(b: GraphBuilder, x: str, k: int = 0, upper: bool = True) -> str:
    """Keep the elements on and above (``upper``) or on and below the k-th diagonal of the last two axes,
    zero the rest: upper keeps j - i >= k (``np.triu(x, k)``), lower keeps j - i <= k (``np.tril(x, k)``)."""
    shape = b.shape(x)
    if len(shape) < 2:
        raise ValueError(f"trilu: needs a tensor of rank >= 2, got shape {shape}")
    if k != int(k):
        raise ValueError(f"trilu: k must be an integer, got {k!r}")
    k = int(k)
    v = b.const_value(x)
    if v is not None:
        return b.constant(np.triu(v, k) if upper else np.tril(v, k), dtype=v.dtype.name)
    if 0 in shape:  # nothing to compute
        return b.constant(np.zeros(shape, b.type(x).dtype))
    ds = dims(len(shape))
    i, j = ds[-2], ds[-1]
    rows, cols = shape[-2], shape[-1]
    # the whole matrix kept (or zeroed) whatever the entries: no condition to evaluate
    if (upper and k <= -(rows - 1)) or (not upper and k >= cols - 1):
        return x
    cond = f"{j} >= {i} + {lit(k)}" if upper else f"{j} <= {i} + {lit(k)}"
    zero = "false" if b.type(x).dtype == "bool" else "0"
    full = idx(ds)
    return b.compute1(f"O[{full}] = where({cond}, X[{full}], {zero})", {"X": x}, "trilu")
