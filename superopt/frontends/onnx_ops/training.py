"""The optimizers of ONNX's training domain (``ai.onnx.preview.training``, version 1): Adagrad, Momentum and
Adam, elementwise updates of each (X, G, state...) group by a learning rate R and an update count T.

Inputs are R, T, then the n tensors X_1..X_n, their gradients G_1..G_n and each state tensor's n values;
outputs are the new X_1..X_n then each new state's n values. The formulas are the ONNX spec's.
"""

from __future__ import annotations

from superopt import ops
from superopt.frontends.onnx_ops.context import OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit

DOMAIN = "ai.onnx.preview.training"


def _groups(c: _Ctx, x: list, states: int) -> tuple[str, str, list[list[str]]]:
    """R, T as float32 scalars and the per-tensor groups [X, G, state...]."""
    if len(x) < 2 or (len(x) - 2) % (2 + states):
        raise OnnxImportError(f"{c.node.op_type} takes R, T and {2 + states} tensors per updated tensor, "
                              f"got {len(x)} inputs")
    n = (len(x) - 2) // (2 + states)
    r = x[0] if c.b.type(x[0]).dtype == "float32" else ops.cast(c.b, x[0], "float32")
    t = ops.cast(c.b, x[1], "float32")
    return r, t, [[x[2 + k * n + i] for k in range(2 + states)] for i in range(n)]


def _regularized(c: _Ctx, xt: str, g: str) -> str:
    return ewise(c.b, f"{lit(float(c.attr('norm_coefficient', 0.0)))} * {{0}} + {{1}}", [xt, g], "g_regularized")


@_conv(f"{DOMAIN}.Adagrad")
def _adagrad(c: _Ctx, x):
    """r = R / (1 + T * decay_factor); H' = H + g^2; X' = X - r * g / (sqrt(H') + epsilon), g = norm_coefficient*X + G."""
    r, t, groups = _groups(c, x, 1)
    rate = ewise(c.b, f"{{0}} / (1.0 + {{1}} * {lit(float(c.attr('decay_factor', 0.0)))})", [r, t], "adagrad_rate")
    eps = lit(float(c.attr("epsilon", 1e-6)))
    xs, hs = [], []
    for xt, g, h in groups:
        gr = _regularized(c, xt, g)
        h_new = ewise(c.b, "{0} + {1} * {1}", [h, gr], "adagrad_h")
        xs.append(ewise(c.b, f"{{0}} - {{1}} * {{2}} / (sqrt({{3}}) + {eps})", [xt, rate, gr, h_new], "adagrad_x"))
        hs.append(h_new)
    return xs + hs


@_conv(f"{DOMAIN}.Momentum")
def _momentum(c: _Ctx, x):
    """V' = alpha * V + b * g (b = beta, or 1 at the first update T = 0); X' = X - R * V' (standard) or
    X - R * (g + alpha * V') (nesterov), g = norm_coefficient * X + G."""
    r, t, groups = _groups(c, x, 1)
    mode = str(c.attr("mode", "standard"))
    if mode not in ("standard", "nesterov"):
        raise OnnxImportError(f"Momentum mode {mode!r} is not one of standard, nesterov")
    alpha, beta = lit(float(c.attr("alpha"))), lit(float(c.attr("beta")))
    xs, vs = [], []
    for xt, g, v in groups:
        gr = _regularized(c, xt, g)
        v_new = ewise(c.b, f"{alpha} * {{0}} + where({{1}} > 0.0, {beta}, 1.0) * {{2}}", [v, t, gr], "momentum_v")
        if mode == "standard":
            xs.append(ewise(c.b, "{0} - {1} * {2}", [xt, r, v_new], "momentum_x"))
        else:
            xs.append(ewise(c.b, f"{{0}} - {{1}} * ({{3}} + {alpha} * {{2}})", [xt, r, v_new, gr], "nesterov_x"))
        vs.append(v_new)
    return xs + vs


@_conv(f"{DOMAIN}.Adam")
def _adam(c: _Ctx, x):
    """V' = alpha V + (1 - alpha) g; H' = beta H + (1 - beta) g^2; r = R sqrt(1 - beta^T) / (1 - alpha^T) for T > 0
    (R at T = 0); X' = (1 - norm_coefficient_post) (X - r V' / (sqrt(H') + epsilon)), g = norm_coefficient X + G."""
    r, t, groups = _groups(c, x, 2)
    a, bt = float(c.attr("alpha", 0.9)), float(c.attr("beta", 0.999))
    eps, post = lit(float(c.attr("epsilon", 1e-6))), lit(1.0 - float(c.attr("norm_coefficient_post", 0.0)))
    rate = ewise(c.b, f"where({{1}} > 0.0, {{0}} * sqrt(1.0 - pow({lit(bt)}, {{1}})) / (1.0 - pow({lit(a)}, {{1}})), "
                      "{0})", [r, t], "adam_rate")
    xs, vs, hs = [], [], []
    for xt, g, v, h in groups:
        gr = _regularized(c, xt, g)
        v_new = ewise(c.b, f"{lit(a)} * {{0}} + {lit(1.0 - a)} * {{1}}", [v, gr], "adam_v")
        h_new = ewise(c.b, f"{lit(bt)} * {{0}} + {lit(1.0 - bt)} * {{1}} * {{1}}", [h, gr], "adam_h")
        xs.append(ewise(c.b, f"{post} * ({{0}} - {{1}} * {{2}} / (sqrt({{3}}) + {eps}))", [xt, rate, v_new, h_new],
                        "adam_x"))
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs
