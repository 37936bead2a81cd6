"""Attention: scaled_dot_product_attention, multi-head attention, the encoder-layer fast path."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, T, function


# =================================================================================================
# Attention
# =================================================================================================
def _bool_mask_to_additive(cx: Ctx, mask: T, like: T, true_means_masked: bool) -> T:
    neg = cx.tensor(float("-inf"), like)
    zero = cx.tensor(0.0, like)
    return T(ops.where(cx.b, mask, neg, zero) if true_means_masked else ops.where(cx.b, mask, zero, neg))


@function(F.scaled_dot_product_attention)
def _sdpa(cx: Ctx, q: T, k: T, v: T, attn_mask: T | None = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> T:
    if dropout_p > 0:
        raise cx.fail("scaled_dot_product_attention with dropout_p > 0 is not supported")
    if enable_gqa and cx.rank(q) >= 3 and cx.shape(q)[-3] != cx.shape(k)[-3]:
        k, v = _repeat_heads(cx, k, cx.shape(q)[-3]), _repeat_heads(cx, v, cx.shape(q)[-3])
    return T(ops.scaled_dot_product_attention(cx.b, q, k, v, mask=attn_mask, is_causal=is_causal,
                                              scale=scale))


def _repeat_heads(cx: Ctx, x: T, heads: int) -> T:
    """(..., Hkv, S, E) -> (..., heads, S, E), each kv head repeated heads/Hkv times (torch's enable_gqa)."""
    *lead, hk, s, e = cx.shape(x)
    if heads % hk:
        raise cx.fail(f"enable_gqa: {heads} query heads are not a multiple of {hk} key/value heads")
    g = heads // hk
    y = T(ops.expand(cx.b, cx.reshape(x, (*lead, hk, 1, s, e)), (*lead, hk, g, s, e)))
    return cx.reshape(y, (*lead, heads, s, e))


def _mha_core(cx: Ctx, query: T, key: T, value: T, num_heads: int, wq: T, wk: T, wv: T,
              bq: T | None, bk: T | None, bv: T | None, out_w: T, out_b: T | None,
              key_padding_mask: T | None, need_weights: bool, attn_mask: T | None,
              average_attn_weights: bool, is_causal: bool, batch_first: bool = False) -> tuple[T, T | None]:
    """Multi-head attention on seq-first (L, N, E) inputs (batch-first (N, L, E) with ``batch_first``); returns
    (the output in the same layout, weights or None)."""
    b = cx.b
    if batch_first:
        N, L, E = cx.shape(query)
        S = cx.shape(key)[1]
    else:
        L, N, E = cx.shape(query)
        S = cx.shape(key)[0]
    H = num_heads
    hd = E // H

    def heads(x: T, w: T, bias: T | None, n: int) -> T:  # (n, N, E) or (N, n, E) -> (N, H, n, hd)
        y = T(ops.linear(b, x, w, bias))
        if batch_first:
            return cx.transpose(cx.reshape(y, (N, n, H, hd)), (0, 2, 1, 3))
        return cx.transpose(cx.reshape(y, (n, N, H, hd)), (1, 2, 0, 3))

    q, k, v = heads(query, wq, bq, L), heads(key, wk, bk, S), heads(value, wv, bv, S)
    mask = None
    if attn_mask is not None:  # (L, S) or (N*H, L, S); bool: True = masked
        m = attn_mask
        if cx.dtype(m) == "bool":
            m = _bool_mask_to_additive(cx, m, q, true_means_masked=True)
        if cx.rank(m) == 3:
            m = cx.reshape(m, (N, H, L, S))
        mask = m
    elif is_causal:
        causal = np.triu(np.full((L, S), -np.inf, np.float32), 1)
        mask = cx.const(causal.astype(cx.dtype(q)))
    if key_padding_mask is not None:  # (N, S)
        kp = key_padding_mask
        if cx.dtype(kp) == "bool":
            kp = _bool_mask_to_additive(cx, kp, q, true_means_masked=True)
        kp = cx.reshape(kp, (N, 1, 1, S))
        mask = kp if mask is None else T(ops.add(b, mask, kp))
    weights = None
    if need_weights:
        scores = T(ops.matmul(b, q, cx.transpose(k, (0, 1, 3, 2))))
        scores = T(ops.scale(b, scores, 1.0 / math.sqrt(hd)))
        if mask is not None:
            scores = T(ops.add(b, scores, mask))
        p = T(ops.softmax(b, scores, axis=-1))
        o = T(ops.matmul(b, p, v))
        weights = T(ops.reduce(b, p, "mean", [1], keepdims=False)) if average_attn_weights else p
    else:
        o = T(ops.scaled_dot_product_attention(b, q, k, v, mask=mask, is_causal=False, scale=None))
    if batch_first:
        o = cx.reshape(cx.transpose(o, (0, 2, 1, 3)), (N, L, E))
    else:
        o = cx.reshape(cx.transpose(o, (2, 0, 1, 3)), (L, N, E))
    return T(ops.linear(b, o, out_w, out_b)), weights


@function(F.multi_head_attention_forward)
def _f_mha(cx: Ctx, query: T, key: T, value: T, embed_dim_to_check: int, num_heads: int,
           in_proj_weight: T | None, in_proj_bias: T | None, bias_k: T | None, bias_v: T | None,
           add_zero_attn: bool, dropout_p: float, out_proj_weight: T, out_proj_bias: T | None,
           training: bool = True, key_padding_mask: T | None = None, need_weights: bool = True,
           attn_mask: T | None = None, use_separate_proj_weight: bool = False, q_proj_weight: T | None = None,
           k_proj_weight: T | None = None, v_proj_weight: T | None = None, static_k: T | None = None,
           static_v: T | None = None, average_attn_weights: bool = True, is_causal: bool = False) -> Any:
    if add_zero_attn or any(t is not None for t in (bias_k, bias_v, static_k, static_v)):
        raise cx.fail("multi-head attention with bias_k/bias_v/add_zero_attn/static_k/static_v "
                      "is not supported")
    if training and dropout_p > 0:
        raise cx.fail("multi-head attention dropout in training mode is not supported (call model.eval())")
    E = embed_dim_to_check
    if use_separate_proj_weight:
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        wq, wk, wv = (cx.slice_axis(in_proj_weight, 0, i * E, (i + 1) * E) for i in range(3))
    bq = bk = bv = None
    if in_proj_bias is not None:
        bq, bk, bv = (cx.slice_axis(in_proj_bias, 0, i * E, (i + 1) * E) for i in range(3))
    unbatched = cx.rank(query) == 2
    if unbatched:
        query, key, value = (cx.reshape(t, (cx.shape(t)[0], 1, cx.shape(t)[1])) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = cx.reshape(key_padding_mask, (1, *cx.shape(key_padding_mask)))
    out, w = _mha_core(cx, query, key, value, num_heads, wq, wk, wv, bq, bk, bv, out_proj_weight,
                       out_proj_bias, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                       is_causal)
    if unbatched:
        out = cx.reshape(out, (cx.shape(out)[0], cx.shape(out)[2]))
        if w is not None:
            w = cx.reshape(w, cx.shape(w)[1:])
    return (out, w)


@function(getattr(torch, "_transformer_encoder_layer_fwd", None))
def _transformer_encoder_layer_fwd(cx: Ctx, src: T, embed_dim: int, num_heads: int, qkv_weight: T,
                                   qkv_bias: T | None, proj_weight: T, proj_bias: T | None, use_gelu: bool,
                                   norm_first: bool, eps: float, norm_weight_1: T, norm_bias_1: T,
                                   norm_weight_2: T, norm_bias_2: T, ffn_weight_1: T, ffn_bias_1: T | None,
                                   ffn_weight_2: T, ffn_bias_2: T | None, mask: T | None = None,
                                   mask_type: int | None = None) -> T:
    """nn.TransformerEncoderLayer's inference fast path (batch-first src), which Dynamo sees under no_grad."""
    b = cx.b
    if cx.rank(src) != 3:
        raise cx.fail("the encoder-layer fast path needs a batched (N, L, E) input")
    n, length, _ = cx.shape(src)
    attn_mask = kpm = None
    if mask is not None:
        if mask_type == 1 or (mask_type == 2 and cx.rank(mask) == 2 and cx.shape(mask)[0] == n != length):
            kpm = mask
        elif cx.rank(mask) in (2, 4):  # (L, S), or merged (N, H, L, S)
            attn_mask = mask
        else:
            raise cx.fail(f"encoder-layer mask of shape {cx.shape(mask)} (mask_type {mask_type}) "
                          "is not supported")
    E = embed_dim
    wq, wk, wv = (cx.slice_axis(qkv_weight, 0, i * E, (i + 1) * E) for i in range(3))
    bq = bk = bv = None
    if qkv_bias is not None:
        bq, bk, bv = (cx.slice_axis(qkv_bias, 0, i * E, (i + 1) * E) for i in range(3))

    def attn(x: T) -> T:
        out, _ = _mha_core(cx, x, x, x, num_heads, wq, wk, wv, bq, bk, bv, proj_weight, proj_bias, kpm,
                           False, attn_mask, True, False, batch_first=True)
        return out

    def ffn(x: T) -> T:
        h = T(ops.linear(b, x, ffn_weight_1, ffn_bias_1))
        h = T(ops.gelu(b, h)) if use_gelu else T(ops.relu(b, h))
        return T(ops.linear(b, h, ffn_weight_2, ffn_bias_2))

    def ln(x: T, w: T, bias: T) -> T:
        return T(ops.layer_norm(b, x, w, bias, axis=-1, eps=eps))

    x = src
    if norm_first:
        x = T(ops.add(b, x, attn(ln(x, norm_weight_1, norm_bias_1))))
        return T(ops.add(b, x, ffn(ln(x, norm_weight_2, norm_bias_2))))
    x = ln(T(ops.add(b, x, attn(x))), norm_weight_1, norm_bias_1)
    return ln(T(ops.add(b, x, ffn(x))), norm_weight_2, norm_bias_2)
