"""ONNX -> superopt Graph.

Runs ONNX shape inference, folds every node whose inputs are all constants at import time (Shape of a
static tensor, ConstantOfShape, Constant, shape arithmetic, ...), and maps every other node onto
:mod:`superopt.ops`. Supported opsets: 9 to 21 of the default domain. Anything else fails with a one-line
:class:`OnnxImportError` naming the op type, node and opset; no node is ever skipped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.interp.reference import evaluate
from superopt.ir.graph import Graph

MIN_OPSET, MAX_OPSET = 9, 21
# Later opsets (up to the installed onnx) are accepted: for every op mapped here the versions after 21 only
# add element types (bfloat16, float8, int4, ...), which the importer rejects by type anyway.
MAX_ACCEPTED_OPSET = max(MAX_OPSET, onnx.defs.onnx_opset_version())

_ELEM = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}


class OnnxImportError(ValueError):
    """A model superopt cannot import; the message is one line and names the culprit."""

    def __init__(self, msg: str) -> None:
        super().__init__(" ".join(str(msg).split()))


class _NeedsConstant(OnnxImportError):
    """A node needs a compile-time value (a shape, axes, ...) that is only known at run time."""


@dataclass
class _Ctx:
    b: GraphBuilder
    opset: int
    node: onnx.NodeProto
    attrs: dict[str, Any] = field(default_factory=dict)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def const(self, t: str | None, what: str) -> np.ndarray | None:
        if t is None:
            return None
        v = self.b.const_value(t)
        if v is None:
            raise _NeedsConstant(f"{what} must be a constant")
        return v

    def ints(self, t: str | None, what: str) -> list[int] | None:
        v = self.const(t, what)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


Converter = Callable[[_Ctx, list], Any]
CONVERTERS: dict[str, Converter] = {}


def _conv(*names: str):
    def deco(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return deco


# ---- elementwise -----------------------------------------------------------------------------------
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
    from superopt.ops._util import ewise, lit

    return ewise(
        c.b, f"where({{0}} < 0.0, {{0}} * {lit(c.attr('alpha', 0.01))}, {{0}})", [x[0]], "leaky_relu"
    )


@_conv("Elu")
def _elu(c, x):
    from superopt.ops._util import ewise, lit

    return ewise(
        c.b, f"where({{0}} < 0.0, {lit(c.attr('alpha', 1.0))} * (exp({{0}}) - 1.0), {{0}})", [x[0]], "elu"
    )


@_conv("HardSigmoid")
def _hard_sigmoid(c, x):
    from superopt.ops._util import ewise, lit

    a, bb = lit(c.attr("alpha", 0.2)), lit(c.attr("beta", 0.5))
    return ewise(c.b, f"max(min({a} * {{0}} + {bb}, 1.0), 0.0)", [x[0]], "hard_sigmoid")


@_conv("Softplus")
def _softplus(c, x):
    from superopt.ops._util import ewise

    return ewise(c.b, "log(exp({0}) + 1.0)", [x[0]], "softplus")


@_conv("PRelu")
def _prelu(c, x):
    from superopt.ops._util import ewise

    return ewise(c.b, "where({0} < 0.0, {0} * {1}, {0})", [x[0], x[1]], "prelu", c.b.shape(x[0]))


@_conv("CastLike")
def _cast_like(c: _Ctx, x):
    return ops.cast(c.b, x[0], c.b.type(x[1]).dtype)


@_conv("Cast")
def _cast(c: _Ctx, x):
    to = c.attr("to")
    if to not in _ELEM:
        raise OnnxImportError(f"Cast to element type {onnx.TensorProto.DataType.Name(to)} is not supported")
    return ops.cast(c.b, x[0], _ELEM[to])


# ---- reductions, softmax, normalization ------------------------------------------------------------
@_conv("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL2")
def _reduce(c: _Ctx, x):
    op = c.node.op_type
    axes_as_input = c.opset >= 18 or (op == "ReduceSum" and c.opset >= 13)
    axes = c.ints(x[1] if len(x) > 1 else None, f"{op} axes") if axes_as_input else c.attr("axes")
    keep = bool(c.attr("keepdims", 1))
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return x[0]
        axes = None
    src = x[0]
    if op in ("ReduceSumSquare", "ReduceL2"):
        src = ops.mul(c.b, src, src)
    kind = {
        "ReduceSum": "sum",
        "ReduceMean": "mean",
        "ReduceMax": "max",
        "ReduceMin": "min",
        "ReduceProd": "prod",
        "ReduceSumSquare": "sum",
        "ReduceL2": "sum",
    }[op]
    out = ops.reduce(c.b, src, kind, axes, keepdims=keep)
    return ops.unary(c.b, "sqrt", out) if op == "ReduceL2" else out


@_conv("Softmax", "LogSoftmax")
def _softmax(c: _Ctx, x):
    fn = ops.softmax if c.node.op_type == "Softmax" else ops.log_softmax
    shape = c.b.shape(x[0])
    if c.opset >= 13:
        return fn(c.b, x[0], c.attr("axis", -1))
    axis = c.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    flat = ops.flatten(c.b, x[0], axis)
    return ops.reshape(c.b, fn(c.b, flat, 1), shape)


@_conv("LayerNormalization")
def _layer_norm(c: _Ctx, x):
    from superopt.ops.normalization import layer_norm_with_stats

    if c.b.type(x[0]).dtype != "float32" and any(o for o in c.node.output[1:]):
        raise OnnxImportError("LayerNormalization statistics outputs are only supported for float32")
    return layer_norm_with_stats(
        c.b, x[0], x[1], x[2] if len(x) > 2 else None, c.attr("axis", -1), c.attr("epsilon", 1e-5)
    )


@_conv("BatchNormalization")
def _batch_norm(c: _Ctx, x):
    if any(o for o in c.node.output[1:]) or c.attr("training_mode", 0):
        raise OnnxImportError("BatchNormalization in training mode is not supported")
    return ops.batch_norm(c.b, x[0], x[1], x[2], x[3], x[4], c.attr("epsilon", 1e-5))


@_conv("LRN")
def _lrn(c: _Ctx, x):
    return ops.lrn(
        c.b, x[0], c.attr("size"), c.attr("alpha", 1e-4), c.attr("beta", 0.75), c.attr("bias", 1.0)
    )


# ---- contractions and pooling ----------------------------------------------------------------------
@_conv("MatMul")
def _matmul(c, x):
    return ops.matmul(c.b, x[0], x[1])


@_conv("Gemm")
def _gemm(c: _Ctx, x):
    return ops.gemm(
        c.b,
        x[0],
        x[1],
        x[2] if len(x) > 2 else None,
        c.attr("alpha", 1.0),
        c.attr("beta", 1.0),
        bool(c.attr("transA", 0)),
        bool(c.attr("transB", 0)),
    )


def _auto_pads(c: _Ctx, in_sp, kernel, strides, dilations) -> list[int]:
    nd = len(kernel)
    auto = c.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        return list(c.attr("pads", [0] * (2 * nd)))
    if auto == "VALID":
        return [0] * (2 * nd)
    pads = [0] * (2 * nd)
    for d in range(nd):
        out = -(-in_sp[d] // strides[d])
        total = max(0, (out - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_sp[d])
        small, big = total // 2, total - total // 2
        pads[d], pads[nd + d] = (small, big) if auto == "SAME_UPPER" else (big, small)
    return pads


@_conv("Conv")
def _conv_op(c: _Ctx, x):
    xs, ws = c.b.shape(x[0]), c.b.shape(x[1])
    nd = len(xs) - 2
    kernel = list(c.attr("kernel_shape", ws[2:]))
    strides = list(c.attr("strides", [1] * nd))
    dil = list(c.attr("dilations", [1] * nd))
    pads = _auto_pads(c, xs[2:], kernel, strides, dil)
    return ops.convnd(c.b, x[0], x[1], x[2] if len(x) > 2 else None, strides, pads, dil, c.attr("group", 1))


@_conv("MaxPool", "AveragePool")
def _pool(c: _Ctx, x):
    if len(c.node.output) > 1 and c.node.output[1]:
        raise OnnxImportError("MaxPool Indices output is not supported")
    xs = c.b.shape(x[0])
    kernel = list(c.attr("kernel_shape"))
    nd = len(kernel)
    strides = list(c.attr("strides", [1] * nd))
    dil = list(c.attr("dilations", [1] * nd))
    pads = _auto_pads(c, xs[2:], kernel, strides, dil)
    ceil_mode = bool(c.attr("ceil_mode", 0))
    if c.node.op_type == "MaxPool":
        return ops.max_pool(c.b, x[0], kernel, strides, pads, dil, ceil_mode)
    if any(d != 1 for d in dil):
        raise OnnxImportError("AveragePool with dilations is not supported")
    return ops.avg_pool(c.b, x[0], kernel, strides, pads, ceil_mode, bool(c.attr("count_include_pad", 0)))


@_conv("GlobalAveragePool")
def _gap(c, x):
    return ops.global_avg_pool(c.b, x[0])


@_conv("GlobalMaxPool")
def _gmp(c, x):
    return ops.global_max_pool(c.b, x[0])


# ---- movement --------------------------------------------------------------------------------------
@_conv("Reshape")
def _reshape(c: _Ctx, x):
    shape = c.ints(x[1], "Reshape shape")
    src = c.b.shape(x[0])
    if not c.attr("allowzero", 0):
        shape = [src[k] if s == 0 else s for k, s in enumerate(shape)]
    return ops.reshape(c.b, x[0], shape)


@_conv("Flatten")
def _flatten(c, x):
    return ops.flatten(c.b, x[0], c.attr("axis", 1))


@_conv("Squeeze", "Unsqueeze")
def _squeeze(c: _Ctx, x):
    axes = c.ints(x[1] if len(x) > 1 else None, "axes") if c.opset >= 13 else c.attr("axes")
    if c.node.op_type == "Squeeze":
        return ops.squeeze(c.b, x[0], axes)
    return ops.unsqueeze(c.b, x[0], axes)


@_conv("Transpose")
def _transpose(c, x):
    return ops.transpose(c.b, x[0], c.attr("perm"))


@_conv("Concat")
def _concat(c, x):
    return ops.concat(c.b, x, c.attr("axis"))


@_conv("Slice")
def _slice(c: _Ctx, x):
    if c.opset < 10:
        starts, ends, axes, steps = c.attr("starts"), c.attr("ends"), c.attr("axes"), None
    else:
        starts, ends = c.ints(x[1], "Slice starts"), c.ints(x[2], "Slice ends")
        axes = c.ints(x[3] if len(x) > 3 else None, "Slice axes")
        steps = c.ints(x[4] if len(x) > 4 else None, "Slice steps")
    return ops.slice_(c.b, x[0], starts, ends, axes, steps)


@_conv("Split")
def _split(c: _Ctx, x):
    shape = c.b.shape(x[0])
    axis = c.attr("axis", 0)
    n_out = len(c.node.output)
    sizes = c.ints(x[1] if len(x) > 1 else None, "Split sizes") if c.opset >= 13 else c.attr("split")
    if not sizes:
        n = c.attr("num_outputs", n_out)
        dim = shape[axis]
        chunk = -(-dim // n)
        sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
    return ops.split(c.b, x[0], axis, sizes)


@_conv("Expand")
def _expand(c, x):
    return ops.expand(c.b, x[0], c.ints(x[1], "Expand shape"))


@_conv("Gather")
def _gather(c, x):
    return ops.gather(c.b, x[0], x[1], c.attr("axis", 0))


@_conv("Pad")
def _pad(c: _Ctx, x):
    mode = c.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        raise OnnxImportError(f"Pad mode {mode!r} is not supported")
    rank = len(c.b.shape(x[0]))
    if c.opset < 11:
        pads, value = c.attr("pads"), c.attr("value", 0.0)
    else:
        pads = c.ints(x[1], "Pad pads")
        v = c.const(x[2] if len(x) > 2 else None, "Pad value")
        value = 0.0 if v is None or v.size == 0 else v.item()
        axes = c.ints(x[3] if len(x) > 3 else None, "Pad axes")
        if axes is not None:
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                a %= rank
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = full
    return ops.pad(c.b, x[0], pads, value)


@_conv("Tile")
def _tile(c: _Ctx, x):
    reps = c.ints(x[1], "Tile repeats")
    t = x[0]
    shape = list(c.b.shape(t))
    for a, r in enumerate(reps):
        if r == 1:
            continue
        pre, post = shape[:a], shape[a + 1 :]
        t = ops.reshape(c.b, t, pre + [1, shape[a]] + post)
        t = ops.expand(c.b, t, pre + [r, shape[a]] + post)
        shape[a] *= r
        t = ops.reshape(c.b, t, shape)
    return t


# ---- ops that only make sense on constants (always folded) ------------------------------------------
@_conv("Shape")
def _shape(c: _Ctx, x):
    s = np.array(c.b.shape(x[0]), np.int64)
    start, end = c.attr("start", 0), c.attr("end")
    return c.b.constant(s[start:end], dtype="int64")


@_conv("Size")
def _size(c, x):
    return c.b.constant(np.array(int(np.prod(c.b.shape(x[0]), dtype=np.int64)), np.int64))


@_conv("ConstantOfShape")
def _constant_of_shape(c: _Ctx, x):
    shape = c.ints(x[0], "ConstantOfShape shape")
    v = c.attr("value")
    val = np.zeros(1, np.float32) if v is None else v
    dt = _np_dtype_name(val.dtype)
    return c.b.constant(np.full(shape, val.reshape(-1)[0], dtype=dt))


@_conv("Range")
def _range(c: _Ctx, x):
    s, e, d = (c.const(t, "Range input") for t in x)
    return c.b.constant(np.arange(s.item(), e.item(), d.item()).astype(s.dtype))


@_conv("Constant")
def _constant(c: _Ctx, x):
    a = c.attrs
    if "value" in a:
        v = a["value"]
    elif "value_float" in a:
        v = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], np.int64)
    else:
        raise OnnxImportError(f"Constant with attribute(s) {sorted(a)} is not supported")
    return c.b.constant(v, dtype=_np_dtype_name(v.dtype))


def _np_dtype_name(dt) -> str:
    name = np.dtype(dt).name
    if name not in ("float32", "float64", "int64", "int32", "bool"):
        raise OnnxImportError(f"element type {name} is not supported")
    return name


_CONST_ONLY = {"Shape", "Size", "ConstantOfShape", "Range", "Constant"}


# ---- driver ----------------------------------------------------------------------------------------
def _load(model: str | Path | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            m = onnx.ModelProto()
            m.ParseFromString(bytes(model))
        else:
            p = Path(model)
            if not p.exists():
                raise OnnxImportError(f"no such ONNX file: {p}")
            m = onnx.load(str(p))
    except OnnxImportError:
        raise
    except Exception as err:  # protobuf decode errors
        what = "bytes" if isinstance(model, (bytes, bytearray)) else f"file {model}"
        raise OnnxImportError(
            f"cannot parse ONNX model from {what}: not a valid (or a truncated) ONNX protobuf "
            f"({type(err).__name__})"
        ) from None
    if not m.graph.node and not m.graph.output:
        raise OnnxImportError("cannot parse ONNX model: the protobuf holds no graph (truncated or not ONNX)")
    return m


def _opset(m: onnx.ModelProto) -> int:
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return MAX_OPSET


def _tensor_type(vi: onnx.ValueInfoProto, what: str) -> tuple[tuple[int, ...], str]:
    tt = vi.type.tensor_type
    if tt.elem_type not in _ELEM:
        raise OnnxImportError(
            f"{what} {vi.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(tt.elem_type)}"
        )
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} {vi.name!r} has no static shape")
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            raise OnnxImportError(
                f"{what} {vi.name!r} has a symbolic dimension {d.dim_param!r}; static shapes only"
            )
        dims.append(int(d.dim_value))
    return tuple(dims), _ELEM[tt.elem_type]


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} (outputs {list(node.output)})"


def _to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    if t.data_type not in _ELEM:
        raise OnnxImportError(
            f"{what} {t.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(t.data_type)}"
        )
    return numpy_helper.to_array(t)


@dataclass
class ImportedModel:
    graph: Graph
    input_names: list[str]  # ONNX names of graph.inputs, in order
    output_names: list[str]  # ONNX names of graph.outputs, in order
    output_dtypes: list[str]


def import_onnx_model(
    model: str | Path | bytes | onnx.ModelProto, bind: Mapping[str, np.ndarray] | None = None
) -> ImportedModel:
    """Import with details; ``bind`` gives run-time values to treat as constants (shape-like inputs)."""
    m = _load(model)
    opset = _opset(m)
    if not MIN_OPSET <= opset <= MAX_ACCEPTED_OPSET:
        raise OnnxImportError(f"opset {opset} is not supported (supported: {MIN_OPSET} to {MAX_OPSET})")
    for o in m.opset_import:
        if o.domain not in ("", "ai.onnx"):
            used = any(n.domain == o.domain for n in m.graph.node)
            if used:
                raise OnnxImportError(f"operator domain {o.domain!r} is not supported")
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OnnxImportError(f"ONNX shape inference failed: {first}") from None
    g = m.graph
    b = GraphBuilder(_clean_name(g.name or "onnx"))
    env: dict[str, str] = {}
    init = {t.name: t for t in g.initializer}
    for name, t in init.items():
        a = _to_array(t, "initializer")
        env[name] = b.constant(a, name, dtype=a.dtype.name)
    bind = dict(bind or {})
    input_names = []
    for vi in g.input:
        if vi.name in init:
            continue
        shape, dtype = _tensor_type(vi, "graph input")
        if vi.name in bind:
            env[vi.name] = b.constant(
                np.asarray(bind[vi.name]).astype(dtype).reshape(shape), vi.name, dtype=dtype
            )
            continue
        env[vi.name] = b.input(vi.name, shape, dtype)
        input_names.append(vi.name)
    value_types = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
    for i, node in enumerate(g.node):
        label = _node_label(node, i)
        where = f"{node.op_type} node {label!r} (opset {opset})"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(
                f"unsupported op {node.domain}.{node.op_type} at node {label!r} (opset {opset})"
            )
        conv = CONVERTERS.get(node.op_type)
        if conv is None:
            raise OnnxImportError(f"unsupported ONNX op {node.op_type!r} at node {label!r} (opset {opset})")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise OnnxImportError(f"unsupported control flow in {where}")
        try:
            attrs = {a.name: _attr_value(a) for a in node.attribute}
            ins = []
            for n in node.input:
                if n == "":
                    ins.append(None)
                elif n not in env:
                    raise OnnxImportError(f"input {n!r} is not defined before it is used")
                else:
                    ins.append(env[n])
            while ins and ins[-1] is None:
                ins.pop()
            if any(t is None for t in ins):  # optional inputs skipped in the middle: keep positions
                pass
            ctx = _Ctx(b, opset, node, attrs)
            folding = (
                all(b.const_value(t) is not None for t in ins if t is not None)
                and node.op_type not in _CONST_ONLY
            )
            outs = _fold(ctx, conv, ins) if folding else conv(ctx, ins)
        except OnnxImportError as err:
            msg = str(err)
            raise (_NeedsConstant if isinstance(err, _NeedsConstant) else OnnxImportError)(
                msg if label in msg else f"{where}: {msg}"
            ) from None
        except Exception as err:
            raise OnnxImportError(f"cannot import {where}: {type(err).__name__}: {err}") from None
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        names = [o for o in node.output]
        if len(outs) < len([o for o in names if o]):
            raise OnnxImportError(f"{where}: produced {len(outs)} outputs but the node has {len(names)}")
        for o, t in zip(names, outs, strict=False):
            if not o:
                continue
            vi = value_types.get(o)
            if vi is not None and vi.type.tensor_type.HasField("shape"):
                want = tuple(
                    d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim
                )
                got = b.shape(t)
                if len(want) != len(got) or any(w not in (-1, gg) for w, gg in zip(want, got, strict=False)):
                    raise OnnxImportError(f"{where}: output {o!r} has shape {got} but ONNX infers {want}")
            env[o] = t
    outputs, out_names, out_dtypes = [], [], []
    for vi in g.output:
        if vi.name not in env:
            raise OnnxImportError(f"graph output {vi.name!r} is never computed")
        outputs.append(env[vi.name])
        out_names.append(vi.name)
        out_dtypes.append(b.type(env[vi.name]).dtype)
    return ImportedModel(b.build(outputs), input_names, out_names, out_dtypes)


def import_onnx(model: str | Path | bytes | onnx.ModelProto) -> Graph:
    """Import an ONNX model (path, serialized bytes or ModelProto) as a superopt Graph."""
    return import_onnx_model(model).graph


def _clean_name(s: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_]", "_", s) or "onnx"


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return _to_array(v, "attribute tensor")
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def _fold(ctx: _Ctx, conv: Converter, ins: list) -> list[str]:
    """Evaluate a node whose inputs are all constants, at import time."""
    b = ctx.b
    sb = GraphBuilder("fold")
    local = [
        None if t is None else sb.constant(b.const_value(t), dtype=b.const_value(t).dtype.name) for t in ins
    ]
    outs = conv(_Ctx(sb, ctx.opset, ctx.node, ctx.attrs), local)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    g = sb.build(outs)
    vals = evaluate(g, {}, dtype=np.float64)
    res = []
    for o in outs:
        v = vals[o].astype(sb.type(o).np_dtype)
        res.append(b.constant(v, dtype=v.dtype.name))
    return res
