"""Attention (opsets 23 to 25) and RotaryEmbedding (opset 23).

Attention runs as one ``scaled_dot_product_attention`` op where the attributes fit it (no softcap, no
qk_matmul_output, no per-batch cache lengths, a mask whose rows all keep a key); otherwise it is the
spec's graph spelled in ops: scores, softcap, additive bias (mask, causal and sliding-window terms,
offset by the cache), softmax with fully masked rows zeroed, weighted sum.
"""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit


def _to_heads(c: _Ctx, t: str, heads: int) -> str:
    """(B, S, H*D) -> (B, H, S, D)."""
    b_, s, hidden = c.b.shape(t)
    if heads <= 0 or hidden % heads:
        raise OnnxImportError(f"Attention: hidden size {hidden} does not split into {heads} heads")
    return ops.transpose(c.b, ops.reshape(c.b, t, [b_, s, heads, hidden // heads]), [0, 2, 1, 3])


def _repeat_heads(c: _Ctx, t: str, reps: int) -> str:
    """(B, H, S, D) -> (B, H*reps, S, D), each head repeated ``reps`` times in place (h0, h0, h1, h1, ...)."""
    if reps == 1:
        return t
    b_, h, s, d = c.b.shape(t)
    t = ops.expand(c.b, ops.reshape(c.b, t, [b_, h, 1, s, d]), [b_, h, reps, s, d])
    return ops.reshape(c.b, t, [b_, h * reps, s, d])


def _positions(q_len: int, kv_len: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(q_len).reshape(q_len, 1), np.arange(kv_len).reshape(1, kv_len)


def _static_bias(q_len: int, kv_len: int, causal: bool, offset: int, left: int, right: int) -> np.ndarray | None:
    """The causal and sliding-window terms for a cache of a known length (0 or -inf), or None if neither."""
    if not causal and left < 0 and right < 0:
        return None
    i, j = _positions(q_len, kv_len)
    allowed = np.ones((q_len, kv_len), bool)
    if causal:
        allowed &= j <= i + offset
    diff = i + offset - j
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return np.where(allowed, 0.0, -np.inf)


@_conv("Attention")
def _attention(c: _Ctx, x):
    b = c.b
    q, k, v = x[0], x[1], x[2]
    get = [x[i] if len(x) > i else None for i in range(7)]
    mask, past_k, past_v, nonpad = get[3], get[4], get[5], get[6]
    rank = len(b.shape(q))
    dt = b.type(q).dtype
    if rank == 3:
        hq, hkv = c.attr("q_num_heads"), c.attr("kv_num_heads")
        if hq is None or hkv is None:
            raise OnnxImportError("Attention with 3-D inputs needs q_num_heads and kv_num_heads")
        q, k, v = _to_heads(c, q, hq), _to_heads(c, k, hkv), _to_heads(c, v, hkv)
    elif rank != 4:
        raise OnnxImportError(f"Attention needs 3-D or 4-D inputs, got rank {rank}")
    if (past_k is None) != (past_v is None):
        raise OnnxImportError("Attention: past_key and past_value must come together")
    past_len = b.shape(past_k)[2] if past_k is not None else 0
    if past_k is not None:
        k, v = ops.concat(b, [past_k, k], 2), ops.concat(b, [past_v, v], 2)
    present_k, present_v = k, v
    bsz, hq, q_len, head = b.shape(q)
    hkv, kv_len = b.shape(k)[1], b.shape(k)[2]
    if hq != hkv:
        if hq % hkv or b.shape(v)[1] != hkv:
            raise OnnxImportError(f"Attention: {hq} query heads do not group over {hkv} key/value heads")
        k, v = _repeat_heads(c, k, hq // hkv), _repeat_heads(c, v, hq // hkv)
    scale = c.attr("scale")
    scale = 1.0 / float(np.sqrt(head)) if scale is None else float(scale)
    causal = bool(c.attr("is_causal", 0))
    softcap = float(c.attr("softcap", 0.0) or 0.0)
    mode = int(c.attr("qk_matmul_output_mode", 0))
    left, right = int(c.attr("left_window_size", -1)), int(c.attr("right_window_size", -1))
    want_qk = len(c.node.output) > 3 and bool(c.node.output[3])

    # the additive bias: the mask (bool -> 0 / -inf, padded to the cache length), causal and window terms
    terms: list[str] = []
    if mask is not None:
        ms = b.shape(mask)
        is_bool = b.type(mask).dtype == "bool"
        if ms[-1] < kv_len:
            pads = [0] * len(ms) + [0] * (len(ms) - 1) + [kv_len - ms[-1]]
            mask = ops.pad(b, mask, pads, 0.0 if is_bool else -np.inf)
        terms.append(ewise(b, f"where({{0}}, {lit(0.0)}, (-inf))", [mask], "mask_bias") if is_bool else mask)
    if nonpad is None:
        sb = _static_bias(q_len, kv_len, causal, past_len, left, right)
        if sb is not None:
            terms.append(b.constant(sb.astype(dt), dtype=dt))
    else:  # per-batch cache lengths: the frontier is nonpad[b] - q_len, and keys at or past nonpad[b] are padding
        if past_k is not None:
            raise OnnxImportError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
        i, j = _positions(q_len, kv_len)
        iv, jv = (b.constant(a.reshape(1, 1, *a.shape).astype(np.int64), dtype="int64") for a in (i, j))
        off = ops.reshape(b, ops.cast(b, nonpad, "int64"), [bsz, 1, 1, 1])
        conds = ["{2} < {0}"]  # j < nonpad
        if causal:
            conds.append("{2} <= {1} + {0} - " + str(q_len))
        if left >= 0:
            conds.append(f"{{1}} + {{0}} - {q_len} - {{2}} <= {left}")
        if right >= 0:
            conds.append(f"{{2}} - ({{1}} + {{0}} - {q_len}) <= {right}")
        cond = conds[0]
        for extra in conds[1:]:
            cond = f"and({cond}, {extra})"
        operands = [off, jv] + ([iv] if "{1}" in cond else [])
        cond = cond.replace("{2}", "{J}").replace("{1}", "{2}").replace("{J}", "{1}")  # operands: off, j, i
        terms.append(ewise(b, f"cast_{dt}(where({cond}, 0.0, (-inf)))", operands, "kv_padding_bias"))
    bias = None
    for t in terms:
        bias = t if bias is None else ops.add(b, bias, t)

    bias_const = None if bias is None else b.const_value(bias)
    no_empty_rows = bias is None or (bias_const is not None and not np.isneginf(bias_const.max(axis=-1)).any())
    if not softcap and not want_qk and no_empty_rows:
        y = ops.scaled_dot_product_attention(b, q, k, v, bias, False, scale)
    else:
        scores = ops.scale(b, ops.matmul(b, q, ops.transpose(b, k, [0, 1, 3, 2])), scale)
        if softcap > 0:
            scores = ewise(b, f"{lit(softcap)} * tanh({{0}} / {lit(softcap)})", [scores], "softcap")
        qk_out = scores
        biased = scores if bias is None else ops.add(b, scores, bias)
        if mode == 2:
            qk_out = biased
        probs = ops.softmax(b, biased, -1)
        if not no_empty_rows:  # rows whose every key is masked give 0, not NaN
            empty = ops.reduce(b, bias, "max", [-1], keepdims=True)
            probs = ewise(b, "where({1} == (-inf), 0.0, {0})", [probs, empty], "masked_rows")
        if mode == 3:
            qk_out = probs
        elif mode not in (0, 1, 2):
            raise OnnxImportError(f"Attention qk_matmul_output_mode {mode} is not one of 0..3")
        y = ops.matmul(b, probs, v)
        if want_qk:
            if rank == 3:
                y = ops.reshape(b, ops.transpose(b, y, [0, 2, 1, 3]), [bsz, q_len, -1])
            return [y, present_k, present_v, qk_out]
    if rank == 3:
        y = ops.reshape(b, ops.transpose(b, y, [0, 2, 1, 3]), [bsz, q_len, -1])
    return [y, present_k, present_v]


@_conv("RotaryEmbedding")
def _rotary_embedding(c: _Ctx, x):
    """Rotate pairs (first/second halves, or even/odd when ``interleaved``) of the first
    ``rotary_embedding_dim`` features by the cached angles; inputs (B, S, H*D) or (B, H, S, D)."""
    b = c.b
    t, cos, sin = x[0], x[1], x[2]
    pos = x[3] if len(x) > 3 else None
    shape = b.shape(t)
    if len(shape) == 4:
        t = ops.transpose(b, t, [0, 2, 1, 3])  # (B, S, H, D)
    elif len(shape) == 3:
        heads = int(c.attr("num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise OnnxImportError(f"RotaryEmbedding with 3-D input needs num_heads dividing {shape[2]}")
        t = ops.reshape(b, t, [shape[0], shape[1], heads, shape[2] // heads])
    else:
        raise OnnxImportError(f"RotaryEmbedding needs a 3-D or 4-D input, got shape {shape}")
    bsz, seq, heads, head = b.shape(t)
    rot = int(c.attr("rotary_embedding_dim", 0)) or head
    half = rot // 2
    if pos is not None:
        cos, sin = ops.gather(b, cos, pos, 0), ops.gather(b, sin, pos, 0)
    if b.shape(cos)[-1] != half or b.shape(sin)[-1] != half:
        raise OnnxImportError(f"RotaryEmbedding: cos/sin caches must end in {half}, got {b.shape(cos)}")
    cos = ops.unsqueeze(b, cos, [len(b.shape(cos)) - 1])  # (B, S, 1, half)
    sin = ops.unsqueeze(b, sin, [len(b.shape(sin)) - 1])
    if c.attr("interleaved", 0):
        pairs = ops.reshape(b, ops.slice_(b, t, [0], [rot], [3]), [bsz, seq, heads, half, 2])
        x1, x2 = (ops.reshape(b, p, [bsz, seq, heads, half]) for p in ops.split(b, pairs, 4, [1, 1]))
    else:
        x1, x2 = ops.slice_(b, t, [0], [half], [3]), ops.slice_(b, t, [half], [rot], [3])
    real = ewise(b, "{2} * {0} - {3} * {1}", [x1, x2, cos, sin], "rotary_real")
    imag = ewise(b, "{3} * {0} + {2} * {1}", [x1, x2, cos, sin], "rotary_imag")
    if c.attr("interleaved", 0):
        rotated = ops.reshape(b, ops.concat(b, [ops.unsqueeze(b, real, [4]), ops.unsqueeze(b, imag, [4])], 4),
                              [bsz, seq, heads, rot])
    else:
        rotated = ops.concat(b, [real, imag], 3)
    out = rotated if rot == head else ops.concat(b, [rotated, ops.slice_(b, t, [rot], [head], [3])], 3)
    if len(shape) == 3:
        return ops.reshape(b, out, shape)
    return ops.transpose(b, out, [0, 2, 1, 3])


@_conv("LinearAttention")
def _linear_attention(c: _Ctx, x):
    """The recurrent state S (B, H_kv, d_k, d_v) unrolled over time (opset 28): S *= exp(decay) (gated rules),
    v <- beta * (v - S^T k) (delta rules), S += k v^T, output scale * q S (S shared across a group of query heads)."""
    b = c.b
    q, k, v = x[0], x[1], x[2]
    past, decay, beta = (x[i] if len(x) > i else None for i in (3, 4, 5))
    rule = str(c.attr("update_rule", "gated_delta"))
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise OnnxImportError(f"LinearAttention update_rule {rule!r} is not supported")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise OnnxImportError(f"LinearAttention update_rule {rule!r} does not fit the decay/beta inputs given")
    hq, hkv = c.attr("q_num_heads"), c.attr("kv_num_heads")
    if hq is None or hkv is None or hq % hkv:
        raise OnnxImportError("LinearAttention needs q_num_heads, a multiple of kv_num_heads")
    bsz, steps, _ = b.shape(q)
    q4, k4, v4 = _to_heads(c, q, hq), _to_heads(c, k, hkv), _to_heads(c, v, hkv)
    dk, dv = b.shape(k4)[3], b.shape(v4)[3]
    scale = c.attr("scale")
    scale = 1.0 / float(np.sqrt(dk)) if not scale else float(scale)
    dt = b.type(q).dtype
    if decay is not None:
        last = b.shape(decay)[2]
        if last == hkv:
            decay = ops.transpose(b, ops.reshape(b, decay, [bsz, steps, hkv, 1]), [0, 2, 1, 3])
        else:
            decay = _to_heads(c, decay, hkv)  # (B, H_kv, T, d_k)
    if beta is not None:
        hb = b.shape(beta)[2]
        beta = ops.transpose(b, ops.reshape(b, beta, [bsz, steps, hb, 1]), [0, 2, 1, 3])  # (B, Hb, T, 1)
    state = past if past is not None else b.constant(np.zeros((bsz, hkv, dk, dv), dt), dtype=dt)
    state_dt = b.type(state).dtype
    state = ops.cast(b, state, dt)

    def at(t4: str, i: int) -> str:  # (B, H, T, D) -> (B, H, D) at step i
        s = b.shape(t4)
        return ops.reshape(b, ops.slice_(b, t4, [i], [i + 1], [2]), [s[0], s[1], s[3]])

    outs = []
    for i in range(steps):
        k_t, v_t = at(k4, i), at(v4, i)
        if gating:
            g = at(decay, i)
            state = ewise(b, "{0} * exp({1})", [state, ops.unsqueeze(b, g, [3])], "decay")
        if delta:
            retrieved = ops.einsum(b, "bhdm,bhd->bhm", state, k_t)
            v_t = ewise(b, "{2} * ({0} - {1})", [v_t, retrieved, at(beta, i)], "delta")
        state = ewise(b, "{0} + {1} * {2}", [state, ops.unsqueeze(b, k_t, [3]), ops.unsqueeze(b, v_t, [2])], "write")
        read = _repeat_heads(c, state, hq // hkv)
        o = ops.scale(b, ops.einsum(b, "bhd,bhdm->bhm", at(q4, i), read), scale)
        outs.append(ops.unsqueeze(b, o, [2]))
    y = ops.concat(b, outs, 2) if len(outs) > 1 else outs[0]  # (B, H_q, T, d_v)
    y = ops.reshape(b, ops.transpose(b, y, [0, 2, 1, 3]), [bsz, steps, hq * dv])
    return [y, ops.cast(b, state, state_dt)]
