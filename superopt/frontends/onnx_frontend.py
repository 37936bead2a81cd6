"""ONNX -> superopt Graph (the driver; the per-op converters live in :mod:`superopt.frontends.onnx_ops`).

Runs ONNX shape inference, folds every node whose inputs are all constants at import time (Shape of a
static tensor, ConstantOfShape, Constant, shape arithmetic, ...), and maps every other node onto
:mod:`superopt.ops`. Supported opsets: 9 to 21 of the default domain. Anything else fails with a one-line
:class:`OnnxImportError` naming the op type, node and opset; no node is ever skipped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from superopt.builder import GraphBuilder
from superopt.frontends.onnx_ops import CONST_ONLY, CONVERTERS, ELEM, Converter, OnnxImportError, _Ctx
from superopt.frontends.onnx_ops.context import _NeedsConstant
from superopt.interp.reference import evaluate
from superopt.ir.graph import Graph

MIN_OPSET, MAX_OPSET = 9, 21
# Later opsets (up to the installed onnx) are accepted: for every op mapped here the versions after 21 only
# add element types (bfloat16, float8, int4, ...), which the importer rejects by type anyway.
MAX_ACCEPTED_OPSET = max(MAX_OPSET, onnx.defs.onnx_opset_version())


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
            f"cannot parse ONNX model from {what}: not a valid (or a truncated) ONNX protobuf ({type(err).__name__})"
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
    if tt.elem_type not in ELEM:
        raise OnnxImportError(f"{what} {vi.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(tt.elem_type)}")
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} {vi.name!r} has no static shape")
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            raise OnnxImportError(f"{what} {vi.name!r} has a symbolic dimension {d.dim_param!r}; static shapes only")
        dims.append(int(d.dim_value))
    return tuple(dims), ELEM[tt.elem_type]


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} (outputs {list(node.output)})"


def _to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    if t.data_type not in ELEM:
        raise OnnxImportError(f"{what} {t.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(t.data_type)}")
    return numpy_helper.to_array(t)


@dataclass
class ImportedModel:
    graph: Graph
    input_names: list[str]  # ONNX names of graph.inputs, in order
    output_names: list[str]  # ONNX names of graph.outputs, in order
    output_dtypes: list[str]


def import_onnx_model(model: str | Path | bytes | onnx.ModelProto, bind: Mapping[str, np.ndarray] | None = None) -> ImportedModel:
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
            env[vi.name] = b.constant(np.asarray(bind[vi.name]).astype(dtype).reshape(shape), vi.name, dtype=dtype)
            continue
        env[vi.name] = b.input(vi.name, shape, dtype)
        input_names.append(vi.name)
    value_types = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
    for i, node in enumerate(g.node):
        label = _node_label(node, i)
        where = f"{node.op_type} node {label!r} (opset {opset})"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"unsupported op {node.domain}.{node.op_type} at node {label!r} (opset {opset})")
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
            folding = all(b.const_value(t) is not None for t in ins if t is not None) and node.op_type not in CONST_ONLY
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
                want = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim)
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
    local = [None if t is None else sb.constant(b.const_value(t), dtype=b.const_value(t).dtype.name) for t in ins]
    outs = conv(_Ctx(sb, ctx.opset, ctx.node, ctx.attrs), local)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    g = sb.build(outs)
    vals = evaluate(g, {}, dtype=np.float64)
    res = []
    for o in outs:
        v = vals[o].astype(sb.type(o).np_dtype)
        res.append(b.constant(v, dtype=v.dtype.name))
    return res
