"""Running sums and products along an axis (ONNX CumSum semantics; an extern kind ``cumulative``)."""

from __future__ import annotations

from superopt.builder import GraphBuilder
from superopt.ops._extern import extern_op
from superopt.ops._util import norm_axis


def _cumulative(b: GraphBuilder, fn: str, x: str, axis: int, exclusive: bool, reverse: bool) -> str:
    shape = b.shape(x)
    if not shape:
        raise ValueError(f"cum{fn}: input {x!r} is a scalar; it needs at least one axis")
    return extern_op(b, "cumulative", [x], f"cum{fn}", fn=fn, axis=norm_axis(int(axis), len(shape)),
                     exclusive=bool(exclusive), reverse=bool(reverse))[0]


def cumsum(b: GraphBuilder, x: str, axis: int, exclusive: bool = False, reverse: bool = False) -> str:
    """out[i] = sum of x[j] for j <= i (j < i if exclusive; j >= i, j > i if reverse) along ``axis``."""
    return _cumulative(b, "sum", x, axis, exclusive, reverse)


def cumprod(b: GraphBuilder, x: str, axis: int, exclusive: bool = False, reverse: bool = False) -> str:
    """Like :func:`cumsum` with products (exclusive: the first output is 1)."""
    return _cumulative(b, "prod", x, axis, exclusive, reverse)


__all__ = ["cumsum", "cumprod"]
