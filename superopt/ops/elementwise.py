"""Elementwise ops (numpy broadcasting), each one index-notation statement."""

from __future__ import annotations

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ir.expr import UNARY_FNS
from superopt.ops._util import ewise, lit


def unary(b: GraphBuilder, fn: str, x: str) -> str:
    if fn not in UNARY_FNS:
        raise ValueError(f"unknown unary function {fn!r}; known: {list(UNARY_FNS)}")
    return ewise(b, fn + "({0})", [x], fn)


def _scalar_const(b: GraphBuilder, t: str, other: str) -> str | None:
    """A float scalar constant operand as a literal (when the other operand is float too)."""
    v = b.const_value(t)
    if v is None or v.size != 1 or v.dtype.kind != "f" or b.type(other).dtype not in ("float32", "float64"):
        return None
    if len(v.shape) > len(b.shape(other)):
        return None
    return lit(float(v.reshape(())))


def _binary(b: GraphBuilder, op: str, x: str, y: str, name: str) -> str:
    fmt = (lambda p, q: f"({p} {op} {q})") if op in "+-*/" else (lambda p, q: f"{op}({p}, {q})")
    cy = _scalar_const(b, y, x)
    if cy is not None:
        return ewise(b, fmt("{0}", cy), [x], name)
    cx = _scalar_const(b, x, y)
    if cx is not None:
        return ewise(b, fmt(cx, "{0}"), [y], name)
    return ewise(b, fmt("{0}", "{1}"), [x, y], name)


def add(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "+", x, y, "add")


def sub(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "-", x, y, "sub")


def mul(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "*", x, y, "mul")


def div(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "/", x, y, "div")


def pow_(b: GraphBuilder, x: str, y: str) -> str:
    if b.type(y).dtype != b.type(x).dtype:
        y = cast(b, y, b.type(x).dtype)
    return _binary(b, "pow", x, y, "pow")


def maximum(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "max", x, y, "maximum")


def minimum(b: GraphBuilder, x: str, y: str) -> str:
    return _binary(b, "min", x, y, "minimum")


def compare(b: GraphBuilder, op: str, x: str, y: str) -> str:
    """x op y with op in < <= > >= == != (a bool tensor)."""
    return ewise(b, f"({{0}} {op} {{1}})", [x, y], "compare")


def logical(b: GraphBuilder, op: str, x: str, y: str) -> str:
    """``and`` / ``or`` / ``xor`` of bool tensors."""
    if op == "xor":
        return ewise(b, "({0} != {1})", [x, y], "xor")
    return ewise(b, f"{op}({{0}}, {{1}})", [x, y], op)


def where(b: GraphBuilder, c: str, x: str, y: str) -> str:
    return ewise(b, "where({0}, {1}, {2})", [c, x, y], "where")


def clip(b: GraphBuilder, x: str, lo: float | None = None, hi: float | None = None) -> str:
    e = "{0}"
    if lo is not None:
        e = f"max({e}, {lit(lo)})"
    if hi is not None:
        e = f"min({e}, {lit(hi)})"
    return ewise(b, e, [x], "clip")


def relu(b: GraphBuilder, x: str) -> str:
    return ewise(b, "relu({0})", [x], "relu")


def gelu(b: GraphBuilder, x: str, approximate: str = "none") -> str:
    if approximate == "none":
        return ewise(b, "0.5 * {0} * (1.0 + erf({0} * 0.7071067811865476))", [x], "gelu")
    if approximate == "tanh":
        return ewise(
            b,
            "0.5 * {0} * (1.0 + tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0})))",
            [x],
            "gelu",
        )
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


def silu(b: GraphBuilder, x: str) -> str:
    return ewise(b, "{0} * sigmoid({0})", [x], "silu")


def sigmoid(b: GraphBuilder, x: str) -> str:
    return unary(b, "sigmoid", x)


def tanh(b: GraphBuilder, x: str) -> str:
    return unary(b, "tanh", x)


def erf(b: GraphBuilder, x: str) -> str:
    return unary(b, "erf", x)


def cast(b: GraphBuilder, x: str, dtype: str) -> str:
    dtype = np.dtype(dtype).name
    if b.type(x).dtype == dtype:
        return x
    v = b.const_value(x)
    if v is not None:
        return b.constant(v.astype(dtype))
    return ewise(b, f"cast_{dtype}({{0}})", [x], "cast")


def scale(b: GraphBuilder, x: str, factor: float) -> str:
    return ewise(b, f"{{0}} * {lit(factor)}", [x], "scale")
