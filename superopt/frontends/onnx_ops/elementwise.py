"""Elementwise ONNX ops: arithmetic, unary functions, comparisons, activations, casts."""

from __future__ import annotations

import numpy as np
import onnx

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.frontends.onnx_ops.context import CONVERTERS, ELEM, OnnxImportError, _conv, _Ctx
from superopt.ops._util import ewise, lit

_BIN = {"Add": ops.add, "Sub": ops.sub, "Mul": ops.mul, "Div": ops.div, "Pow": ops.pow_}
for _name, _fn in _BIN.items():
    CONVERTERS[_name] = lambda c, x, _fn=_fn: _fn(c.b, x[0], x[1])

_UNARY = {
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Abs": "abs",
    "Neg": "neg",
    "Relu": "relu",
    "Floor": "floor",
    "Ceil": "ceil",
    "Reciprocal": "reciprocal",
    "Sin": "sin",
    "Cos": "cos",
    "Round": "round",
    "Sign": "sign",
    "Not": "not",
}
for _name, _fn in _UNARY.items():
    CONVERTERS[_name] = lambda c, x, _fn=_fn: ops.unary(c.b, _fn, x[0])

_CMP = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}
for _name, _op in _CMP.items():
    CONVERTERS[_name] = lambda c, x, _op=_op: ops.compare(c.b, _op, x[0], x[1])
for _name, _op in (("And", "and"), ("Or", "or"), ("Xor", "xor")):
    CONVERTERS[_name] = lambda c, x, _op=_op: ops.logical(c.b, _op, x[0], x[1])
for _name, _op in (("BitwiseAnd", "and"), ("BitwiseOr", "or"), ("BitwiseXor", "xor")):
    CONVERTERS[_name] = lambda c, x, _op=_op: ops.bitwise(c.b, _op, x[0], x[1])
CONVERTERS["BitwiseNot"] = lambda c, x: ops.bitwise_not(c.b, x[0])


@_conv("BitShift")
def _bit_shift(c: _Ctx, x):
    """Shifts by a negative count or by the bit width or more give 0, or -1 for a negative value shifted right
    (numpy, and ONNX since opset 28; earlier opsets left them undefined)."""
    return ops.bit_shift(c.b, x[0], x[1], str(c.attr("direction")).lower())


@_conv("Mod")
def _mod(c: _Ctx, x):
    """fmod=0: the sign of the divisor (Python %); fmod=1: the sign of the dividend (C fmod)."""
    return ops.mod(c.b, x[0], x[1], fmod=bool(c.attr("fmod", 0)))


@_conv("Sum", "Max", "Min", "Mean")
def _variadic(c: _Ctx, x):
    fn = {"Sum": ops.add, "Mean": ops.add, "Max": ops.maximum, "Min": ops.minimum}[c.node.op_type]
    acc = x[0]
    for y in x[1:]:
        acc = fn(c.b, acc, y)
    if c.node.op_type == "Mean" and len(x) > 1:
        acc = ops.scale(c.b, acc, 1.0 / len(x))
    return acc


@_conv("Identity", "Dropout")
def _identity(c: _Ctx, x):
    """Identity, and Dropout at inference: the input, and an all-true mask. Dropout-12+ in training mode
    (``training_mode`` true, a compile-time value the backend binds per value) with a ratio above 0 drops at
    random: refused, not run as the identity."""
    if c.node.op_type == "Dropout" and len(x) > 2 and x[2] is not None:
        if bool(np.asarray(c.const(x[2], "Dropout training_mode")).reshape(-1)[0]):
            ratio = 0.5 if x[1] is None else float(np.asarray(c.const(x[1], "Dropout ratio")).reshape(-1)[0])
            if ratio != 0.0:
                raise OnnxImportError(f"Dropout in training mode with ratio {ratio} drops at random (seed "
                                      f"{c.attr('seed')}); only inference (or ratio 0) is lowered")
    outs = [x[0]]
    if c.node.op_type == "Dropout" and len(c.node.output) > 1 and c.node.output[1]:
        outs.append(c.b.constant(np.ones(c.b.shape(x[0]), bool)))
    return outs


@_conv("Where")
def _where(c, x):
    return ops.where(c.b, *x)


@_conv("Clip")
def _clip(c: _Ctx, x):
    if c.opset < 11:
        lo, hi = c.attr("min"), c.attr("max")
    else:
        lo_t = x[1] if len(x) > 1 else None
        hi_t = x[2] if len(x) > 2 else None
        if any(t is not None and c.b.const_value(t) is None for t in (lo_t, hi_t)):  # run-time bounds
            out = x[0]
            if lo_t is not None:
                out = ops.maximum(c.b, out, lo_t)
            if hi_t is not None:
                out = ops.minimum(c.b, out, hi_t)
            return out
        lo = None if lo_t is None else c.b.const_value(lo_t).item()
        hi = None if hi_t is None else c.b.const_value(hi_t).item()
    return ops.clip(c.b, x[0], lo, hi)


@_conv("Gelu")
def _gelu(c, x):
    return ops.gelu(c.b, x[0], c.attr("approximate", "none"))


@_conv("LeakyRelu")
def _leaky(c, x):
    return ewise(c.b, f"where({{0}} < 0.0, {{0}} * {lit(c.attr('alpha', 0.01))}, {{0}})", [x[0]], "leaky_relu")


@_conv("Elu")
def _elu(c, x):
    return ewise(c.b, f"where({{0}} < 0.0, {lit(c.attr('alpha', 1.0))} * (exp({{0}}) - 1.0), {{0}})", [x[0]], "elu")


@_conv("HardSigmoid")
def _hard_sigmoid(c, x):
    return ops.hardsigmoid(c.b, x[0], c.attr("alpha", 0.2), c.attr("beta", 0.5))


@_conv("Softplus")
def _softplus(c, x):
    return ewise(c.b, "log(exp({0}) + 1.0)", [x[0]], "softplus")


@_conv("PRelu")
def _prelu(c, x):
    return ewise(c.b, "where({0} < 0.0, {0} * {1}, {0})", [x[0], x[1]], "prelu", c.b.shape(x[0]))


@_conv("CastLike")
def _cast_like(c: _Ctx, x):
    return ops.cast(c.b, x[0], c.b.type(x[1]).dtype)


@_conv("Cast")
def _cast(c: _Ctx, x):
    to = c.attr("to")
    if to not in ELEM:
        raise OnnxImportError(f"Cast to element type {onnx.TensorProto.DataType.Name(to)} is not supported")
    return ops.cast(c.b, x[0], ELEM[to])


def _empty_aware(conv):
    """An elementwise converter that also takes tensors with no elements: the result is an empty constant of
    the broadcast shape, in the element type the converter gives for one-element operands."""

    def run(c: _Ctx, x):
        data = x[:1] if c.node.op_type == "CastLike" else x  # CastLike's second operand gives only a type
        shapes = [c.b.shape(t) for t in data if t is not None]
        if not any(0 in s for s in shapes):
            return conv(c, x)
        scratch = GraphBuilder("empty")
        ones = [None if t is None else scratch.input(f"x{k}", [1] * len(c.b.shape(t)), c.b.type(t).dtype)
                for k, t in enumerate(x)]
        outs = conv(_Ctx(scratch, c.opset, c.node, c.attrs), ones)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        shape = np.broadcast_shapes(*shapes)
        return [c.b.constant(np.zeros(shape, scratch.type(o).dtype), dtype=scratch.type(o).dtype) for o in outs]

    return run


for _name in [*_BIN, *_UNARY, *_CMP, "And", "Or", "Xor", "Cast", "CastLike", "Where", "Mod", "Clip"]:
    CONVERTERS[_name] = _empty_aware(CONVERTERS[_name])
