"""Elementwise torch functions, methods and operators; dtype conversion; identity-like ops."""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from superopt import ops
from superopt.frontends.torch_ops.context import Ctx, Handler, T, aten, function, ir_dtype, method, need_op
from superopt.frontends.torch_ops.sorting import values_and_indices


# =================================================================================================
# Elementwise
# =================================================================================================
@function(torch.relu, F.relu, torch.relu_, F.relu_)
@method("relu", "relu_")
def _relu(cx: Ctx, x: T, inplace: bool = False) -> T:
    return T(ops.relu(cx.b, x))


@function(F.gelu)
@method("gelu")
def _gelu(cx: Ctx, x: T, approximate: str = "none") -> T:
    return T(ops.gelu(cx.b, x, approximate=approximate))


@function(F.silu)
def _silu(cx: Ctx, x: T, inplace: bool = False) -> T:
    return T(ops.silu(cx.b, x))


@function(torch.sigmoid, F.sigmoid)
@method("sigmoid")
def _sigmoid(cx: Ctx, x: T) -> T:
    return T(ops.sigmoid(cx.b, x))


@function(torch.tanh, F.tanh)
@method("tanh")
def _tanh(cx: Ctx, x: T) -> T:
    return T(ops.tanh(cx.b, x))


def _unary_fn(fn: str) -> Handler:
    def h(cx: Ctx, x: T) -> T:
        return T(ops.unary(cx.b, fn, x))
    return h


for _fn in ("exp", "log", "sqrt", "rsqrt", "erf", "abs", "neg", "floor", "ceil", "reciprocal", "sin", "cos"):
    function(getattr(torch, _fn, None), getattr(torch.special, _fn, None))(_unary_fn(_fn))
    method(_fn)(_unary_fn(_fn))
function(operator.neg, torch.negative)(_unary_fn("neg"))


def _binary(cx: Ctx, fn: Callable[..., str], pyop: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    if not isinstance(x, T) and not isinstance(y, T):
        return pyop(x, y)
    like = x if isinstance(x, T) else y
    return T(fn(cx.b, cx.tensor(x, like), cx.tensor(y, like)))


@function(operator.add, torch.add, operator.iadd)
@method("add", "add_", "__add__", "__iadd__")
def _add(cx: Ctx, x: Any, y: Any, *, alpha: float = 1, out: Any = None) -> Any:
    if alpha != 1:
        y = _mul(cx, y, alpha)
    return _binary(cx, ops.add, operator.add, x, y)


@function(operator.sub, torch.sub, torch.subtract, operator.isub)
@method("sub", "sub_", "__sub__")
def _sub(cx: Ctx, x: Any, y: Any, *, alpha: float = 1, out: Any = None) -> Any:
    if alpha != 1:
        y = _mul(cx, y, alpha)
    return _binary(cx, ops.sub, operator.sub, x, y)


@method("__rsub__", "rsub")
def _rsub(cx: Ctx, x: Any, y: Any, *, alpha: float = 1) -> Any:
    return _sub(cx, y, x, alpha=alpha)


@function(operator.mul, torch.mul, torch.multiply, operator.imul)
@method("mul", "mul_", "__mul__")
def _mul(cx: Ctx, x: Any, y: Any, *, out: Any = None) -> Any:
    return _binary(cx, ops.mul, operator.mul, x, y)


@function(operator.truediv, torch.div, torch.divide, torch.true_divide, operator.itruediv)
@method("div", "div_", "__truediv__", "true_divide")
def _div(cx: Ctx, x: Any, y: Any, *, rounding_mode: str | None = None, out: Any = None) -> Any:
    if rounding_mode is None:
        if isinstance(x, T) or isinstance(y, T):
            # true division of integer tensors gives float
            x = cx.tensor(x, y if isinstance(y, T) else None)
            y = cx.tensor(y, x)
            if cx.dtype(x) not in ("float32", "float64"):
                x = T(ops.cast(cx.b, x, "float32"))
            if cx.dtype(y) != cx.dtype(x):
                y = T(ops.cast(cx.b, y, cx.dtype(x)))
        return _binary(cx, ops.div, operator.truediv, x, y)
    if rounding_mode == "floor":
        return _floordiv(cx, x, y)
    raise cx.fail(f"div rounding_mode={rounding_mode!r} is not supported")


@function(operator.floordiv, torch.floor_divide)
@method("floor_divide", "__floordiv__")
def _floordiv(cx: Ctx, x: Any, y: Any) -> Any:
    if not isinstance(x, T) and not isinstance(y, T):
        return x // y
    like = x if isinstance(x, T) else y
    x, y = cx.tensor(x, like), cx.tensor(y, like)
    if cx.dtype(x) in ("float32", "float64"):
        return T(ops.unary(cx.b, "floor", ops.div(cx.b, x, y)))
    # integers: x - mod(x, y) is a multiple of y, so the (truncating) division is exact; mod floors like torch
    rem = need_op(cx, "elementwise", "mod")(cx.b, x, y, fmod=False)
    return T(ops.div(cx.b, ops.sub(cx.b, x, rem), y))


@function(operator.pow, torch.pow)
@method("pow", "__pow__")
def _pow(cx: Ctx, x: Any, y: Any) -> Any:
    if isinstance(x, T) and not isinstance(y, T) and y == 2:
        return T(ops.mul(cx.b, x, x))
    if isinstance(x, T) and not isinstance(y, T) and y == 0.5:
        return T(ops.unary(cx.b, "sqrt", x))
    return _binary(cx, ops.pow_, operator.pow, x, y)


@function(torch.maximum, torch.max)
@method("maximum")
def _maximum(cx: Ctx, x: T, y: Any = None, *a: Any, **kw: Any) -> Any:
    if not isinstance(y, T) or a or kw:
        return _max_min(cx, "max", x, y, *a, **kw)
    return _binary(cx, ops.maximum, builtins.max, x, y)


@function(torch.minimum, torch.min)
@method("minimum")
def _minimum(cx: Ctx, x: T, y: Any = None, *a: Any, **kw: Any) -> Any:
    if not isinstance(y, T) or a or kw:
        return _max_min(cx, "min", x, y, *a, **kw)
    return _binary(cx, ops.minimum, builtins.min, x, y)


def _max_min(cx: Ctx, kind: str, x: T, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
    if dim is None and not kw:
        return T(ops.reduce(cx.b, x, kind, list(range(cx.rank(x))), keepdims=False))
    if isinstance(dim, int) and not kw:
        return values_and_indices(cx, kind, x, dim, keepdim)
    raise cx.fail(f"torch.{kind} with arguments {sorted(kw)} is not supported")


_CMP = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=", operator.eq: "==",
        operator.ne: "!=", torch.lt: "<", torch.le: "<=", torch.gt: ">", torch.ge: ">=", torch.eq: "==",
        torch.ne: "!="}


def _compare_fn(op: str, pyop: Callable[[Any, Any], Any]) -> Handler:
    def h(cx: Ctx, x: Any, y: Any) -> Any:
        if not isinstance(x, T) and not isinstance(y, T):
            return pyop(x, y)
        like = x if isinstance(x, T) else y
        return T(ops.compare(cx.b, op, cx.tensor(x, like), cx.tensor(y, like)))
    return h


for _t, _op in _CMP.items():
    _py = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}[_op]
    function(_t)(_compare_fn(_op, _py))
for _m, _op in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
    method(_m, f"__{_m}__")(_compare_fn(_op, getattr(operator, _m)))


@function(torch.where)
@method("where")
def _where(cx: Ctx, c: Any, x: Any = None, y: Any = None) -> T:
    if x is None:
        raise cx.fail("torch.where(cond) (nonzero) is not supported")
    if not isinstance(c, T):
        return x if c else y
    like = x if isinstance(x, T) else (y if isinstance(y, T) else None)
    xt = cx.tensor(x, like)
    yt = cx.tensor(y, like or xt)
    return T(ops.where(cx.b, c, xt, yt))


@method("masked_fill", "masked_fill_")
def _masked_fill(cx: Ctx, x: T, mask: T, value: Any) -> T:
    return T(ops.where(cx.b, mask, cx.tensor(value, x), x))


@function(torch.clamp, torch.clip)
@method("clamp", "clip", "clamp_")
def _clamp(cx: Ctx, x: T, min: Any = None, max: Any = None) -> T:  # noqa: A002 - torch's names
    if isinstance(min, T) or isinstance(max, T):
        if min is not None:
            x = T(ops.maximum(cx.b, x, cx.tensor(min, x)))
        if max is not None:
            x = T(ops.minimum(cx.b, x, cx.tensor(max, x)))
        return x
    return T(ops.clip(cx.b, x, lo=min, hi=max))


@function(F.hardtanh, F.relu6)
def _hardtanh(cx: Ctx, x: T, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> T:
    if cx.node.target is F.relu6:
        min_val, max_val = 0.0, 6.0
    return T(ops.clip(cx.b, x, lo=min_val, hi=max_val))


@function(F.leaky_relu)
def _leaky_relu(cx: Ctx, x: T, negative_slope: float = 0.01, inplace: bool = False) -> T:
    neg = ops.scale(cx.b, x, negative_slope)
    return T(ops.maximum(cx.b, x, neg)) if negative_slope <= 1 else T(ops.minimum(cx.b, x, neg))


# dtype conversion ---------------------------------------------------------------------------------
_DTYPE_METHODS = {"float": torch.float32, "double": torch.float64, "long": torch.int64, "int": torch.int32,
                  "bool": torch.bool, "half": torch.float16, "bfloat16": torch.bfloat16}


def _dtype_method(dt: torch.dtype) -> Handler:
    def h(cx: Ctx, x: T, *a: Any, **kw: Any) -> T:
        return T(ops.cast(cx.b, x, ir_dtype(dt)))
    return h


for _m, _dt in _DTYPE_METHODS.items():
    method(_m)(_dtype_method(_dt))


@method("to", "type")
def _to(cx: Ctx, x: T, *args: Any, dtype: torch.dtype | None = None, **kw: Any) -> T:
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, T):
            dtype = getattr(torch, cx.dtype(a))
    return T(ops.cast(cx.b, x, ir_dtype(dtype))) if dtype is not None else x


@method("type_as")
def _type_as(cx: Ctx, x: T, other: T) -> T:
    return T(ops.cast(cx.b, x, cx.dtype(other)))


@method("contiguous", "clone", "detach", "cpu", "cuda", "requires_grad_")
@function(torch.clone, torch.Tensor.contiguous)
def _identity(cx: Ctx, x: T, *a: Any, **kw: Any) -> T:
    return x


@function(F.dropout, torch.dropout, F.dropout1d, F.dropout2d, F.alpha_dropout)
def _dropout(cx: Ctx, x: T, p: float = 0.5, training: bool = True, inplace: bool = False) -> T:
    if training and p > 0:
        raise cx.fail("dropout in training mode is not supported (call model.eval())")
    return x


# more unary functions and activations (the contract's native ops) ------------------------------------
for _fn in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "sign", "round"):
    function(getattr(torch, _fn, None))(_unary_fn(_fn))
    method(_fn)(_unary_fn(_fn))
    aten(_fn)(_unary_fn(_fn))
for _fn in ("isnan", "isinf"):
    function(getattr(torch, _fn))(_unary_fn(_fn))
    method(_fn)(_unary_fn(_fn))
    aten(_fn)(_unary_fn(_fn))
function(torch.arcsin)(_unary_fn("asin"))
function(torch.arccos)(_unary_fn("acos"))
function(torch.arctan)(_unary_fn("atan"))


def _activation(name: str, **fixed: Any) -> Handler:
    def h(cx: Ctx, x: T, *a: Any, inplace: bool = False, **kw: Any) -> T:
        return T(need_op(cx, "activations", name)(cx.b, x, **fixed))
    return h


function(F.hardswish)(_activation("hardswish"))
function(F.hardsigmoid)(_activation("hardsigmoid", alpha=1.0 / 6.0, beta=0.5))
function(F.mish)(_activation("mish"))
function(F.selu, torch.selu)(_activation("selu"))
function(F.softsign)(_activation("softsign"))
aten("hardswish")(_activation("hardswish"))
aten("hardsigmoid")(_activation("hardsigmoid", alpha=1.0 / 6.0, beta=0.5))
aten("mish")(_activation("mish"))


@function(F.celu, torch.celu)
def _celu(cx: Ctx, x: T, alpha: float = 1.0, inplace: bool = False) -> T:
    return T(need_op(cx, "activations", "celu")(cx.b, x, alpha=alpha))


@function(F.elu)
@aten("elu")
def _elu(cx: Ctx, x: T, alpha: float = 1.0, *a: Any, inplace: bool = False, **kw: Any) -> T:
    if a or kw:  # aten.elu(x, alpha, scale, input_scale)
        raise cx.fail("elu with scale/input_scale is not supported")
    neg = ops.scale(cx.b, ops.sub(cx.b, ops.unary(cx.b, "exp", ops.minimum(cx.b, x, cx.tensor(0.0, x))),
                                  cx.tensor(1.0, x)), alpha)
    return T(ops.where(cx.b, ops.compare(cx.b, ">", x, cx.tensor(0.0, x)), x, neg))


@function(F.softplus)
@aten("softplus")
def _softplus(cx: Ctx, x: T, beta: float = 1.0, threshold: float = 20.0) -> T:
    bx = T(ops.scale(cx.b, x, beta)) if beta != 1 else x
    soft = T(ops.unary(cx.b, "log", ops.add(cx.b, ops.unary(cx.b, "exp", ops.minimum(cx.b, bx, cx.tensor(threshold, x))),
                                            cx.tensor(1.0, x))))
    if beta != 1:
        soft = T(ops.scale(cx.b, soft, 1.0 / beta))
    return T(ops.where(cx.b, ops.compare(cx.b, ">", bx, cx.tensor(threshold, x)), x, soft))


# triangular masks -------------------------------------------------------------------------------------
def _triangle(upper: bool) -> Handler:
    def h(cx: Ctx, x: T, diagonal: int = 0, *, out: Any = None) -> T:
        return T(need_op(cx, "triangular", "trilu")(cx.b, x, k=int(diagonal), upper=upper))
    return h


for _name, _upper in (("triu", True), ("tril", False)):
    function(getattr(torch, _name))(_triangle(_upper))
    method(_name)(_triangle(_upper))
    aten(_name)(_triangle(_upper))


# integer arithmetic and bits ---------------------------------------------------------------------------
def _modulo(fmod: bool) -> Handler:
    def h(cx: Ctx, x: Any, y: Any) -> Any:
        if not isinstance(x, T) and not isinstance(y, T):
            return math.fmod(x, y) if fmod else x % y
        like = x if isinstance(x, T) else y
        return T(need_op(cx, "elementwise", "mod")(cx.b, cx.tensor(x, like), cx.tensor(y, like), fmod=fmod))
    return h


function(torch.remainder, operator.mod)(_modulo(False))
method("remainder", "__mod__")(_modulo(False))
aten("remainder")(_modulo(False))
function(torch.fmod)(_modulo(True))
method("fmod")(_modulo(True))
aten("fmod")(_modulo(True))


def _bits(op: str) -> Handler:
    def h(cx: Ctx, x: Any, y: Any) -> Any:
        if not isinstance(x, T) and not isinstance(y, T):
            return {"and": operator.and_, "or": operator.or_, "xor": operator.xor}[op](x, y)
        like = x if isinstance(x, T) else y
        x, y = cx.tensor(x, like), cx.tensor(y, like)
        if cx.dtype(x) == "bool" and cx.dtype(y) == "bool":
            return T(ops.logical(cx.b, op, x, y))
        return T(need_op(cx, "elementwise", "bitwise")(cx.b, op, x, y))
    return h


for _op in ("and", "or", "xor"):
    function(getattr(operator, f"{_op}_", getattr(operator, _op, None)), getattr(torch, f"bitwise_{_op}"))(_bits(_op))
    method(f"bitwise_{_op}", f"__{_op}__")(_bits(_op))
    aten(f"bitwise_{_op}")(_bits(_op))
    function(getattr(torch, f"logical_{_op}"))(
        lambda cx, x, y, _op=_op: T(ops.logical(cx.b, _op, _as_bool(cx, x), _as_bool(cx, y))))
    method(f"logical_{_op}")(lambda cx, x, y, _op=_op: T(ops.logical(cx.b, _op, _as_bool(cx, x), _as_bool(cx, y))))
    aten(f"logical_{_op}")(lambda cx, x, y, _op=_op: T(ops.logical(cx.b, _op, _as_bool(cx, x), _as_bool(cx, y))))


def _as_bool(cx: Ctx, x: Any) -> T:
    x = cx.tensor(x)
    return x if cx.dtype(x) == "bool" else T(ops.compare(cx.b, "!=", x, cx.tensor(0, x)))


@function(operator.invert, torch.bitwise_not, torch.logical_not)
@method("bitwise_not", "logical_not", "__invert__")
@aten("bitwise_not", "logical_not")
def _invert(cx: Ctx, x: T) -> T:
    if cx.dtype(x) == "bool" or (cx.node is not None and "logical" in str(cx.node.target)):
        return T(ops.unary(cx.b, "not", _as_bool(cx, x)))
    return T(need_op(cx, "elementwise", "bitwise_not")(cx.b, x))
