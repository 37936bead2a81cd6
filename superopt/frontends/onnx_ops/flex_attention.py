"""FlexAttention (``ai.onnx.preview``, version 1): scaled dot-product attention over (B, H, L, E) heads with
optional ``score_mod`` and ``prob_mod`` subgraphs, each imported by superopt's own importer and inlined on the
scores (after Q K^T * scale) and on the probabilities (after the softmax over the keys).

Grouped queries: with fewer K/V heads than query heads, query head h reads K/V head h // (Hq / Hkv). The
scores, softmax and product with V are computed in ``softmax_precision`` (float32 for float32 inputs, float64
for float64 ones), and the result is cast back to V's element type.
"""

from __future__ import annotations

import math

import onnx

from superopt import ops
from superopt.frontends.onnx_ops.attention import _repeat_heads
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx

DOMAIN = "ai.onnx.preview"
_PRECISION = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64"}


def _modifier(c: _Ctx, name: str, x: str, outer: list) -> str:
    """``x`` passed through the node's subgraph ``name`` (inlined), or ``x`` when the node has none."""
    from superopt.frontends.onnx_ops.control_flow import _subgraph, import_body, inline

    if not any(a.name == name for a in c.node.attribute):
        return x
    body, args = import_body(c, _subgraph(c, name), [x], outer, f"FlexAttention {name}")
    outs = inline(c.b, body, args)
    if len(outs) != 1 or tuple(c.b.shape(outs[0])) != tuple(c.b.shape(x)):
        raise OnnxImportError(f"FlexAttention {name} must give one tensor of the scores' shape {c.b.shape(x)}")
    return outs[0] if c.b.type(outs[0]).dtype == c.b.type(x).dtype else ops.cast(c.b, outs[0], c.b.type(x).dtype)


@_conv(f"{DOMAIN}.FlexAttention")
def _flex_attention(c: _Ctx, ins):
    from superopt.frontends.onnx_ops.control_flow import _split

    own, outer = _split(c, ins)
    q, k, v = own[:3]
    shapes = [tuple(c.b.shape(t)) for t in (q, k, v)]
    if any(len(s) != 4 for s in shapes):
        raise OnnxImportError(f"FlexAttention takes rank-4 Q, K, V, got shapes {shapes}")
    (bq, hq, _, e), (bk, hkv, s, ek), (bv, hv, sv, _) = shapes
    if bk != bq or bv != bq or hv != hkv or sv != s or ek != e or hkv <= 0 or hq % hkv:
        raise OnnxImportError(f"FlexAttention: Q, K, V shapes {shapes} do not fit (batch, heads as a multiple of the "
                              "K/V heads, key length, head size)")
    precision = c.attr("softmax_precision")
    dtype = c.b.type(q).dtype if precision is None else _PRECISION.get(int(precision))
    if dtype not in ("float32", "float64"):
        raise OnnxImportError(f"FlexAttention softmax_precision {precision} is not float or double")
    scale = c.attr("scale")
    scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
    q, k, v = (t if c.b.type(t).dtype == dtype else ops.cast(c.b, t, dtype) for t in (q, k, v))
    k, v = _repeat_heads(c, k, hq // hkv), _repeat_heads(c, v, hq // hkv)
    scores = ops.scale(c.b, ops.matmul(c.b, q, ops.transpose(c.b, k, [0, 1, 3, 2])), scale)
    scores = _modifier(c, "score_mod", scores, outer)
    probs = _modifier(c, "prob_mod", ops.softmax(c.b, scores, -1), outer)
    y = ops.matmul(c.b, probs, v)
    out_dtype = c.b.type(own[2]).dtype
    return y if c.b.type(y).dtype == out_dtype else ops.cast(c.b, y, out_dtype)
