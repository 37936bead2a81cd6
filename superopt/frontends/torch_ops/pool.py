"""Pooling."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, _ints, function


# =================================================================================================
# Pooling
# =================================================================================================
def _pool_args(kernel: Any, stride: Any, padding: Any, dilation: Any = 1):
    k = _ints(kernel, 2)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _ints(stride, 2)
    ph, pw = _ints(padding, 2)
    return k, s, (ph, pw, ph, pw), _ints(dilation, 2)


@function(F.max_pool2d, torch.max_pool2d, getattr(F, "max_pool2d_with_indices", None))
def _max_pool2d(cx: Ctx, x: T, kernel_size: Any, stride: Any = None, padding: Any = 0,
                dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> T:
    if return_indices:
        raise cx.fail("max_pool2d with return_indices=True is not supported")
    k, s, p, d = _pool_args(kernel_size, stride, padding, dilation)
    return T(ops.max_pool2d(cx.b, x, k, s, pads=p, dilations=d, ceil_mode=ceil_mode))


@function(F.avg_pool2d, torch._C._nn.avg_pool2d)
def _avg_pool2d(cx: Ctx, x: T, kernel_size: Any, stride: Any = None, padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> T:
    if divisor_override is not None:
        raise cx.fail("avg_pool2d divisor_override is not supported")
    k, s, p, _ = _pool_args(kernel_size, stride, padding)
    return T(ops.avg_pool2d(cx.b, x, k, s, pads=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad))


@function(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(cx: Ctx, x: T, output_size: Any) -> T:
    h, w = cx.shape(x)[-2:]
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    oh = h if output_size[0] is None else output_size[0]
    ow = w if output_size[1] is None else output_size[1]
    if (oh, ow) == (1, 1):
        return T(ops.reduce(cx.b, x, "mean", [cx.rank(x) - 2, cx.rank(x) - 1], keepdims=True))
    return T(ops.adaptive_avg_pool2d(cx.b, x, (int(oh), int(ow))))
