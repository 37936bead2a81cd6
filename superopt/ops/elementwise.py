"""Elementwise ops (numpy broadcasting), each one index-notation statement."""

from __future__ import annotations

import numpy as np

from superopt.builder import GraphBuilder
from superopt.ir.expr import UNARY_FNS
from superopt.ops._util import ewise, lit

# unary functions written as expressions of the IR's own (so they need no printer or interpreter support);
# mish = x * tanh(log(1 + e^x)) = x * n / (n + 2) with n = e^x (e^x + 2), which saturates to x above 20
COMPOSITE_FNS = {
    "softsign": "{0} / (1.0 + abs({0}))",
    "mish": "{0} * where({0} > 20.0, 1.0, exp({0}) * (exp({0}) + 2.0) / (exp({0}) * (exp({0}) + 2.0) + 2.0))",
}


def unary(b: GraphBuilder, fn: str, x: str) -> str:
    """``fn`` applied elementwise: a function of the IR (:data:`UNARY_FNS`) or a composite (softsign, mish);
    isnan and isinf give bool tensors."""
    if fn in COMPOSITE_FNS:
        _require_float(b, fn, x)
        return ewise(b, COMPOSITE_FNS[fn], [x], fn)
    if fn not in UNARY_FNS or fn == "bitnot":
        known = [f for f in UNARY_FNS if f != "bitnot"] + list(COMPOSITE_FNS)
        raise ValueError(f"unknown unary function {fn!r}; known: {known}")
    return ewise(b, fn + "({0})", [x], fn)


def _require_float(b: GraphBuilder, what: str, *xs: str) -> None:
    for x in xs:
        if b.type(x).dtype not in ("float32", "float64"):
            raise ValueError(f"{what}: needs a float tensor, got {b.type(x).dtype} {x!r}")


def _require_int(b: GraphBuilder, what: str, *xs: str, allow_bool: bool = False) -> None:
    ok = ("int32", "int64", "bool") if allow_bool else ("int32", "int64")
    for x in xs:
        if b.type(x).dtype not in ok:
            raise ValueError(f"{what}: needs {' or '.join(ok)} tensors, got {b.type(x).dtype} {x!r}")
    if len({b.type(x).dtype for x in xs}) > 1:
        raise ValueError(f"{what}: operands differ in type: {[b.type(x).dtype for x in xs]}")


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


def mod(b: GraphBuilder, x: str, y: str, fmod: bool = False) -> str:
    """Remainder of x / y: with the sign of the divisor (numpy/Python ``%``), or with ``fmod`` the sign of the
    dividend (C ``fmod``/``%``, the quotient truncated toward zero); ints and floats."""
    if b.type(x).dtype != b.type(y).dtype:
        raise ValueError(f"mod: operands differ in type: {b.type(x).dtype} and {b.type(y).dtype}")
    if b.type(x).dtype == "bool":
        raise ValueError("mod: bool tensors have no remainder")
    return _binary(b, "fmod" if fmod else "mod", x, y, "fmod" if fmod else "mod")


_BITWISE = {"and": "bitand", "or": "bitor", "xor": "bitxor"}


def bitwise(b: GraphBuilder, op: str, x: str, y: str) -> str:
    """Bitwise ``and`` / ``or`` / ``xor`` of integer (or bool) tensors."""
    if op not in _BITWISE:
        raise ValueError(f"bitwise: op must be one of {list(_BITWISE)}, not {op!r}")
    _require_int(b, f"bitwise {op}", x, y, allow_bool=True)
    return ewise(b, f"{_BITWISE[op]}({{0}}, {{1}})", [x, y], f"bitwise_{op}")


def bitwise_not(b: GraphBuilder, x: str) -> str:
    """~x of an integer tensor (logical not of a bool one)."""
    _require_int(b, "bitwise_not", x, allow_bool=True)
    return ewise(b, ("not" if b.type(x).dtype == "bool" else "bitnot") + "({0})", [x], "bitwise_not")


def bit_shift(b: GraphBuilder, x: str, y: str, direction: str) -> str:
    """x << y (``left``) or x >> y (``right``, arithmetic on these signed types, as numpy); shifts of the
    type's bit width or more are undefined, as in C."""
    if direction not in ("left", "right"):
        raise ValueError(f"bit_shift: direction must be 'left' or 'right', not {direction!r}")
    _require_int(b, "bit_shift", x, y)
    return ewise(b, ("shl" if direction == "left" else "shr") + "({0}, {1})", [x, y], "bit_shift")


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
