"""Ordering ops (externs: their results depend on comparisons between data values).

``topk`` breaks ties by lower index (ONNX TopK); ``sort``/``argsort`` are stable, also descending;
``argmax``/``argmin`` return the first extreme index unless ``select_last_index``. Indices are int64.
"""

from __future__ import annotations

from superopt.builder import GraphBuilder
from superopt.ops._extern import extern_op
from superopt.ops._util import norm_axis


def _ranked_axis(b: GraphBuilder, x: str, axis: int, what: str) -> int:
    shape = b.shape(x)
    if not shape:
        raise ValueError(f"{what}: input {x!r} is a scalar; it needs at least one axis")
    return norm_axis(int(axis), len(shape))


def topk(b: GraphBuilder, x: str, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> list[str]:
    """[values, indices] of the k largest (smallest) entries along ``axis``, best first.

    ``sorted=False`` lets ONNX return any order; this op always returns them sorted."""
    a = _ranked_axis(b, x, axis, "topk")
    return extern_op(b, "topk", [x], "topk", k=int(k), axis=a, largest=bool(largest))


def sort(b: GraphBuilder, x: str, axis: int = -1, descending: bool = False) -> list[str]:
    """[values, indices] sorted along ``axis``; stable (equal values keep their order)."""
    a = _ranked_axis(b, x, axis, "sort")
    return extern_op(b, "topk", [x], "sort", k=b.shape(x)[a], axis=a, largest=bool(descending))


def argsort(b: GraphBuilder, x: str, axis: int = -1, descending: bool = False) -> str:
    return sort(b, x, axis, descending)[1]


def _arg_reduce(b: GraphBuilder, fn: str, x: str, axis: int, keepdims: bool, select_last_index: bool) -> str:
    a = _ranked_axis(b, x, axis, f"arg{fn}")
    return extern_op(b, "arg_reduce", [x], f"arg{fn}", fn=fn, axis=a, keepdims=bool(keepdims),
                     select_last_index=bool(select_last_index))[0]


def argmax(b: GraphBuilder, x: str, axis: int = 0, keepdims: bool = True, select_last_index: bool = False) -> str:
    return _arg_reduce(b, "max", x, axis, keepdims, select_last_index)


def argmin(b: GraphBuilder, x: str, axis: int = 0, keepdims: bool = True, select_last_index: bool = False) -> str:
    return _arg_reduce(b, "min", x, axis, keepdims, select_last_index)


__all__ = ["topk", "sort", "argsort", "argmax", "argmin"]
