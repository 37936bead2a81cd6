"""ATen-level graphs (what aot_autograd and ``torch.export`` hand over): ``aten.*`` overloads."""

from __future__ import annotations

import operator
from typing import Any

import torch

from superopt import ops
from superopt.frontends.torch_ops.attention import _sdpa, _transformer_encoder_layer_fwd
from superopt.frontends.torch_ops.context import Ctx, T, _Missing, aten, ir_dtype
from superopt.frontends.torch_ops.contraction import _addmm, _conv_transpose, _convnd, _linear, _matmul
from superopt.frontends.torch_ops.elementwise import (
    _add,
    _clamp,
    _compare_fn,
    _div,
    _dropout,
    _floordiv,
    _gelu,
    _hardtanh,
    _identity,
    _leaky_relu,
    _masked_fill,
    _maximum,
    _minimum,
    _mul,
    _pow,
    _relu,
    _rsub,
    _sigmoid,
    _silu,
    _sub,
    _tanh,
    _type_as,
    _unary_fn,
    _where,
)
from superopt.frontends.torch_ops.movement import (
    _cat,
    _chunk,
    _expand,
    _expand_as,
    _flatten,
    _getitem,
    _narrow,
    _pad,
    _permute,
    _repeat_interleave,
    _reshape,
    _split,
    _squeeze,
    _stack,
    _t,
    _transpose,
    _unbind,
    _unflatten,
    _unsqueeze,
    _view_as,
)
from superopt.frontends.torch_ops.pool import _adaptive_avg_pool2d, _avg_pool2d, _max_pool2d
from superopt.frontends.torch_ops.reduction import (
    _bn,
    _layer_norm,
    _log_softmax,
    _reducer,
    _rms_norm,
    _softmax,
    _torch_batch_norm,
)

# =================================================================================================
# ATen-level graphs (what aot_autograd hands a forward compiler)
# =================================================================================================
aten("add")(_add)
aten("sub")(_sub)
aten("rsub")(_rsub)
aten("mul")(_mul)
aten("div")(_div)
aten("pow")(_pow)
aten("maximum")(_maximum)
aten("minimum")(_minimum)
aten("relu")(_relu)
aten("gelu")(_gelu)
aten("silu")(_silu)
aten("sigmoid")(_sigmoid)
aten("tanh")(_tanh)
aten("clamp", "clamp_min", "clamp_max")(_clamp)
aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")(_where)
aten("masked_fill")(_masked_fill)
for _fn in ("exp", "log", "sqrt", "rsqrt", "erf", "abs", "neg", "floor", "ceil", "reciprocal", "sin", "cos"):
    aten(_fn)(_unary_fn(_fn))
for _m, _op in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
    aten(_m)(_compare_fn(_op, getattr(operator, _m)))
aten("mm", "bmm", "matmul")(_matmul)
aten("addmm")(_addmm)
aten("linear")(_linear)
aten("t", "numpy_T")(_t)
aten("transpose.int")(_transpose)
aten("permute")(_permute)
aten("view.default", "_unsafe_view", "reshape")(_reshape)
aten("unsqueeze")(_unsqueeze)
aten("squeeze")(_squeeze)
aten("expand")(lambda cx, x, size, implicit=False: _expand(cx, x, size))
aten("cat")(_cat)
aten("stack")(_stack)
aten("split.Tensor", "split_with_sizes")(_split)
aten("unbind")(_unbind)
aten("clone", "alias", "detach", "contiguous", "lift_fresh_copy")(_identity)
aten("dropout")(lambda cx, x, p, train: _dropout(cx, x, p, train))
aten("softmax.int")(_softmax)
aten("_softmax")(lambda cx, x, dim, half_to_float: _softmax(cx, x, dim))
aten("_log_softmax")(lambda cx, x, dim, half_to_float: _log_softmax(cx, x, dim))
aten("log_softmax.int")(_log_softmax)
aten("mean.dim", "mean.default")(_reducer("mean"))
aten("sum.dim_IntList", "sum.default")(_reducer("sum"))
aten("amax")(_reducer("max"))
aten("amin")(_reducer("min"))
aten("prod.dim_int", "prod.default")(_reducer("prod"))
aten("layer_norm")(_layer_norm)
aten("scaled_dot_product_attention")(_sdpa)
aten("adaptive_avg_pool2d", "_adaptive_avg_pool2d")(_adaptive_avg_pool2d)
aten("avg_pool2d")(_avg_pool2d)
aten("max_pool2d")(_max_pool2d)
aten("_transformer_encoder_layer_fwd")(_transformer_encoder_layer_fwd)
aten("constant_pad_nd")(lambda cx, x, pad, value=0: _pad(cx, x, pad, "constant", value))


@aten("_to_copy", "to.dtype", "_to_dtype")
def _aten_to(cx: Ctx, x: T, dtype: Any = None, *a: Any, **kw: Any) -> T:
    dtype = kw.get("dtype", dtype) if isinstance(dtype, torch.dtype) or dtype is None else dtype
    return T(ops.cast(cx.b, x, ir_dtype(dtype))) if isinstance(dtype, torch.dtype) else x


@aten("slice.Tensor")
def _aten_slice(cx: Ctx, x: T, dim: int = 0, start: int | None = None, end: int | None = None,
                step: int = 1) -> T:
    d = cx.axis(dim, cx.rank(x))
    n = cx.shape(x)[d]
    start = 0 if start is None else max(min(start, n), -n)
    end = n if end is None else max(min(end, n), -n - 1)
    return cx.slice_axis(x, d, start, end, step)


@aten("select.int")
def _aten_select(cx: Ctx, x: T, dim: int, index: int) -> T:
    d = cx.axis(dim, cx.rank(x))
    s = cx.shape(x)
    return cx.reshape(cx.slice_axis(x, d, index % s[d], index % s[d] + 1), s[:d] + s[d + 1:])


@aten("convolution")
def _aten_convolution(cx: Ctx, x: T, weight: T, bias: T | None, stride: Any, padding: Any,
                      dilation: Any, transposed: bool, output_padding: Any, groups: int) -> T:
    if transposed:
        return _conv_transpose(cx, x, weight, bias, stride, padding, output_padding, groups, dilation)
    return _convnd(cx, x, weight, bias, stride, padding, dilation, groups)


@aten("_native_batch_norm_legit_no_training")
def _aten_bn_no_training(cx: Ctx, x: T, weight: T | None, bias: T | None, running_mean: T,
                         running_var: T, momentum: float, eps: float) -> tuple[Any, ...]:
    return (_bn(cx, x, running_mean, running_var, weight, bias, False, eps), _Missing("batch_norm save_mean"),
            _Missing("batch_norm save_invstd"))


@aten("native_layer_norm")
def _aten_native_layer_norm(cx: Ctx, x: T, normalized_shape: Any, weight: T | None, bias: T | None,
                            eps: float) -> tuple[Any, ...]:
    return (_layer_norm(cx, x, normalized_shape, weight, bias, eps), _Missing("layer_norm mean"),
            _Missing("layer_norm rstd"))


@aten("max_pool2d_with_indices")
def _aten_max_pool2d_with_indices(cx: Ctx, x: T, kernel_size: Any, stride: Any = (), padding: Any = 0,
                                  dilation: Any = 1, ceil_mode: bool = False) -> tuple[Any, ...]:
    out = _max_pool2d(cx, x, kernel_size, stride, padding, dilation, ceil_mode)
    return (out, _Missing("max_pool2d indices"))


@aten("_scaled_dot_product_flash_attention_for_cpu")
def _aten_sdpa_cpu(cx: Ctx, q: T, k: T, v: T, dropout_p: float = 0.0, is_causal: bool = False, *,
                   attn_mask: T | None = None, scale: float | None = None) -> tuple[Any, ...]:
    return (_sdpa(cx, q, k, v, attn_mask, dropout_p, is_causal, scale), _Missing("attention logsumexp"))


# the pre-decomposition level of torch.export programs (aten ops with the torch function signatures)
aten("batch_norm")(_torch_batch_norm)
aten("rms_norm")(_rms_norm)
aten("flatten.using_ints")(_flatten)
aten("unflatten")(_unflatten)
aten("chunk")(_chunk)
aten("narrow")(_narrow)
aten("floor_divide")(_floordiv)
aten("hardtanh")(_hardtanh)
aten("relu6")(lambda cx, x, inplace=False: _hardtanh(cx, x, 0.0, 6.0))
aten("leaky_relu")(_leaky_relu)
aten("type_as")(_type_as)
aten("sym_size.int")(lambda cx, x, dim: cx.shape(x)[cx.axis(dim, cx.rank(x))])
aten("pad")(lambda cx, x, pad, mode="constant", value=None: _pad(cx, x, pad, mode, value))
aten("repeat_interleave.self_int")(_repeat_interleave)
aten("view_as", "reshape_as")(_view_as)
aten("expand_as")(_expand_as)
aten("slice_copy.Tensor")(_aten_slice)
aten("view_copy", "_reshape_alias_copy")(lambda cx, x, size, *a: _reshape(cx, x, size))
aten("permute_copy")(_permute)
aten("transpose_copy.int")(_transpose)
aten("unsqueeze_copy")(_unsqueeze)
aten("squeeze_copy")(_squeeze)
aten("alias_copy", "detach_copy")(_identity)


@aten("index.Tensor")
def _aten_index(cx: Ctx, x: T, indices: Any) -> T:
    """``x[indices]`` with ``None`` for the axes taken whole (advanced indexing, as ``torch.export`` writes it)."""
    return _getitem(cx, x, tuple(slice(None) if i is None else i for i in indices))
