"""Matrix products, linear layers and convolutions."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, _ints, aten, function, method, need_op


# =================================================================================================
# Contractions
# =================================================================================================
@function(torch.matmul, operator.matmul, torch.bmm, torch.mm)
@method("matmul", "bmm", "mm", "__matmul__")
def _matmul(cx: Ctx, x: T, y: T) -> T:
    return T(ops.matmul(cx.b, x, y))


@function(F.linear)
def _linear(cx: Ctx, x: T, weight: T, bias: T | None = None) -> T:
    return T(ops.linear(cx.b, x, weight, bias))


@function(torch.addmm)
def _addmm(cx: Ctx, bias: T, x: T, y: T, *, beta: float = 1, alpha: float = 1) -> T:
    out = T(ops.matmul(cx.b, x, y))
    if alpha != 1:
        out = T(ops.scale(cx.b, out, alpha))
    if beta != 1:
        bias = T(ops.scale(cx.b, bias, beta))
    return T(ops.add(cx.b, out, bias))


def _conv_pads(cx: Ctx, padding: Any, weight: T, dilation: tuple[int, int],
               stride: tuple[int, int]) -> tuple[int, int, int, int]:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise cx.fail("padding='same' needs stride 1")
            kh, kw = cx.shape(weight)[2:]
            th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
            return (th // 2, tw // 2, th - th // 2, tw - tw // 2)
        raise cx.fail(f"unknown padding {padding!r}")
    ph, pw = _ints(padding, 2)
    return (ph, pw, ph, pw)


@function(F.conv2d)
def _conv2d(cx: Ctx, x: T, weight: T, bias: T | None = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> T:
    stride, dilation = _ints(stride, 2), _ints(dilation, 2)
    unbatched = cx.rank(x) == 3
    if unbatched:
        x = T(ops.unsqueeze(cx.b, x, [0]))
    pads = _conv_pads(cx, padding, weight, dilation, stride)
    out = T(ops.conv2d(cx.b, x, weight, bias, strides=stride, pads=pads, dilations=dilation, groups=groups))
    return cx.reshape(out, cx.shape(out)[1:]) if unbatched else out


def _nd_pads(cx: Ctx, padding: Any, weight: T, dilation: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    nd = len(stride)
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * (2 * nd)
        if padding == "same" and all(s == 1 for s in stride):
            total = [d * (k - 1) for d, k in zip(dilation, cx.shape(weight)[2:], strict=True)]
            return tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
        raise cx.fail(f"padding={padding!r} with stride {stride} is not supported")
    p = _ints(padding, nd)
    return p + p


@function(F.conv1d, F.conv3d)
def _convnd(cx: Ctx, x: T, weight: T, bias: T | None = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> T:
    nd = cx.rank(weight) - 2
    if nd == 2:
        return _conv2d(cx, x, weight, bias, stride, padding, dilation, groups)
    stride, dilation = _ints(stride, nd), _ints(dilation, nd)
    unbatched = cx.rank(x) == nd + 1
    if unbatched:
        x = T(ops.unsqueeze(cx.b, x, [0]))
    pads = _nd_pads(cx, padding, weight, dilation, stride)
    out = T(ops.convnd(cx.b, x, weight, bias, stride, pads, dilation, groups))
    return cx.reshape(out, cx.shape(out)[1:]) if unbatched else out


@function(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
def _conv_transpose(cx: Ctx, x: T, weight: T, bias: T | None = None, stride: Any = 1, padding: Any = 0,
                    output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> T:
    nd = cx.rank(weight) - 2
    unbatched = cx.rank(x) == nd + 1
    if unbatched:
        x = T(ops.unsqueeze(cx.b, x, [0]))
    p = _ints(padding, nd)
    out = T(need_op(cx, "conv_transpose", "conv_transpose")(
        cx.b, x, weight, bias, strides=_ints(stride, nd), pads=p + p, dilations=_ints(dilation, nd), groups=groups,
        output_padding=_ints(output_padding, nd)))
    return cx.reshape(out, cx.shape(out)[1:]) if unbatched else out


@function(torch.einsum)
def _einsum(cx: Ctx, equation: str, *operands: Any) -> T:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return T(need_op(cx, "einsum", "einsum")(cx.b, equation.replace(" ", ""), *[cx.tensor(o) for o in operands]))


aten("einsum")(lambda cx, equation, tensors, path=None: _einsum(cx, equation, *tensors))


aten("conv1d", "conv2d", "conv3d")(_convnd)
aten("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")(_conv_transpose)
