"""Reductions, softmax and normalization."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from superopt import ops
from superopt.frontends.torch_ops.context import (
    Ctx,
    Handler,
    T,
    _ints,
    _Missing,
    aten,
    function,
    ir_dtype,
    method,
    module,
    need_op,
)
from superopt.frontends.torch_ops.elementwise import _binary, _max_min


# =================================================================================================
# Reductions, softmax, normalization
# =================================================================================================
def _reduce_axes(cx: Ctx, x: T, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(cx.rank(x)))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({cx.axis(d, cx.rank(x)) for d in dim})


def _reducer(kind: str) -> Handler:
    def h(cx: Ctx, x: T, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> T:
        if dtype is not None:
            x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
        if cx.rank(x) == 0:
            return x
        return T(ops.reduce(cx.b, x, kind, _reduce_axes(cx, x, dim), keepdims=keepdim))
    return h


for _kind, _names in {"mean": ("mean",), "sum": ("sum",), "max": ("amax",), "min": ("amin",),
                      "prod": ("prod",)}.items():
    for _n in _names:
        function(getattr(torch, _n))(_reducer(_kind))
        method(_n)(_reducer(_kind))


@method("max", "min")
def _max_method(cx: Ctx, x: T, dim: Any = None, keepdim: bool = False) -> Any:
    kind = cx.node.target
    if isinstance(dim, T):
        return _binary(cx, ops.maximum if kind == "max" else ops.minimum, builtins.max, x, dim)
    return _max_min(cx, kind, x, dim, keepdim)


def _softmax_dim(cx: Ctx, x: T, dim: int | None) -> int:
    if dim is None:  # torch's legacy implicit dim
        dim = 0 if cx.rank(x) in (0, 1, 3) else 1
    return dim


@function(F.softmax, torch.softmax, torch.special.softmax)
@method("softmax")
def _softmax(cx: Ctx, x: T, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> T:
    if dtype is not None:
        x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
    return T(ops.softmax(cx.b, x, axis=_softmax_dim(cx, x, dim)))


@function(F.log_softmax, torch.log_softmax, torch.special.log_softmax)
@method("log_softmax")
def _log_softmax(cx: Ctx, x: T, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> T:
    if dtype is not None:
        x = T(ops.cast(cx.b, x, ir_dtype(dtype)))
    return T(ops.log_softmax(cx.b, x, axis=_softmax_dim(cx, x, dim)))


@function(F.layer_norm, torch.layer_norm)
def _layer_norm(cx: Ctx, x: T, normalized_shape: Sequence[int], weight: T | None = None,
                bias: T | None = None, eps: float = 1e-5, cudnn_enable: bool = True) -> T:
    n = len(_ints(normalized_shape, 1))
    return T(ops.layer_norm(cx.b, x, weight, bias, axis=cx.rank(x) - n, eps=eps))


@function(getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))
def _rms_norm(cx: Ctx, x: T, normalized_shape: Sequence[int], weight: T | None = None,
              eps: float | None = None) -> T:
    n = len(_ints(normalized_shape, 1))
    if eps is None:
        eps = float(torch.finfo(getattr(torch, cx.dtype(x))).eps)
    return T(ops.rms_norm(cx.b, x, weight, axis=cx.rank(x) - n, eps=eps))


def _bn(cx: Ctx, x: T, mean: T, var: T, weight: T | None, bias: T | None, training: bool,
        eps: float) -> T:
    if training:
        raise cx.fail("batch_norm in training mode is not supported (call model.eval())")
    if mean is None or var is None:
        raise cx.fail("batch_norm without running statistics is not supported")
    c = cx.shape(x)[1]
    if weight is None:
        weight = cx.const(np.ones(c, np.float32))
    if bias is None:
        bias = cx.const(np.zeros(c, np.float32))
    return T(ops.batch_norm(cx.b, x, weight, bias, mean, var, eps=eps))


@function(F.batch_norm)
def _f_batch_norm(cx: Ctx, x: T, running_mean: T | None, running_var: T | None,
                  weight: T | None = None, bias: T | None = None, training: bool = False,
                  momentum: float = 0.1, eps: float = 1e-5) -> T:
    return _bn(cx, x, running_mean, running_var, weight, bias, training, eps)


@function(torch.batch_norm)
def _torch_batch_norm(cx: Ctx, x: T, weight: T | None, bias: T | None, running_mean: T | None,
                      running_var: T | None, training: bool, momentum: float, eps: float,
                      cudnn_enabled: bool = True) -> T:
    return _bn(cx, x, running_mean, running_var, weight, bias, training, eps)


def _per_channel(cx: Ctx, t: T | None, x: T, fill: float) -> T:
    c = cx.shape(x)[1]
    return t if t is not None else cx.const(np.full(c, fill, dtype=cx.dtype(x)))


@function(F.group_norm, torch.group_norm)
def _group_norm(cx: Ctx, x: T, num_groups: int, weight: T | None = None, bias: T | None = None,
                eps: float = 1e-5, cudnn_enabled: bool = True) -> T:
    return T(need_op(cx, "normalization", "group_norm")(cx.b, x, _per_channel(cx, weight, x, 1.0),
                                                        _per_channel(cx, bias, x, 0.0), int(num_groups), eps=eps))


aten("group_norm")(_group_norm)


@aten("native_group_norm")
def _aten_native_group_norm(cx: Ctx, x: T, weight: T | None, bias: T | None, n: int, c: int, hxw: int, group: int,
                            eps: float) -> tuple[Any, ...]:
    return (_group_norm(cx, x, group, weight, bias, eps), _Missing("group_norm mean"), _Missing("group_norm rstd"))


@function(F.instance_norm, torch.instance_norm)
def _instance_norm(cx: Ctx, x: T, running_mean: T | None = None, running_var: T | None = None,
                   weight: T | None = None, bias: T | None = None, use_input_stats: bool = True,
                   momentum: float = 0.1, eps: float = 1e-5, cudnn_enabled: bool = True) -> T:
    if not use_input_stats:
        return _bn(cx, x, running_mean, running_var, weight, bias, False, eps)
    return T(need_op(cx, "normalization", "instance_norm")(cx.b, x, _per_channel(cx, weight, x, 1.0),
                                                           _per_channel(cx, bias, x, 0.0), eps=eps))


aten("instance_norm")(_instance_norm)


@module(nn.GroupNorm)
def _m_group_norm(cx: Ctx, m: nn.GroupNorm, x: T) -> T:
    return _group_norm(cx, x, m.num_groups, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), m.eps)


@module(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _m_instance_norm(cx: Ctx, m: nn.modules.instancenorm._InstanceNorm, x: T) -> T:
    use_stats = m.training or not m.track_running_stats
    return _instance_norm(cx, x, cx.param(m.running_mean, "running_mean"), cx.param(m.running_var, "running_var"),
                          cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), use_stats, m.momentum, m.eps)


def _any_all(kind: str) -> Handler:
    def h(cx: Ctx, x: T, dim: Any = None, keepdim: bool = False) -> T:
        flag = x if cx.dtype(x) == "bool" else T(ops.compare(cx.b, "!=", x, cx.tensor(0, x)))
        as_int = T(ops.cast(cx.b, flag, "int32"))
        if cx.rank(x) == 0:
            return T(ops.compare(cx.b, "!=", as_int, cx.tensor(0, as_int)))
        r = T(ops.reduce(cx.b, as_int, kind, _reduce_axes(cx, x, dim), keepdims=keepdim))
        return T(ops.compare(cx.b, "!=", r, cx.tensor(0, r)))
    return h


for _name, _kind in (("any", "max"), ("all", "min")):
    function(getattr(torch, _name))(_any_all(_kind))
    method(_name)(_any_all(_kind))
    aten(_name)(_any_all(_kind))


def _variance(cx: Ctx, x: T, dim: Any, correction: float, keepdim: bool) -> T:
    axes = _reduce_axes(cx, x, dim)
    n = 1
    for a in axes:
        n *= cx.shape(x)[a]
    mean = T(ops.reduce(cx.b, x, "mean", axes, keepdims=True))
    d = T(ops.sub(cx.b, x, mean))
    var = T(ops.reduce(cx.b, ops.mul(cx.b, d, d), "mean", axes, keepdims=keepdim))
    return var if correction == 0 else T(ops.scale(cx.b, var, n / max(n - correction, 0) if n > correction else float("inf")))


def _var_std(sqrt: bool) -> Handler:
    def h(cx: Ctx, x: T, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *, correction: Any = None) -> T:
        if isinstance(dim, bool):  # torch.var(x, unbiased)
            dim, unbiased = None, dim
        corr = float(correction) if correction is not None else (0.0 if unbiased is False else 1.0)
        v = _variance(cx, x, dim, corr, keepdim)
        return T(ops.unary(cx.b, "sqrt", v)) if sqrt else v
    return h


for _name, _sqrt in (("var", False), ("std", True)):
    function(getattr(torch, _name))(_var_std(_sqrt))
    method(_name)(_var_std(_sqrt))
    aten(f"{_name}.correction", f"{_name}.dim", f"{_name}.default")(_var_std(_sqrt))
