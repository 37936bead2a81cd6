"""Tensor creation from shapes (constants of the graph)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from superopt.frontends.torch_ops.context import Ctx, Handler, T, _dims, aten, function, ir_dtype, method


# =================================================================================================
# Tensor creation (shape-driven constants)
# =================================================================================================
def _filled(cx: Ctx, shape: Sequence[int], value: Any, dtype: Any) -> T:
    if dtype is None:
        dtype = torch.get_default_dtype() if isinstance(value, float) else (
            torch.bool if isinstance(value, bool) else torch.int64)
    return cx.const(np.full(tuple(int(s) for s in shape), value, dtype=ir_dtype(dtype)))


def _like(value: Any) -> Handler:
    def h(cx: Ctx, x: T, *, dtype: Any = None, **kw: Any) -> T:
        dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
        return _filled(cx, cx.shape(x), value, dt)
    return h


function(torch.zeros_like)(_like(0))
function(torch.ones_like)(_like(1))


@function(torch.full_like)
def _full_like(cx: Ctx, x: T, fill_value: Any, *, dtype: Any = None, **kw: Any) -> T:
    return _like(fill_value)(cx, x, dtype=dtype)


@method("new_zeros", "new_ones")
def _new_filled(cx: Ctx, x: T, *size: Any, dtype: Any = None, **kw: Any) -> T:
    dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
    return _filled(cx, _dims(size), 0 if cx.node.target == "new_zeros" else 1, dt)


@method("new_full")
def _new_full(cx: Ctx, x: T, size: Any, fill_value: Any, *, dtype: Any = None, **kw: Any) -> T:
    dt = dtype if dtype is not None else getattr(torch, cx.dtype(x))
    return _filled(cx, _dims([size]), fill_value, dt)


aten("zeros_like")(_like(0))
aten("ones_like")(_like(1))
aten("full_like")(_full_like)
