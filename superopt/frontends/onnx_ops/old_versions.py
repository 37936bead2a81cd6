"""ONNX op versions older than opset 9, each restated in its opset-9 form for the current converters.

The converters are written for opset 9 and later. A node of an older model whose op has the same schema
version at the model's opset as at opset 9 converts unchanged. Where the op changed since (per the ONNX
operator changelog), an adapter here turns the old node into its opset-9 equivalent and calls the
converter with that: the ``broadcast``/``axis`` attributes of the first binary ops (B broadcast onto A
from ``axis``, or operands of one shape), attributes that later became inputs (Reshape-1 ``shape``,
Upsample-1/7 scales, Tile-1 ``tiles``/``axis``, Split-1's ``split`` input), renamed or retyped
attributes (Pad-1 ``paddings``, Cast-1's type name, LpPool-1's float ``p``), BatchNormalization's
``spatial``/``is_test`` and Dropout's ``is_test``. The legacy ``consumed_inputs`` attribute (an
in-place hint of opset 1) has no effect on values and is dropped. An old version with no adapter, or
one used in a way that is not deterministic inference (training-mode BatchNormalization/Dropout before
opset 7), is refused with the reason (the importer's fallback or strict error then takes it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from superopt import ops
from superopt.frontends.onnx_ops.context import Converter, OnnxImportError, _Ctx
from superopt.ops._util import ewise, lit

MODERN_OPSET = 9  # the oldest opset the converters are written for
Adapter = Callable[[_Ctx, list, Converter, int], Any]  # (ctx, inputs, converter, the old since_version)

_LEGACY_ATTRS = ("consumed_inputs",)


def _modern(c: _Ctx, drop: tuple[str, ...] = (), **changes: Any) -> _Ctx:
    """The node's context as an opset-9 node: legacy attributes dropped, ``changes`` applied."""
    attrs = {k: v for k, v in c.attrs.items() if k not in _LEGACY_ATTRS + drop}
    attrs.update(changes)
    return _Ctx(c.b, MODERN_OPSET, c.node, attrs)


def _same(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """An old version whose values are those of the opset-9 version (it differs in types allowed,
    optional outputs it lacks, or the ``consumed_inputs`` hint only)."""
    return conv(_modern(c, drop=("output_sequence",)), x)


def _bcast(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Binary ops before opset 7: with ``broadcast=1`` B's shape is a contiguous run of A's shape starting at
    ``axis`` (suffix-aligned when ``axis`` is unset) or B has one element; otherwise the shapes are equal."""
    a, bt = x[0], x[1]
    sa, sb = tuple(c.b.shape(a)), tuple(c.b.shape(bt))
    op = c.node.op_type
    if not c.attr("broadcast", 0):
        if sa != sb:
            raise OnnxImportError(f"{op} before opset 7 without broadcast=1 needs operands of one shape, "
                                  f"got {sa} and {sb}")
        return conv(_modern(c, drop=("broadcast", "axis")), x)
    ra, rb = len(sa), len(sb)
    if int(np.prod(sb, dtype=np.int64)) == 1:
        if rb > ra:
            bt = ops.reshape(c.b, bt, [1] * ra)
        return conv(_modern(c, drop=("broadcast", "axis")), [a, bt])
    axis = c.attr("axis")
    axis = ra - rb if axis is None else int(axis) + (ra if int(axis) < 0 else 0)
    if not (0 <= axis and axis + rb <= ra and sa[axis:axis + rb] == sb):
        raise OnnxImportError(f"{op} before opset 7 with broadcast=1: B of shape {sb} is not the part of A's shape "
                              f"{sa} that starts at axis {axis}")
    if axis + rb != ra:
        bt = ops.reshape(c.b, bt, [1] * axis + list(sb) + [1] * (ra - axis - rb))
    return conv(_modern(c, drop=("broadcast", "axis")), [a, bt])


def _same_shapes(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Sum/Max/Min/Mean before opset 8: every input has one shape (no broadcasting)."""
    shapes = {tuple(c.b.shape(t)) for t in x}
    if len(shapes) > 1:
        raise OnnxImportError(f"{c.node.op_type} before opset 8 needs inputs of one shape, got {sorted(shapes)}")
    return conv(_modern(c), x)


def _gemm(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Gemm-1/6: C is broadcast to (M, N) only with ``broadcast=1``; otherwise it must be (M, N)."""
    if not c.attr("broadcast", 0):
        sa, sb = c.b.shape(x[0]), c.b.shape(x[1])
        m = sa[1] if c.attr("transA", 0) else sa[0]
        n = sb[0] if c.attr("transB", 0) else sb[1]
        if tuple(c.b.shape(x[2])) != (m, n):
            raise OnnxImportError(f"Gemm before opset 7 without broadcast=1 needs C of shape {(m, n)}, "
                                  f"got {tuple(c.b.shape(x[2]))}")
    return conv(_modern(c, drop=("broadcast",)), x)


def _prelu(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """PRelu-1/6: the slope is one value shared by every element, or of X's shape."""
    sx, ss = tuple(c.b.shape(x[0])), tuple(c.b.shape(x[1]))
    if int(np.prod(ss, dtype=np.int64)) != 1 and ss != sx:
        raise OnnxImportError(f"PRelu before opset 7 takes a slope of one value or of X's shape {sx}, got {ss}")
    slope = x[1] if len(ss) <= len(sx) else ops.reshape(c.b, x[1], [1] * len(sx))
    return conv(_modern(c), [x[0], slope])


def _batch_norm(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """BatchNormalization-1/6 (``is_test``) and -7 (``spatial``): inference only; ``spatial=0`` normalizes
    each activation with its own statistics, scale and bias, all of shape (C, D1, ..., Dn)."""
    if since < 7 and not c.attr("is_test", 0):
        raise OnnxImportError(f"BatchNormalization-{since} in training mode (is_test=0) is not supported "
                              "(inference only)")
    if any(o for o in c.node.output[1:]):
        raise OnnxImportError(f"BatchNormalization-{since} training outputs (mean, var, saved mean/var) "
                              "are not supported")
    if c.attr("spatial", 1):
        return conv(_modern(c, drop=("is_test", "spatial")), x)
    shape = tuple(c.b.shape(x[0]))
    per = shape[1:]
    params = []
    for t, what in zip(x[1:5], ("scale", "B", "mean", "var"), strict=True):
        if tuple(c.b.shape(t)) != per:
            raise OnnxImportError(f"BatchNormalization with spatial=0 needs {what} of shape {per}, "
                                  f"got {tuple(c.b.shape(t))}")
        params.append(ops.reshape(c.b, t, [1, *per]))
    eps = lit(float(c.attr("epsilon", 1e-5)))
    return ewise(c.b, f"({{0}} - {{3}}) / sqrt({{4}} + {eps}) * {{1}} + {{2}}", [x[0], *params],
                 "batch_norm_per_activation", shape)


def _dropout(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Dropout-1/6: ``is_test=1`` copies the input (the opset-7 inference form); ``is_test=0`` drops at random."""
    if not c.attr("is_test", 0):
        raise OnnxImportError(f"Dropout-{since} in training mode (is_test=0) drops at random; "
                              "only is_test=1 is supported")
    return conv(_modern(c, drop=("is_test",)), x)


def _cast(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Cast-1: ``to`` names the type as a string ("FLOAT", "INT64", ...)."""
    to = c.attr("to")
    name = str(to).upper()
    if name not in onnx.TensorProto.DataType.keys():
        raise OnnxImportError(f"Cast-1 to unknown element type {to!r}")
    return conv(_modern(c, to=int(onnx.TensorProto.DataType.Value(name))), x)


def _concat(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Concat-1: ``axis`` is optional, 1 by default."""
    return conv(_modern(c, axis=int(c.attr("axis", 1))), x)


def _pad(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Pad-1: the pads are called ``paddings``."""
    return conv(_modern(c, drop=("paddings",), pads=list(c.attr("paddings"))), x)


def _reshape(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Reshape-1: the target shape is the ``shape`` attribute."""
    shape = c.attr("shape")
    if shape is None:
        raise OnnxImportError("Reshape-1 has no shape attribute")
    return conv(_modern(c, drop=("shape",)), [x[0], c.b.constant(np.asarray(shape, np.int64), dtype="int64")])


def _split(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Split-1: the part lengths come from the optional second input or the ``split`` attribute; an unset ``axis``
    is 0 (Split-2's stated default; Split-1 states none)."""
    split = c.ints(x[1], "Split-1 split") if len(x) > 1 and x[1] is not None else c.attr("split")
    changes = {"axis": int(c.attr("axis", 0))}
    if split is not None:
        changes["split"] = list(split)
    return conv(_modern(c, **changes), x[:1])


def _tile(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Tile-1: ``tiles`` copies along the one axis ``axis`` (both scalar inputs)."""
    tiles = c.ints(x[1], "Tile-1 tiles")
    axis = c.ints(x[2], "Tile-1 axis")
    rank = len(c.b.shape(x[0]))
    if len(tiles) != 1 or len(axis) != 1 or not -rank <= axis[0] < rank:
        raise OnnxImportError(f"Tile-1 needs one tile count and one axis of a rank-{rank} input, got tiles {tiles}, "
                              f"axis {axis}")
    reps = [1] * rank
    reps[axis[0] % rank] = tiles[0]
    return conv(_modern(c), [x[0], c.b.constant(np.asarray(reps, np.int64), dtype="int64")])


def _upsample(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """Upsample-1 (``height_scale``/``width_scale`` of a 4-D NCHW input, modes nearest/bilinear) and -7 (the
    ``scales`` attribute): the scales become Upsample-9's input."""
    if since == 1:
        if len(c.b.shape(x[0])) != 4:
            raise OnnxImportError(f"Upsample-1 takes a 4-D input, got shape {tuple(c.b.shape(x[0]))}")
        scales = [1.0, 1.0, float(c.attr("height_scale")), float(c.attr("width_scale"))]
    else:
        scales = [float(s) for s in c.attr("scales")]
    t = c.b.constant(np.asarray(scales, np.float32), dtype="float32")
    return conv(_modern(c, drop=("scales", "height_scale", "width_scale")), [x[0], t])


def _lp_pool(c: _Ctx, x: list, conv: Converter, since: int) -> Any:
    """LpPool-1: ``p`` is a float (2.0 by default)."""
    p = float(c.attr("p", 2.0))
    if p != int(p):
        raise OnnxImportError(f"LpPool-1 with a fractional p={p} is not supported")
    if c.attr("kernel_shape") is None:
        raise OnnxImportError("LpPool-1 without kernel_shape is not supported")
    return conv(_modern(c, p=int(p)), x)


# (op, the version's since_version) -> adapter to the op's opset-9 form
ADAPTERS: dict[tuple[str, int], Adapter] = {}
for _op in ("Abs", "Ceil", "Clip", "Elu", "Exp", "Floor", "HardSigmoid", "InstanceNormalization", "LeakyRelu", "Log",
            "Neg", "Reciprocal", "Relu", "Selu", "Sigmoid", "Sqrt", "Tanh"):
    ADAPTERS[(_op, 1)] = _same  # consumed_inputs only
for _key in (("Cast", 6), ("Constant", 1), ("Flatten", 1), ("MatMul", 1), ("Greater", 7), ("Less", 7), ("Gemm", 7),
             ("PRelu", 7), ("MaxPool", 1), ("AveragePool", 1),  # element types, or Indices/count_include_pad added
             ("GRU", 1), ("GRU", 3), ("LSTM", 1), ("RNN", 1)):  # output_sequence: Y is optional unless set
    ADAPTERS[_key] = _same
for _op in ("Add", "Sub", "Mul", "Div"):
    ADAPTERS[(_op, 1)] = ADAPTERS[(_op, 6)] = _bcast
for _op in ("Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"):
    ADAPTERS[(_op, 1)] = _bcast
for _op in ("Sum", "Max", "Min", "Mean"):
    ADAPTERS[(_op, 1)] = ADAPTERS[(_op, 6)] = _same_shapes
ADAPTERS.update({
    ("Gemm", 1): _gemm, ("Gemm", 6): _gemm,
    ("PRelu", 1): _prelu, ("PRelu", 6): _prelu,
    ("BatchNormalization", 1): _batch_norm, ("BatchNormalization", 6): _batch_norm,
    ("BatchNormalization", 7): _batch_norm,
    ("Dropout", 1): _dropout, ("Dropout", 6): _dropout,
    ("Cast", 1): _cast, ("Concat", 1): _concat, ("Pad", 1): _pad, ("Reshape", 1): _reshape, ("Split", 1): _split,
    ("Tile", 1): _tile, ("Upsample", 1): _upsample, ("Upsample", 7): _upsample, ("LpPool", 1): _lp_pool,
})


def since_version(op: str, opset: int) -> int | None:
    """The since_version of ``op``'s schema in effect at ``opset`` (None: no such op at that opset)."""
    try:
        return int(onnx.defs.get_schema(op, opset).since_version)
    except onnx.defs.SchemaError:
        return None


def converter_at(op: str, opset: int, conv: Converter) -> tuple[Converter | None, str | None]:
    """The converter for ``op`` in a model of ``opset``: ``conv`` itself from opset 9 on (or where the op is
    unchanged since), an adapter onto it for an older version, or (None, why not)."""
    if opset >= MODERN_OPSET:
        return conv, None
    old = since_version(op, opset)
    if old is None:
        return None, f"{op} is not an operator of opset {opset}"
    if old == since_version(op, MODERN_OPSET):
        return conv, None
    adapter = ADAPTERS.get((op, old))
    if adapter is None:
        return None, f"no lowering for {op}-{old} (the version at opset {opset})"

    def run(c: _Ctx, x: list) -> Any:
        return adapter(c, x, conv, old)

    return run, None


__all__ = ["ADAPTERS", "MODERN_OPSET", "converter_at", "since_version"]
