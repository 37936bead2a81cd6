"""Pointwise activations of ONNX and torch beyond relu/gelu/silu, each one index-notation statement."""

from __future__ import annotations

from superopt.builder import GraphBuilder
from superopt.ops._util import ewise, lit
from superopt.ops.elementwise import _require_float, unary

SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def selu(b: GraphBuilder, x: str, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> str:
    """gamma * (x if x > 0 else alpha * (e^x - 1))."""
    _require_float(b, "selu", x)
    return ewise(b, f"{lit(gamma)} * where({{0}} > 0.0, {{0}}, {lit(alpha)} * (exp({{0}}) - 1.0))", [x], "selu")


def celu(b: GraphBuilder, x: str, alpha: float = 1.0) -> str:
    """max(0, x) + min(0, alpha * (e^(x / alpha) - 1))."""
    _require_float(b, "celu", x)
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    inner = "{0}" if alpha == 1.0 else f"{{0}} / {lit(alpha)}"
    scaled = f"(exp({inner}) - 1.0)" if alpha == 1.0 else f"{lit(alpha)} * (exp({inner}) - 1.0)"
    return ewise(b, f"max({{0}}, 0.0) + min({scaled}, 0.0)", [x], "celu")


def hardsigmoid(b: GraphBuilder, x: str, alpha: float = 0.2, beta: float = 0.5) -> str:
    """max(0, min(1, alpha * x + beta)) (ONNX defaults; torch's is alpha = 1/6)."""
    _require_float(b, "hardsigmoid", x)
    return ewise(b, f"max(min({{0}} * {lit(alpha)} + {lit(beta)}, 1.0), 0.0)", [x], "hardsigmoid")


def hardswish(b: GraphBuilder, x: str) -> str:
    """x * max(0, min(1, x / 6 + 1/2)) (ONNX HardSwish, torch hardswish)."""
    _require_float(b, "hardswish", x)
    return ewise(b, "{0} * max(min({0} * 0.16666666666666666 + 0.5, 1.0), 0.0)", [x], "hardswish")


def shrink(b: GraphBuilder, x: str, bias: float = 0.0, lambd: float = 0.5) -> str:
    """x + bias below -lambd, x - bias above lambd, 0 between (ONNX Shrink; torch hardshrink/softshrink)."""
    dt = b.type(x).dtype
    if dt not in ("float32", "float64") and (dt not in ("int32", "int64") or bias != int(bias) or lambd != int(lambd)):
        raise ValueError(f"shrink: needs a float tensor (or an integer one with integer bias and lambd), got {dt}")
    num = lit if dt.startswith("float") else (lambda v: lit(int(v)))
    lo = f"{{0}} + {num(bias)}" if bias else "{0}"
    hi = f"{{0}} - {num(bias)}" if bias else "{0}"
    src = f"where({{0}} < {num(-lambd)}, {lo}, where({{0}} > {num(lambd)}, {hi}, 0))"
    if not dt.startswith("float"):  # literals are float in the op language: back to the integer type
        src = f"cast_{dt}({src})"
    return ewise(b, src, [x], "shrink")


def thresholded_relu(b: GraphBuilder, x: str, alpha: float = 1.0) -> str:
    """x where x > alpha, else 0."""
    _require_float(b, "thresholded_relu", x)
    return ewise(b, f"where({{0}} > {lit(alpha)}, {{0}}, 0.0)", [x], "thresholded_relu")


def softsign(b: GraphBuilder, x: str) -> str:
    """x / (1 + |x|)."""
    return unary(b, "softsign", x)


def mish(b: GraphBuilder, x: str) -> str:
    """x * tanh(softplus(x))."""
    return unary(b, "mish", x)


__all__ = ["selu", "celu", "hardsigmoid", "hardswish", "shrink", "thresholded_relu", "softsign", "mish"]
