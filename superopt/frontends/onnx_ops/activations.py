"""Pointwise activations and math functions: Selu, Celu, HardSwish, Mish, Softsign, Shrink, ThresholdedRelu,
Swish, SwiGLU, the trigonometric and hyperbolic functions, IsNaN, IsInf."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import CONVERTERS, _conv, _Ctx
from superopt.ops._util import ewise, lit
from superopt.ops.activations import SELU_ALPHA, SELU_GAMMA

_UNARY = ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "softsign", "mish")
for _fn in _UNARY:
    CONVERTERS[_fn.capitalize()] = lambda c, x, _fn=_fn: ops.unary(c.b, _fn, x[0])


@_conv("Selu")
def _selu(c: _Ctx, x):
    return ops.selu(c.b, x[0], c.attr("alpha", SELU_ALPHA), c.attr("gamma", SELU_GAMMA))


@_conv("Celu")
def _celu(c: _Ctx, x):
    return ops.celu(c.b, x[0], c.attr("alpha", 1.0))


@_conv("HardSwish")
def _hardswish(c: _Ctx, x):
    return ops.hardswish(c.b, x[0])


@_conv("Shrink")
def _shrink(c: _Ctx, x):
    return ops.shrink(c.b, x[0], c.attr("bias", 0.0), c.attr("lambd", 0.5))


@_conv("ThresholdedRelu")
def _thresholded_relu(c: _Ctx, x):
    return ops.thresholded_relu(c.b, x[0], c.attr("alpha", 1.0))


@_conv("Swish")
def _swish(c: _Ctx, x):
    """x * sigmoid(alpha * x) (opset 24)."""
    alpha = float(c.attr("alpha", 1.0))
    return ewise(c.b, "{0} * sigmoid({0})" if alpha == 1.0 else f"{{0}} * sigmoid({lit(alpha)} * {{0}})", [x[0]], "swish")


@_conv("SwiGLU")
def _swiglu(c: _Ctx, x):
    """swish_alpha(a) * b, a and b of one shape (opset 28)."""
    alpha = float(c.attr("alpha", 1.0))
    gate = "sigmoid({0})" if alpha == 1.0 else f"sigmoid({lit(alpha)} * {{0}})"
    return ewise(c.b, f"{{0}} * {gate} * {{1}}", [x[0], x[1]], "swiglu")


@_conv("IsNaN")
def _isnan(c: _Ctx, x):
    return ops.unary(c.b, "isnan", x[0])


@_conv("IsInf")
def _isinf(c: _Ctx, x):
    pos, neg = bool(c.attr("detect_positive", 1)), bool(c.attr("detect_negative", 1))
    if pos and neg:
        return ops.unary(c.b, "isinf", x[0])
    if pos or neg:
        return ewise(c.b, "({0} == inf)" if pos else "({0} == (-inf))", [x[0]], "isinf")
    return c.b.constant(np.zeros(c.b.shape(x[0]), bool))
