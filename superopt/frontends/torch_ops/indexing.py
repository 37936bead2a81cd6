"""Data-dependent indexing: gather/scatter, index_select, embedding, index assignment (``x[i] = v``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, aten, function, method, module, need_op


def _fit_to(cx: Ctx, x: T, shape: tuple[int, ...], skip: int) -> T:
    """``x`` sliced to ``shape`` on every axis but ``skip`` (torch lets index tensors be smaller)."""
    for d, n in enumerate(shape):
        if d != skip and cx.shape(x)[d] > n:
            x = cx.slice_axis(x, d, 0, n)
    return x


@function(torch.gather)
@method("gather")
@aten("gather")
def _gather(cx: Ctx, x: T, dim: int, index: T, *, sparse_grad: bool = False) -> T:
    axis = cx.axis(dim, cx.rank(x))
    x = _fit_to(cx, x, cx.shape(index), axis)
    return T(need_op(cx, "indexing", "gather_elements")(cx.b, x, index, axis=axis))


_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _scatter_impl(cx: Ctx, x: T, dim: int, index: T, src: Any, reduction: str) -> T:
    axis = cx.axis(dim, cx.rank(x))
    if isinstance(src, T):
        src = _fit_to(cx, src, cx.shape(index), -1)
        if cx.dtype(src) != cx.dtype(x):
            src = T(ops.cast(cx.b, src, cx.dtype(x)))
    else:
        src = cx.const(np.full(cx.shape(index), src, dtype=cx.dtype(x)))
    return T(need_op(cx, "indexing", "scatter_elements")(cx.b, x, index, src, axis=axis, reduction=reduction))


@function(torch.scatter)
@method("scatter")
@aten("scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce")
def _scatter(cx: Ctx, x: T, dim: int, index: T, src: Any = None, value: Any = None, *, reduce: str | None = None) -> T:
    src = value if src is None else src
    if reduce is not None and reduce not in _REDUCTIONS:
        raise cx.fail(f"scatter reduce={reduce!r} is not supported")
    return _scatter_impl(cx, x, dim, index, src, "none" if reduce is None else _REDUCTIONS[reduce])


@function(torch.scatter_add)
@method("scatter_add")
@aten("scatter_add")
def _scatter_add(cx: Ctx, x: T, dim: int, index: T, src: T) -> T:
    return _scatter_impl(cx, x, dim, index, src, "add")


@function(torch.scatter_reduce)
@method("scatter_reduce")
@aten("scatter_reduce.two")
def _scatter_reduce(cx: Ctx, x: T, dim: int, index: T, src: T, reduce: str, *, include_self: bool = True) -> T:
    if reduce not in _REDUCTIONS or not include_self:
        raise cx.fail(f"scatter_reduce(reduce={reduce!r}, include_self={include_self}) is not supported")
    return _scatter_impl(cx, x, dim, index, src, _REDUCTIONS[reduce])


@function(torch.index_select)
@method("index_select")
@aten("index_select")
def _index_select(cx: Ctx, x: T, dim: int, index: T) -> T:
    return T(ops.gather(cx.b, x, index, axis=cx.axis(dim, cx.rank(x))))


@function(F.embedding)
def _embedding(cx: Ctx, input: T, weight: T, padding_idx: int | None = None, max_norm: float | None = None,  # noqa: A002
               norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> T:
    if max_norm is not None:
        raise cx.fail("embedding with max_norm (renormalizes the weight in place) is not supported")
    return T(ops.gather(cx.b, weight, input, axis=0))


aten("embedding")(lambda cx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False:
                  _embedding(cx, indices, weight))


@module(nn.Embedding)
def _m_embedding(cx: Ctx, m: nn.Embedding, x: T) -> T:
    return _embedding(cx, x, cx.param(m.weight, "weight"), m.padding_idx, m.max_norm)


def _setitem(cx: Ctx, x: T, index: Any, value: Any) -> T:
    """``x[index] = value`` as a new tensor: a bool mask of x's shape, or basic indexing where one axis is
    addressed by an int or a step-1 slice and every other by ``:``."""
    idx = index if isinstance(index, tuple) else (index,)
    r = cx.rank(x)
    if len(idx) == 1 and isinstance(idx[0], T) and cx.dtype(idx[0]) == "bool" and cx.shape(idx[0]) == cx.shape(x):
        return T(ops.where(cx.b, idx[0], cx.tensor(value, x), x))
    if any(isinstance(i, T) for i in idx) or None in idx:
        raise cx.fail("index assignment with tensor indices or None is not supported")
    if Ellipsis in idx:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (r - len(idx) + 1) + idx[k + 1:]
    idx = idx + (slice(None),) * (r - len(idx))
    partial = [(d, i) for d, i in enumerate(idx) if i != slice(None)]
    if len(partial) != 1:
        raise cx.fail("index assignment is only supported along one axis")
    d, i = partial[0]
    n = cx.shape(x)[d]
    if isinstance(i, int):
        start, stop, dropped = i % n, i % n + 1, True
    else:
        start, stop, step = i.indices(n)
        if step != 1:
            raise cx.fail("index assignment with a slice step is not supported")
        stop, dropped = max(stop, start), False
    target = list(cx.shape(x))
    target[d] = stop - start
    v = cx.tensor(value, x)
    if cx.dtype(v) != cx.dtype(x):
        v = T(ops.cast(cx.b, v, cx.dtype(x)))
    if dropped:
        v = T(ops.expand(cx.b, v, target[:d] + target[d + 1:])) if cx.shape(v) != tuple(target[:d] + target[d + 1:]) else v
        v = cx.reshape(v, target)
    elif cx.shape(v) != tuple(target):
        v = T(ops.expand(cx.b, v, target))
    parts = [p for p in (cx.slice_axis(x, d, 0, start) if start > 0 else None, v,
                         cx.slice_axis(x, d, stop, n) if stop < n else None) if p is not None]
    return parts[0] if len(parts) == 1 else T(ops.concat(cx.b, parts, d))


def setitem_functional(x: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """``x[index] = value`` without mutating ``x``: what the backend's functionalization turns ``setitem`` into."""
    out = x.clone()
    out[index] = value
    return out


function(setitem_functional)(_setitem)


def copy_functional(x: torch.Tensor, src: Any) -> torch.Tensor:
    """``x.copy_(src)`` as a new tensor."""
    return torch.as_tensor(src, dtype=x.dtype).expand_as(x).clone()


def fill_functional(x: torch.Tensor, value: Any) -> torch.Tensor:
    """``x.fill_(value)`` as a new tensor."""
    return torch.full_like(x, value) if not isinstance(value, torch.Tensor) else value.to(x.dtype).expand_as(x).clone()


@function(copy_functional, fill_functional)
def _copy(cx: Ctx, x: T, src: Any) -> T:
    v = cx.tensor(src, x)
    if cx.dtype(v) != cx.dtype(x):
        v = T(ops.cast(cx.b, v, cx.dtype(x)))
    return v if cx.shape(v) == cx.shape(x) else T(ops.expand(cx.b, v, cx.shape(x)))


@aten("slice_scatter")
def _slice_scatter(cx: Ctx, x: T, src: T, dim: int = 0, start: int | None = None, end: int | None = None,
                   step: int = 1) -> T:
    """Functionalized ``x[..., start:end:step, ...] = src`` (what torch.export's decompositions emit)."""
    d = cx.axis(dim, cx.rank(x))
    return _setitem(cx, x, (slice(None),) * d + (slice(start, end, step),), src)


@aten("select_scatter")
def _select_scatter(cx: Ctx, x: T, src: T, dim: int, index: int) -> T:
    d = cx.axis(dim, cx.rank(x))
    return _setitem(cx, x, (slice(None),) * d + (int(index),), src)


aten("copy")(lambda cx, x, src, non_blocking=False: _copy(cx, x, src))
aten("copy_")(lambda cx, x, src, non_blocking=False: _copy(cx, x, src))
