"""Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, in index notation.

The class pick ``input[n, target[n, d...], d...]`` is a reduction over the class axis that keeps the one
class equal to the target (``where(T == c, ...)``): data-dependent indexing without an extern, so the
optimizer sees the whole loss.
"""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import dims, ewise, idx, lit


def _nll(c: _Ctx, logp: str, target: str, weight: str | None) -> str:
    """-logp[n, t, d...] * w[t] per element (0 where t is ignore_index), reduced as ``reduction`` says."""
    xs, ts = c.b.shape(logp), c.b.shape(target)
    if len(xs) < 2 or ts != (xs[0], *xs[2:]):
        raise OnnxImportError(f"{c.node.op_type}: input {xs} and target {ts} do not fit (N, C, d...) / (N, d...)")
    if c.b.type(target).dtype not in ("int32", "int64"):
        raise OnnxImportError(f"{c.node.op_type}: target must be int32 or int64, got {c.b.type(target).dtype}")
    reduction = str(c.attr("reduction", "mean"))
    if reduction not in ("none", "sum", "mean"):
        raise OnnxImportError(f"{c.node.op_type} reduction {reduction!r} is not one of none, sum, mean")
    dt = c.b.type(logp).dtype
    ds = dims(len(ts), "i")
    xi = idx([ds[0], "c", *ds[1:]])
    t_read = f"T[{idx(ds)}]"
    inputs = {"X": logp, "T": target}
    if weight is not None:
        inputs["W"] = weight
        lines = [f"P[{idx(ds)}] += where({t_read} == c, X[{xi}] * W[c], 0.0)",
                 f"Q[{idx(ds)}] += where({t_read} == c, W[c], 0.0)"]
        outs = ["P", "Q"]
    else:
        lines = [f"P[{idx(ds)}] += where({t_read} == c, X[{xi}], 0.0)"]
        outs = ["P"]
    ext = dict(zip(ds, ts, strict=True)) | {"c": xs[1]}
    picked = c.b.compute("\n".join(lines), inputs, "nll_pick", extents=ext, outputs=outs)
    ii = c.attr("ignore_index")
    keep = "1.0" if ii is None else f"where({{1}} == {lit(int(ii))}, 0.0, 1.0)"
    loss = ewise(c.b, f"cast_{dt}(-{{0}} * {keep})", [picked[0]] + ([target] if ii is not None else []), "nll")
    if reduction == "none":
        return loss
    total = ops.reduce(c.b, loss, "sum", None, keepdims=False)
    if reduction == "sum":
        return total
    if weight is None and ii is None:
        return ops.scale(c.b, total, 1.0 / int(np.prod(ts, dtype=np.int64)))
    if weight is None:  # the count of targets not ignored
        per = ewise(c.b, f"cast_{dt}({keep.replace('{1}', '{0}')})", [target], "nll_weight")
    elif ii is None:
        per = picked[1]
    else:
        per = ewise(c.b, f"cast_{dt}({{0}} * {keep})", [picked[1], target], "nll_weight")
    return ops.div(c.b, total, ops.reduce(c.b, per, "sum", None, keepdims=False))


@_conv("NegativeLogLikelihoodLoss")
def _nll_loss(c: _Ctx, x):
    return _nll(c, x[0], x[1], x[2] if len(x) > 2 else None)


@_conv("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(c: _Ctx, x):
    """NLL of log_softmax over the class axis 1; the second output is that log_softmax."""
    logp = ops.log_softmax(c.b, x[0], 1)
    loss = _nll(c, logp, x[1], x[2] if len(x) > 2 else None)
    return [loss, logp] if len(c.node.output) > 1 and c.node.output[1] else [loss]
