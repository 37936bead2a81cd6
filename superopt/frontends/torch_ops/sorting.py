"""Sorting, selection and scans: topk, sort/argsort, argmax/argmin, max/min along a dim, cumsum/cumprod."""

from __future__ import annotations

from typing import Any

import torch

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, aten, function, ir_dtype, method, need_op


@function(torch.topk)
@method("topk")
@aten("topk")
def _topk(cx: Ctx, x: T, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[T, T]:  # noqa: A002
    if cx.rank(x) == 0:
        return x, cx.const(torch.zeros((), dtype=torch.int64))
    values, indices = need_op(cx, "sorting", "topk")(cx.b, x, int(k), axis=cx.axis(dim, cx.rank(x)), largest=largest,
                                                      sorted=True)
    return T(values), T(indices)


@function(torch.sort)
@method("sort")
@aten("sort")
def _sort(cx: Ctx, x: T, dim: int = -1, descending: bool = False, stable: bool | None = None) -> tuple[T, T]:
    if isinstance(dim, bool):  # torch.sort(x, stable=..., dim=...) positional variant of aten.sort.stable
        raise cx.fail("sort(stable, ...) argument order is not supported")
    values, indices = need_op(cx, "sorting", "sort")(cx.b, x, axis=cx.axis(dim, cx.rank(x)), descending=descending)
    return T(values), T(indices)


@function(torch.argsort)
@method("argsort")
def _argsort(cx: Ctx, x: T, dim: int = -1, descending: bool = False, stable: bool = False) -> T:
    return T(need_op(cx, "sorting", "argsort")(cx.b, x, axis=cx.axis(dim, cx.rank(x)), descending=descending))


def _arg_reduce(kind: str) -> Any:
    def h(cx: Ctx, x: T, dim: int | None = None, keepdim: bool = False) -> T:
        op = need_op(cx, "sorting", kind)
        if dim is None:
            flat = cx.reshape(x, (-1,) if cx.rank(x) else (1,))
            out = T(op(cx.b, flat, axis=0, keepdims=False))
            return cx.reshape(out, [1] * cx.rank(x)) if keepdim else out
        return T(op(cx.b, x, axis=cx.axis(dim, cx.rank(x)), keepdims=keepdim))
    return h


for _kind in ("argmax", "argmin"):
    function(getattr(torch, _kind))(_arg_reduce(_kind))
    method(_kind)(_arg_reduce(_kind))
    aten(_kind)(_arg_reduce(_kind))


def values_and_indices(cx: Ctx, kind: str, x: T, dim: int, keepdim: bool) -> tuple[T, T]:
    """``torch.max(x, dim)``: (values, indices), indices of the first extreme as torch."""
    axis = cx.axis(dim, cx.rank(x))
    values = T(ops.reduce(cx.b, x, kind, [axis], keepdims=keepdim))
    indices = T(need_op(cx, "sorting", "argmax" if kind == "max" else "argmin")(cx.b, x, axis=axis, keepdims=keepdim))
    return values, indices


aten("max.dim")(lambda cx, x, dim, keepdim=False: values_and_indices(cx, "max", x, dim, keepdim))
aten("min.dim")(lambda cx, x, dim, keepdim=False: values_and_indices(cx, "min", x, dim, keepdim))


def _scan(kind: str) -> Any:
    def h(cx: Ctx, x: T, dim: int, *, dtype: Any = None, out: Any = None) -> T:
        if out is not None:
            raise cx.fail(f"{kind}(out=...) is not supported")
        want = ir_dtype(dtype) if dtype is not None else (
            "int64" if cx.dtype(x) in ("bool", "int32", "int64") else cx.dtype(x))
        if cx.dtype(x) != want:
            x = T(ops.cast(cx.b, x, want))
        if cx.rank(x) == 0:
            return x
        return T(need_op(cx, "scan", kind)(cx.b, x, axis=cx.axis(dim, cx.rank(x))))
    return h


for _kind in ("cumsum", "cumprod"):
    function(getattr(torch, _kind))(_scan(_kind))
    method(_kind)(_scan(_kind))
    aten(_kind)(_scan(_kind))
