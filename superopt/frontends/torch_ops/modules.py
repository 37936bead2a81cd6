"""``nn.Module`` leaves (what ``symbolic_trace`` and Dynamo leave as ``call_module``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import nn

from superopt import ops
from superopt.frontends.torch_ops.attention import _f_mha
from superopt.frontends.torch_ops.context import FUNCTIONS, Ctx, T, module
from superopt.frontends.torch_ops.contraction import _conv2d, _conv_transpose, _convnd, _linear
from superopt.frontends.torch_ops.elementwise import _dropout, _leaky_relu
from superopt.frontends.torch_ops.movement import _flatten, _unflatten
from superopt.frontends.torch_ops.pool import _adaptive_avg_pool2d, _avg_pool2d, _max_pool2d
from superopt.frontends.torch_ops.recurrent import _gru, _lstm
from superopt.frontends.torch_ops.reduction import _bn, _layer_norm, _log_softmax, _rms_norm, _softmax


# =================================================================================================
# Modules (leaves of symbolic_trace)
# =================================================================================================
@module(nn.Linear)
def _m_linear(cx: Ctx, m: nn.Linear, x: T) -> T:
    return _linear(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"))


@module(nn.Conv2d)
def _m_conv2d(cx: Ctx, m: nn.Conv2d, x: T) -> T:
    if m.padding_mode != "zeros":
        raise cx.fail(f"Conv2d padding_mode={m.padding_mode!r} is not supported")
    return _conv2d(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), m.stride, m.padding,
                   m.dilation, m.groups)


@module(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def _m_batch_norm(cx: Ctx, m: nn.modules.batchnorm._BatchNorm, x: T) -> T:
    training = m.training or not m.track_running_stats or m.running_mean is None
    return _bn(cx, x, cx.param(m.running_mean, "running_mean"), cx.param(m.running_var, "running_var"),
               cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), training, m.eps)


@module(nn.LayerNorm)
def _m_layer_norm(cx: Ctx, m: nn.LayerNorm, x: T) -> T:
    return _layer_norm(cx, x, m.normalized_shape, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"),
                       m.eps)


if hasattr(nn, "RMSNorm"):
    @module(nn.RMSNorm)
    def _m_rms_norm(cx: Ctx, m: nn.Module, x: T) -> T:
        return _rms_norm(cx, x, m.normalized_shape, cx.param(m.weight, "weight"), m.eps)


@module(nn.ReLU)
def _m_relu(cx: Ctx, m: nn.Module, x: T) -> T:
    return T(ops.relu(cx.b, x))


@module(nn.GELU)
def _m_gelu(cx: Ctx, m: nn.GELU, x: T) -> T:
    return T(ops.gelu(cx.b, x, approximate=m.approximate))


@module(nn.SiLU)
def _m_silu(cx: Ctx, m: nn.Module, x: T) -> T:
    return T(ops.silu(cx.b, x))


@module(nn.Sigmoid)
def _m_sigmoid(cx: Ctx, m: nn.Module, x: T) -> T:
    return T(ops.sigmoid(cx.b, x))


@module(nn.Tanh)
def _m_tanh(cx: Ctx, m: nn.Module, x: T) -> T:
    return T(ops.tanh(cx.b, x))


@module(nn.ReLU6, nn.Hardtanh)
def _m_hardtanh(cx: Ctx, m: nn.Hardtanh, x: T) -> T:
    return T(ops.clip(cx.b, x, lo=m.min_val, hi=m.max_val))


@module(nn.LeakyReLU)
def _m_leaky_relu(cx: Ctx, m: nn.LeakyReLU, x: T) -> T:
    return _leaky_relu(cx, x, m.negative_slope)


@module(nn.Softmax)
def _m_softmax(cx: Ctx, m: nn.Softmax, x: T) -> T:
    return _softmax(cx, x, m.dim)


@module(nn.LogSoftmax)
def _m_log_softmax(cx: Ctx, m: nn.LogSoftmax, x: T) -> T:
    return _log_softmax(cx, x, m.dim)


@module(nn.MaxPool2d)
def _m_max_pool2d(cx: Ctx, m: nn.MaxPool2d, x: T) -> T:
    return _max_pool2d(cx, x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices)


@module(nn.AvgPool2d)
def _m_avg_pool2d(cx: Ctx, m: nn.AvgPool2d, x: T) -> T:
    return _avg_pool2d(cx, x, m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad,
                       m.divisor_override)


@module(nn.AdaptiveAvgPool2d)
def _m_adaptive_avg_pool2d(cx: Ctx, m: nn.AdaptiveAvgPool2d, x: T) -> T:
    return _adaptive_avg_pool2d(cx, x, m.output_size)


@module(nn.Flatten)
def _m_flatten(cx: Ctx, m: nn.Flatten, x: T) -> T:
    return _flatten(cx, x, m.start_dim, m.end_dim)


@module(nn.Unflatten)
def _m_unflatten(cx: Ctx, m: nn.Unflatten, x: T) -> T:
    return _unflatten(cx, x, m.dim, m.unflattened_size)


@module(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)
def _m_dropout(cx: Ctx, m: nn.modules.dropout._DropoutNd, x: T) -> T:
    return _dropout(cx, x, m.p, m.training)


@module(nn.Identity)
def _m_identity(cx: Ctx, m: nn.Module, x: T, *a: Any, **kw: Any) -> T:
    return x


@module(nn.MultiheadAttention)
def _m_mha(cx: Ctx, m: nn.MultiheadAttention, query: T, key: T, value: T,
           key_padding_mask: T | None = None, need_weights: bool = True, attn_mask: T | None = None,
           average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    batched = cx.rank(query) == 3
    if m.batch_first and batched:
        query, key, value = (cx.swap(t, 0, 1) for t in (query, key, value))
    p = cx.param
    out, w = _f_mha(cx, query, key, value, m.embed_dim, m.num_heads, p(m.in_proj_weight, "in_proj_weight"),
                    p(m.in_proj_bias, "in_proj_bias"), p(m.bias_k, "bias_k"), p(m.bias_v, "bias_v"),
                    m.add_zero_attn, m.dropout, p(m.out_proj.weight, "out_proj_weight"),
                    p(m.out_proj.bias, "out_proj_bias"), m.training, key_padding_mask, need_weights,
                    attn_mask, not m._qkv_same_embed_dim, p(m.q_proj_weight, "q_proj_weight"),
                    p(m.k_proj_weight, "k_proj_weight"), p(m.v_proj_weight, "v_proj_weight"),
                    None, None, average_attn_weights, is_causal)
    if m.batch_first and batched:
        out = cx.swap(out, 0, 1)
    return (out, w)


@module(nn.Conv1d, nn.Conv3d)
def _m_convnd(cx: Ctx, m: nn.modules.conv._ConvNd, x: T) -> T:
    if m.padding_mode != "zeros":
        raise cx.fail(f"{type(m).__name__} padding_mode={m.padding_mode!r} is not supported")
    return _convnd(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), m.stride, m.padding, m.dilation,
                   m.groups)


@module(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def _m_conv_transpose(cx: Ctx, m: nn.modules.conv._ConvTransposeNd, x: T, output_size: Any = None) -> T:
    if output_size is not None:
        raise cx.fail(f"{type(m).__name__}(output_size=...) is not supported")
    return _conv_transpose(cx, x, cx.param(m.weight, "weight"), cx.param(m.bias, "bias"), m.stride, m.padding,
                           m.output_padding, m.groups, m.dilation)


def _activation_module(fn: Any) -> Any:
    def h(cx: Ctx, m: nn.Module, x: T) -> T:
        return fn(cx, x)
    return h


module(nn.Hardswish)(_activation_module(lambda cx, x: FUNCTIONS[F.hardswish](cx, x)))
module(nn.Hardsigmoid)(_activation_module(lambda cx, x: FUNCTIONS[F.hardsigmoid](cx, x)))
module(nn.Mish)(_activation_module(lambda cx, x: FUNCTIONS[F.mish](cx, x)))
module(nn.SELU)(_activation_module(lambda cx, x: FUNCTIONS[F.selu](cx, x)))
module(nn.Softsign)(_activation_module(lambda cx, x: FUNCTIONS[F.softsign](cx, x)))
module(nn.ELU)(lambda cx, m, x: FUNCTIONS[F.elu](cx, x, m.alpha))
module(nn.CELU)(lambda cx, m, x: FUNCTIONS[F.celu](cx, x, m.alpha))
module(nn.Softplus)(lambda cx, m, x: FUNCTIONS[F.softplus](cx, x, m.beta, m.threshold))


@module(nn.LSTM, nn.GRU)
def _m_rnn(cx: Ctx, m: nn.RNNBase, x: T, hx: Any = None) -> Any:
    if getattr(m, "proj_size", 0):
        raise cx.fail("LSTM with proj_size is not supported")
    dirs = 2 if m.bidirectional else 1
    xs = cx.shape(x)
    batch = (xs[0] if m.batch_first else xs[1]) if len(xs) == 3 else None
    hshape = (m.num_layers * dirs, batch, m.hidden_size) if batch is not None else (m.num_layers * dirs, m.hidden_size)
    zeros = cx.const(np.zeros(hshape, dtype=cx.dtype(x)))
    params = [cx.param(w, "rnn_weight") for w in m._flat_weights]
    if isinstance(m, nn.LSTM):
        h0, c0 = hx if hx is not None else (zeros, zeros)
        out, h, c = _lstm(cx, x, (h0, c0), params, m.bias, m.num_layers, m.dropout, m.training, m.bidirectional,
                          m.batch_first)
        return out, (h, c)
    out, h = _gru(cx, x, hx if hx is not None else zeros, params, m.bias, m.num_layers, m.dropout, m.training,
                  m.bidirectional, m.batch_first)
    return out, h
