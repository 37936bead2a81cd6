"""ONNX -> superopt Graph (the driver; the per-op converters live in :mod:`superopt.frontends.onnx_ops`).

Checks the opset (1 to the newest the installed onnx knows; op versions older than opset 9 are restated in
their opset-9 form by :mod:`superopt.frontends.onnx_ops.old_versions`), fixes symbolic input dimensions to the
shapes given (:mod:`superopt.frontends.onnx_shapes`), runs ONNX shape inference, folds every node whose
inputs are all constants at import time (Shape of a static tensor, ConstantOfShape, Constant, shape
arithmetic, ...), and maps every other node onto :mod:`superopt.ops` through its converter.

A node with no converter, one whose converter refuses its attributes or types (``OnnxImportError``),
control flow (If, Loop, Scan, as a whole node with its subgraphs) and ops of other domains run through
the fallback (:mod:`superopt.frontends.onnx_fallback`): one opaque ``onnx_node`` extern run by
onnxruntime or ``onnx.reference``; each is listed in ``ImportedModel.fallbacks`` with its reason. In
strict mode such a node is a one-line :class:`OnnxImportError` naming it instead; a node that is not
an ONNX operator at all, or a malformed model, is an error in both modes. float16/bfloat16 graph inputs,
outputs and initializers are held as float32 (computed in float32, cast at the edges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from superopt.builder import GraphBuilder
from superopt.frontends.onnx_fallback import (
    CONTROL_FLOW,
    FLOAT_EDGE_ELEM,
    KIND,
    FallbackNode,
    fallback_inputs,
    infer_node_outputs,
    make_spec,
    onnx_np_dtype,
    outer_scope_reads,
    session,
    superopt_dtype,
)
from superopt.frontends.onnx_ops import CONST_ONLY, CONVERTERS, ELEM, Converter, OnnxImportError, _Ctx
from superopt.frontends.onnx_ops.context import _NeedsConstant, op_key
from superopt.frontends.onnx_ops.old_versions import converter_at
from superopt.frontends.onnx_shapes import declared_inputs, resolve_shapes, specialize, symbolic_inputs
from superopt.interp.reference import evaluate
from superopt.ir.externs import run_time_shaped
from superopt.ir.graph import Graph

MIN_OPSET = 1  # opsets below 9 go through the old-version adapters (onnx_ops.old_versions)
MAX_OPSET = 21  # the newest opset the converters were written against
# Every later opset the installed onnx knows is accepted too: for the ops mapped natively the versions after 21
# add element types (bfloat16, float8, int4, ...), which fall back by type; new ops fall back by op.
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
    dtype = superopt_dtype(tt.elem_type)
    if dtype is None:
        raise OnnxImportError(f"{what} {vi.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(tt.elem_type)}")
    if not tt.HasField("shape"):
        raise OnnxImportError(f"{what} {vi.name!r} has no static shape")
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            raise OnnxImportError(f"{what} {vi.name!r} has a symbolic dimension {d.dim_param!r}; static shapes only")
        dims.append(int(d.dim_value))
    return tuple(dims), dtype


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} (outputs {list(node.output)})"


def _to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """A tensor attribute as numpy holds it, of any element type (a converter that puts it in the graph, like
    Constant's, checks the type: TreeEnsemble's uint8 node modes are only read)."""
    try:
        return numpy_helper.to_array(t)
    except Exception as err:  # noqa: BLE001  (numpy has no such type)
        raise OnnxImportError(f"{what} {t.name!r} of element type {onnx.TensorProto.DataType.Name(t.data_type)} cannot "
                              f"be read ({type(err).__name__})") from None


def _edge_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """An initializer as superopt holds it (float16/bfloat16 and small integers widened)."""
    dtype = superopt_dtype(t.data_type)
    if dtype is None:
        raise OnnxImportError(f"{what} {t.name!r} has unsupported element type {onnx.TensorProto.DataType.Name(t.data_type)}")
    # (no copy where the type is already superopt's: the Constant made of it is the one copy kept)
    return np.asarray(numpy_helper.to_array(t)).astype(dtype, copy=False)


@dataclass
class ImportedModel:
    graph: Graph
    input_names: list[str]  # ONNX names of graph.inputs, in order
    output_names: list[str]  # ONNX names of graph.outputs, in order
    output_dtypes: list[str]  # superopt dtypes of graph.outputs
    fallbacks: list[FallbackNode] = field(default_factory=list)  # nodes that run through the ONNX fallback
    output_np_dtypes: list[np.dtype] = field(default_factory=list)  # the model's own output types (float16, ...)
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # ONNX input name -> shape compiled


def check_opset(m: onnx.ModelProto) -> int:
    """The model's default-domain opset; one line naming both versions when it is newer than onnx knows."""
    opset = _opset(m)
    if opset > MAX_ACCEPTED_OPSET:
        raise OnnxImportError(f"the model uses ONNX opset {opset}, newer than the installed onnx {onnx.__version__} "
                              f"knows (opsets {MIN_OPSET} to {MAX_ACCEPTED_OPSET}); upgrade onnx or export at opset "
                              f"{MAX_ACCEPTED_OPSET} or older")
    if opset < MIN_OPSET:
        raise OnnxImportError(f"the model uses ONNX opset {opset}; superopt supports opsets {MIN_OPSET} to "
                              f"{MAX_ACCEPTED_OPSET} (convert it with onnx.version_converter)")
    return opset


_WEIGHT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
_WEIGHT_ELEMENTS = 1024


def _without_weights(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` whose large floating-point initializers are graph inputs of their type and shape instead: ONNX
    shape inference serializes the model and parses its result, so with the weights inside it holds four
    copies of them at once; their values decide no shape (data propagation follows integer tensors)."""
    weights = {t.name for t in m.graph.initializer
               if t.data_type in _WEIGHT_TYPES and int(np.prod(t.dims, dtype=np.int64)) > _WEIGHT_ELEMENTS}
    if not weights:
        return m
    light = onnx.ModelProto()
    for fd, value in m.ListFields():
        if fd.name != "graph":
            _copy_field(light, fd, value)
    for fd, value in m.graph.ListFields():
        if fd.name == "initializer":
            light.graph.initializer.extend(t for t in value if t.name not in weights)
        else:
            _copy_field(light.graph, fd, value)
    declared = {vi.name for vi in m.graph.input}
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in m.graph.initializer if t.name in weights and t.name not in declared)
    return light


def _copy_field(dst, fd, value) -> None:
    if fd.is_repeated:
        getattr(dst, fd.name).extend(value)
    elif fd.type == fd.TYPE_MESSAGE:
        getattr(dst, fd.name).CopyFrom(value)
    else:
        setattr(dst, fd.name, value)


def _infer_shapes(m: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference, strict for models in the default domain (a malformed model is an error);
    lenient where other domains appear (their ops may have no schema here: they fall back)."""
    custom = any(n.domain not in ("", "ai.onnx") for n in m.graph.node)
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=not custom, data_prop=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    filled = _with_default_attributes(m)
    if filled is not None:  # ONNX's inference of a function-bodied op can fail on an attribute left at its default
        try:                # (MeanVarianceNormalization-13's body reads ``axes`` by reference): the same model, stated
            return onnx.shape_inference.infer_shapes(filled, strict_mode=not custom, data_prop=True)
        except Exception:  # noqa: BLE001  (the first error is the one to report)
            pass
    raise OnnxImportError(f"ONNX shape inference failed: {first}")


def _with_default_attributes(m: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``m`` whose default-domain nodes state every attribute their schema gives a default for
    (the same model); None when nothing is missing."""
    opset = _opset(m)
    out = onnx.ModelProto()
    out.CopyFrom(m)
    changed = False
    for node in out.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        have = {a.name for a in node.attribute}
        for name, a in schema.attributes.items():
            if name not in have and a.default_value.name:  # a default is stated
                d = onnx.AttributeProto()
                d.CopyFrom(a.default_value)
                d.name = name
                node.attribute.append(d)
                changed = True
    return out if changed else None


def _native_reason(node: onnx.NodeProto, conv: Converter | None) -> str | None:
    """Why a node cannot go to a converter at all (None: try its converter)."""
    if node.domain not in ("", "ai.onnx") and conv is None:
        return f"operator domain {node.domain!r}"
    if conv is None and (node.op_type in CONTROL_FLOW or any(a.type in (onnx.AttributeProto.GRAPH,
                                                                        onnx.AttributeProto.GRAPHS) for a in node.attribute)):
        return "control flow"
    if conv is None:
        return "no native lowering"
    return None


def _short_reason(msg: str, where: str, label: str) -> str:
    """A converter's error as a report reason: the node's name and op stripped off the front."""
    for prefix in (f"{where}: ", f"cannot import {where}: "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg.replace(f" at node {label!r}", "")


def import_onnx_model(model: str | Path | bytes | onnx.ModelProto, bind: Mapping[str, np.ndarray] | None = None, *,
                      shapes: Mapping[str, Sequence[int]] | None = None, strict: bool = True,
                      example: Mapping[str, np.ndarray] | None = None) -> ImportedModel:
    """Import with details.

    ``bind`` gives run-time values to treat as constants (shape-like inputs). ``shapes`` fixes the
    symbolic dimensions of inputs (ONNX name -> shape; see :mod:`superopt.frontends.onnx_shapes`).
    With ``strict`` (the default here; ``superopt.optimize`` passes ``strict=False``) a node with no native
    lowering is a one-line error naming it; otherwise it runs through the ONNX fallback
    (:mod:`superopt.frontends.onnx_fallback`) and is listed in ``fallbacks``. ``example`` (ONNX input
    name -> array) lets a fallback node whose output shape depends on input values be run once to learn it.
    """
    m = _load(model)
    opset = check_opset(m)
    sym = symbolic_inputs(m)
    wanted = {n: s for n, s in (shapes or {}).items()}
    for n, v in (bind or {}).items():
        wanted.setdefault(n, np.shape(v))
    for n, v in (example or {}).items():
        if n in sym:
            wanted.setdefault(n, np.shape(v))
    if sym or wanted:
        m = specialize(m, resolve_shapes(m, {n: s for n, s in wanted.items() if n in declared_inputs(m)}))
    init = {t.name: t for t in m.graph.initializer}
    m = _infer_shapes(_without_weights(m))  # (the weights are read from the model as given)
    g = m.graph
    opsets = [(o.domain, int(o.version)) for o in m.opset_import]
    b = GraphBuilder(_clean_name(g.name or "onnx"))
    env: dict[str, str] = {}
    elem_of: dict[str, int] = {}  # ONNX element type of every tensor in env
    for name, t in init.items():
        a = _edge_array(t, "initializer")
        env[name] = b.constant(a, name, dtype=a.dtype.name)
        elem_of[name] = t.data_type
    bind = dict(bind or {})
    input_names, input_shapes = [], {}
    for vi in g.input:
        if vi.name in init:
            continue
        shape, dtype = _tensor_type(vi, "graph input")
        elem_of[vi.name] = vi.type.tensor_type.elem_type
        input_shapes[vi.name] = shape
        if vi.name in bind:
            env[vi.name] = b.constant(np.asarray(bind[vi.name]).astype(dtype).reshape(shape), vi.name, dtype=dtype)
            continue
        env[vi.name] = b.input(vi.name, shape, dtype)
        input_names.append(vi.name)
    value_types = {vi.name: vi for vi in list(g.value_info) + list(g.output)}
    only_outputs = {o.name for o in g.output} - {i for n in g.node for i in [*n.input, *outer_scope_reads(n)]}
    fallbacks: list[FallbackNode] = []
    for i, node in enumerate(g.node):
        label = _node_label(node, i)
        where = f"{node.op_type} node {label!r} (opset {opset})"
        default = node.domain in ("", "ai.onnx")
        conv = CONVERTERS.get(op_key(node.domain, node.op_type))
        reason = _native_reason(node, conv)
        if reason is None and default:
            conv, reason = converter_at(node.op_type, opset, conv)
        if reason is None and any(elem_of.get(n) not in ELEM and elem_of.get(n) not in FLOAT_EDGE_ELEM
                                  for n in node.input if n):
            reason = "element type " + ", ".join(sorted({onnx.TensorProto.DataType.Name(elem_of[n]) for n in node.input
                                                         if n and elem_of.get(n) not in ELEM}))
        if reason is not None and node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            raise OnnxImportError(f"unsupported ONNX op {node.op_type!r} at node {label!r} (opset {opset}): "
                                  "no such operator in the ONNX standard")
        outs = None
        if reason is None:
            mark = len(b.nodes)
            try:
                outs = _convert(b, opset, node, conv, env, label, where)
                _check_outputs(b, node, outs, value_types, where, b.nodes[mark:], only_outputs)
            except OnnxImportError as err:
                if strict:
                    raise
                del b.nodes[mark:]  # drop what the converter added before it gave up
                reason, outs = _short_reason(str(err), where, label), None
        if outs is None:
            if strict:
                raise OnnxImportError(f"{where} has no native lowering ({reason}); strict mode allows no fallback")
            n_nodes = len(b.nodes)
            outs = _fallback(b, m, node, opsets, env, elem_of, value_types, label, example)
            if len(b.nodes) > n_nodes:  # not folded at import time: it runs at run time
                fallbacks.append(FallbackNode(label, node.op_type if node.domain in ("", "ai.onnx")
                                              else f"{node.domain}.{node.op_type}", reason))
        for o, t in zip(node.output, outs, strict=False):
            if o:
                env[o] = t
                elem_of.setdefault(o, _elem(value_types.get(o), b.type(t).dtype))
    outputs, out_names, out_dtypes, out_np = [], [], [], []
    for vi in g.output:
        if vi.name not in env:
            raise OnnxImportError(f"graph output {vi.name!r} is never computed")
        outputs.append(env[vi.name])
        out_names.append(vi.name)
        out_dtypes.append(b.type(env[vi.name]).dtype)
        e = vi.type.tensor_type.elem_type or elem_of.get(vi.name)
        out_np.append(onnx_np_dtype(e) if e else b.type(env[vi.name]).np_dtype)
    return ImportedModel(b.build(outputs), input_names, out_names, out_dtypes, fallbacks, out_np, input_shapes)


def _elem(vi: onnx.ValueInfoProto | None, dtype: str) -> int:
    if vi is not None and vi.type.tensor_type.elem_type:
        return int(vi.type.tensor_type.elem_type)
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _convert(b: GraphBuilder, opset: int, node: onnx.NodeProto, conv: Converter, env: dict[str, str], label: str,
             where: str) -> list[str]:
    try:
        attrs = {a.name: _attr_value(a) for a in node.attribute}
        ins = []
        for n in [*node.input, *outer_scope_reads(node)]:  # a subgraph's reads from this graph follow the inputs
            if n == "":
                ins.append(None)
            elif n not in env:
                raise OnnxImportError(f"input {n!r} is not defined before it is used")
            else:
                ins.append(env[n])
        while ins and ins[-1] is None:
            ins.pop()
        ctx = _Ctx(b, opset, node, attrs)
        folding = all(b.const_value(t) is not None for t in ins if t is not None) and node.op_type not in CONST_ONLY
        outs = _fold(ctx, conv, ins) if folding else conv(ctx, ins)
    except OnnxImportError as err:
        msg = str(err)
        msg = msg if label in msg else f"{where}: {msg}"
        if isinstance(err, _NeedsConstant):  # name the ONNX tensor it needs (the backend binds the inputs behind it)
            onnx_name = next((k for k, v in env.items() if v == err.tensor), None) if err.tensor else None
            raise _NeedsConstant(msg, tensor=onnx_name) from None
        raise OnnxImportError(msg) from None
    except Exception as err:
        raise OnnxImportError(f"cannot import {where}: {type(err).__name__}: {err}") from None
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _check_outputs(b: GraphBuilder, node: onnx.NodeProto, outs: list[str], value_types: dict, where: str,
                   added: Sequence = (), only_outputs: set[str] = frozenset()) -> None:
    """Outputs as ONNX types them. Where ``added`` (the converter's nodes) gives an output whose shape is known
    only at run time, only its rank is checked (its extents are upper bounds), and it must be one of
    ``only_outputs`` (graph outputs no node reads)."""
    names = list(node.output)
    run_time = {t for n in added for t, dynamic in zip(n.outputs, run_time_shaped(n)) if dynamic}
    for o, t in zip(names, outs, strict=False):
        if o and t in run_time and o not in only_outputs:
            raise OnnxImportError(f"{where}: output {o!r} has a shape known only at run time (it depends on input "
                                  "values), so it can only be a graph output that no node reads")
    if len(outs) < len([o for o in names if o]):
        raise OnnxImportError(f"{where}: produced {len(outs)} outputs but the node has {len(names)}")
    for o, t in zip(names, outs, strict=False):
        if not o:
            continue
        vi = value_types.get(o)
        if vi is not None and vi.type.tensor_type.HasField("shape"):
            want = tuple(d.dim_value if d.HasField("dim_value") and t not in run_time else -1
                         for d in vi.type.tensor_type.shape.dim)
            got = b.shape(t)
            if len(want) != len(got) or any(w not in (-1, gg) for w, gg in zip(want, got, strict=False)):
                raise OnnxImportError(f"{where}: output {o!r} has shape {got} but ONNX infers {want}")


def _fallback(b: GraphBuilder, m: onnx.ModelProto, node: onnx.NodeProto, opsets: list[tuple[str, int]],
              env: dict[str, str], elem_of: dict[str, int], value_types: dict, label: str,
              example: Mapping[str, np.ndarray] | None) -> list[str]:
    """Add ``node`` as one ``onnx_node`` extern (folded to constants when every input is a constant)."""
    where = f"{node.op_type} node {label!r}"
    names = fallback_inputs(node)
    missing = [n for n in names if n not in env]
    if missing:
        raise OnnxImportError(f"{where}: input {missing[0]!r} is not defined before it is used")
    ins = [(n, elem_of[n], b.shape(env[n])) for n in names]
    consts = {n: b.const_value(env[n]) for n in names if b.const_value(env[n]) is not None}
    domains = _domains(node) | {""}
    used_opsets = [(d, v) for d, v in opsets if d in domains or (d == "ai.onnx" and "" in domains)]
    functions = [f for f in m.functions if f.domain in domains]
    outs = [o for o in node.output if o]
    known: list[tuple[int, tuple[int, ...]] | None] = []
    for o in outs:
        vi = value_types.get(o)
        tt = vi.type.tensor_type if vi is not None and vi.type.HasField("tensor_type") else None
        ok = tt is not None and tt.elem_type and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
        known.append((int(tt.elem_type), tuple(int(d.dim_value) for d in tt.shape.dim)) if ok else None)
    if any(k is None for k in known):
        again = infer_node_outputs(node, used_opsets, ins, consts, functions)
        known = [k if k is not None else a for k, a in zip(known, again)]
    if any(k is None for k in known) or len(consts) == len(names):
        values = _node_input_values(b, names, env, consts, example,
                                     synthetic=node.op_type in CONTROL_FLOW or node.domain not in ("", "ai.onnx"))
        if values is None:
            bad = outs[[k is None for k in known].index(True)]
            raise OnnxImportError(f"{where}: ONNX cannot infer the shape of its output {bad!r} and it has no "
                                  "native lowering; give example inputs (arrays) so it can be run once to learn it")
        probe = make_spec(node, used_opsets, ins, [(o, k[0] if k else 1, k[1] if k else ()) for o, k in zip(outs, known)],
                          functions, m.ir_version)
        got = session(probe).run({n: np.asarray(values[n]).astype(onnx_np_dtype(e), copy=False) for n, e, _ in ins})
        known = [(k[0] if k else int(helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype)), tuple(np.shape(v)))
                 for k, v in zip(known, got)]
        if len(consts) == len(names) and all(superopt_dtype(e) for e, _ in known):  # constant inputs: fold now
            return [b.constant(np.asarray(v).astype(superopt_dtype(e)), dtype=superopt_dtype(e))
                    for v, (e, _) in zip(got, known)]
    for o, (e, _) in zip(outs, known):
        if superopt_dtype(e) is None:
            raise OnnxImportError(f"{where}: output {o!r} has element type {onnx.TensorProto.DataType.Name(e)}, "
                                  "which superopt cannot hold")
    spec = make_spec(node, used_opsets, ins, [(o, e, s) for o, (e, s) in zip(outs, known)], functions, m.ir_version)
    res = b.extern(KIND, [env[n] for n in names], name=_clean_name(f"onnx_{node.op_type}"), spec=spec)
    it = iter(res)
    return [next(it) if o else "" for o in node.output]


def _domains(node: onnx.NodeProto) -> set[str]:
    out = {"" if node.domain == "ai.onnx" else node.domain}
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                out |= _domains(n)
    return out


def _node_input_values(b: GraphBuilder, names: list[str], env: dict[str, str], consts: dict[str, np.ndarray],
                       example: Mapping[str, np.ndarray] | None, synthetic: bool = False) -> dict[str, np.ndarray] | None:
    """The node's input values on the example inputs (the graph so far run by the reference interpreter);
    None when a value needs graph inputs that have no example. With ``synthetic`` (control flow and ops of
    other domains, whose output shapes ONNX leaves open though they rarely depend on values) missing
    examples are made up:
    seeded normal floats, zero integers; the extern still checks the shapes at run time."""
    if len(consts) == len(names):
        return dict(consts)
    feed = {env[k]: np.asarray(v) for k, v in (example or {}).items() if k in env}
    rng = np.random.default_rng(0)
    for n in b.inputs:
        if n not in feed:
            if not synthetic:
                return None
            t = b.type(n)
            feed[n] = rng.standard_normal(t.shape).astype(t.np_dtype) if t.dtype.startswith("float") else \
                np.zeros(t.shape, t.np_dtype)
    g = b.build([env[n] for n in names])
    vals = evaluate(g, feed, dtype=np.float64, keep_intermediates=True)
    return {n: np.asarray(vals[env[n]]) for n in names}


def import_onnx(model: str | Path | bytes | onnx.ModelProto, *, strict: bool = False,
                shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import an ONNX model (path, serialized bytes or ModelProto) as a superopt Graph; nodes with no
    native lowering run through the ONNX fallback unless ``strict``."""
    return import_onnx_model(model, strict=strict, shapes=shapes).graph


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
