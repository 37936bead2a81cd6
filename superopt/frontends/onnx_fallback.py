"""The fallback: an ONNX node superopt cannot lower runs as one opaque extern node of kind ``onnx_node``.

The extern holds an :class:`OnnxNodeSpec` (the serialized NodeProto, the model's opset imports, its
local functions, and the element types and shapes of its inputs and outputs; hashable, with a short
repr) and runs the node as a one-node model: through onnxruntime when it is installed and takes the
node (it is the faster of the two), otherwise through ``onnx.reference.ReferenceEvaluator``, the onnx
package's own numpy evaluator. The session is built once per spec and cached. Control flow (If, Loop,
Scan) falls back as a whole node: the values its subgraphs read from the outer scope become explicit
inputs of the one-node model.

Element types superopt does not hold (float16, bfloat16, int8, uint8, ...) are widened on the superopt
side (floats to float32, integers to int32/int64); the extern narrows its inputs back to the node's
ONNX types before it runs the node and widens its outputs after.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from superopt.ir.externs import register
from superopt.ir.types import TensorType

KIND = "onnx_node"
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})

# ONNX element types superopt holds as they are, and the wider superopt type for the others
NATIVE_ELEM = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}
WIDENED_ELEM = {
    onnx.TensorProto.FLOAT16: "float32",
    onnx.TensorProto.BFLOAT16: "float32",
    onnx.TensorProto.INT8: "int32",
    onnx.TensorProto.UINT8: "int32",
    onnx.TensorProto.INT16: "int32",
    onnx.TensorProto.UINT16: "int32",
    onnx.TensorProto.UINT32: "int64",
    onnx.TensorProto.UINT64: "int64",
}
FLOAT_EDGE_ELEM = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)  # computed in float32, even natively


def superopt_dtype(elem: int) -> str | None:
    """The superopt dtype holding ONNX element type ``elem`` (None: none can, e.g. strings)."""
    return NATIVE_ELEM.get(elem) or WIDENED_ELEM.get(elem)


def onnx_np_dtype(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


class FallbackError(ValueError):
    """A node that cannot run as a fallback either (no ONNX schema, an untyped output, ...)."""

    def __init__(self, msg: str) -> None:
        super().__init__(" ".join(str(msg).split()))


@dataclass(frozen=True)
class FallbackNode:
    """One node of the model that runs through the fallback, and why (for the report)."""

    node: str  # the node's name (or its index and outputs)
    op: str  # the op type, domain-qualified outside the default domain
    reason: str

    def __str__(self) -> str:
        return f"{self.op} node {self.node!r} ({self.reason})"


@dataclass(frozen=True)
class OnnxNodeSpec:
    """Everything needed to run one ONNX node on its own; equal specs share one cached session."""

    node: bytes  # serialized NodeProto
    opsets: tuple[tuple[str, int], ...]  # the model's opset imports (domain, version)
    inputs: tuple[str, ...]  # ONNX names of the one-node model's inputs, one per extern input
    input_elems: tuple[int, ...]  # their ONNX element types
    input_shapes: tuple[tuple[int, ...], ...]
    outputs: tuple[str, ...]  # ONNX names of the node's outputs, one per extern output ("" skipped)
    output_elems: tuple[int, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    functions: tuple[bytes, ...] = ()  # serialized model-local FunctionProtos the node may call
    ir_version: int = onnx.IR_VERSION

    @functools.cached_property
    def proto(self) -> onnx.NodeProto:
        n = onnx.NodeProto()
        n.ParseFromString(self.node)
        return n

    def __repr__(self) -> str:
        p = self.proto
        digest = hashlib.sha256(self.node).hexdigest()[:12]
        return f"OnnxNodeSpec({p.domain + '.' if p.domain else ''}{p.op_type} #{digest})"

    def output_types(self) -> list[TensorType]:
        return [TensorType(s, superopt_dtype(e)) for s, e in zip(self.output_shapes, self.output_elems)]

    def model(self) -> onnx.ModelProto:
        """The one-node model: graph inputs ``inputs``, outputs the node's named outputs."""
        ins = [helper.make_tensor_value_info(n, e, s) for n, e, s in zip(self.inputs, self.input_elems, self.input_shapes)]
        outs = [helper.make_tensor_value_info(n, e, s)
                for n, e, s in zip(self.outputs, self.output_elems, self.output_shapes)]
        graph = helper.make_graph([self.proto], "fallback", ins, outs)
        funcs = []
        for data in self.functions:
            f = onnx.FunctionProto()
            f.ParseFromString(data)
            funcs.append(f)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets], functions=funcs)
        m.ir_version = self.ir_version
        return m


# ---- running a node ---------------------------------------------------------------------------------
_THREADS = [1]  # onnxruntime intra-op threads per fallback session (set_threads; superopt.optimize sets its own count)


def set_threads(n: int) -> None:
    """Threads for fallback nodes run by onnxruntime from now on (its workers sleep when idle: no spinning)."""
    _THREADS[0] = max(1, int(n))


class _Session:
    """One node's runner: onnxruntime when it takes the node, else onnx.reference."""

    def __init__(self, spec: OnnxNodeSpec, threads: int = 1) -> None:
        model = spec.model()
        self.spec = spec
        self.engine = ""
        self._ort = None
        self._ref = None
        try:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.log_severity_level = 4
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._ort = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            self.engine = "onnxruntime"
            return
        except Exception:  # noqa: BLE001 - not installed, or it lacks the op/opset: the reference evaluator next
            self._ort = None
        from onnx.reference import ReferenceEvaluator

        try:
            self._ref = ReferenceEvaluator(model)
        except Exception as err:  # noqa: BLE001
            p = spec.proto
            raise FallbackError(f"neither onnxruntime nor onnx.reference can run {p.op_type} node {p.name!r}: "
                                f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
                                ) from None
        self.engine = "onnx.reference"

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = list(self.spec.outputs)
        if self._ort is not None:
            return self._ort.run(names, feed)
        return self._ref.run(names, feed)


def session(spec: OnnxNodeSpec) -> _Session:
    return _session(spec, _THREADS[0])


@functools.lru_cache(maxsize=4096)
def _session(spec: OnnxNodeSpec, threads: int) -> _Session:
    return _Session(spec, threads)


def run_node(spec: OnnxNodeSpec, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the node on superopt-side arrays; returns superopt-side arrays of the declared shapes."""
    feed = {n: np.asarray(x).astype(onnx_np_dtype(e), copy=False) for n, x, e in zip(spec.inputs, xs, spec.input_elems)}
    outs = session(spec).run(feed)
    res = []
    for name, v, e, shape in zip(spec.outputs, outs, spec.output_elems, spec.output_shapes):
        v = np.asarray(v)
        if tuple(v.shape) != tuple(shape):
            p = spec.proto
            raise FallbackError(f"{p.op_type} node {p.name!r} output {name!r} has shape {tuple(v.shape)} at run time "
                                f"but it was compiled for {tuple(shape)} (its shape depends on input values)")
        res.append(v.astype(superopt_dtype(e), copy=False))
    return res


def _evaluate(xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    return run_node(attrs["spec"], xs)


def _infer(types: Sequence[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return attrs["spec"].output_types()


register(KIND, _evaluate, _infer)


# ---- building specs ---------------------------------------------------------------------------------
def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def outer_scope_reads(node: onnx.NodeProto) -> list[str]:
    """Names the node's subgraphs (recursively) read from the enclosing graph, in first-use order (node inputs,
    then subgraph outputs that name an enclosing-graph value)."""
    seen: dict[str, None] = {}

    def walk(g: onnx.GraphProto, bound: set[str]) -> None:
        bound = bound | {i.name for i in g.input} | {t.name for t in g.initializer} | \
            {t.name for t in g.sparse_initializer}
        for n in g.node:
            for i in n.input:
                if i and i not in bound:
                    seen.setdefault(i, None)
            for sub in _subgraphs(n):
                walk(sub, bound)
            bound |= set(n.output)
        for o in g.output:  # an output may name an enclosing-graph value directly
            if o.name not in bound:
                seen.setdefault(o.name, None)

    for g in _subgraphs(node):
        walk(g, set())
    return list(seen)


def fallback_inputs(node: onnx.NodeProto) -> list[str]:
    """The one-node model's inputs: the node's present inputs (each once), then its outer-scope reads."""
    names = dict.fromkeys(n for n in node.input if n)
    for n in outer_scope_reads(node):
        names.setdefault(n, None)
    return list(names)


def infer_node_outputs(node: onnx.NodeProto, opsets: Sequence[tuple[str, int]], ins: Sequence[tuple[str, int, tuple]],
                       consts: dict[str, np.ndarray], functions: Sequence[onnx.FunctionProto] = ()
                       ) -> list[tuple[int, tuple[int, ...]] | None]:
    """ONNX shape inference on the node alone with concrete input shapes (and constant inputs as
    initializers, so shape-carrying inputs are seen): (elem, shape) per output, None where unknown."""
    vis = [helper.make_tensor_value_info(n, e, s) for n, e, s in ins if n not in consts]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    graph = helper.make_graph([node], "infer", vis, [helper.make_empty_tensor_value_info(o) for o in node.output if o],
                              initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], functions=list(functions))
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - unknown output types are handled by the caller
        return [None for o in node.output if o]
    known = {vi.name: vi for vi in list(m.graph.output) + list(m.graph.value_info)}
    res: list[tuple[int, tuple[int, ...]] | None] = []
    for o in node.output:
        if not o:
            continue
        vi = known.get(o)
        tt = vi.type.tensor_type if vi is not None and vi.type.HasField("tensor_type") else None
        if tt is None or not tt.elem_type or not tt.HasField("shape") or \
                any(not d.HasField("dim_value") for d in tt.shape.dim):
            res.append(None)
        else:
            res.append((int(tt.elem_type), tuple(int(d.dim_value) for d in tt.shape.dim)))
    return res


def make_spec(node: onnx.NodeProto, opsets: Sequence[tuple[str, int]], ins: Sequence[tuple[str, int, tuple]],
              outs: Sequence[tuple[str, int, tuple]], functions: Sequence[onnx.FunctionProto] = (),
              ir_version: int = onnx.IR_VERSION) -> OnnxNodeSpec:
    used = {(f.domain, f.name) for f in functions}
    needed = [f.SerializeToString() for f in functions if (f.domain, f.name) in used]
    return OnnxNodeSpec(node.SerializeToString(), tuple((d, int(v)) for d, v in opsets),
                        tuple(n for n, _, _ in ins), tuple(int(e) for _, e, _ in ins), tuple(tuple(s) for _, _, s in ins),
                        tuple(n for n, _, _ in outs), tuple(int(e) for _, e, _ in outs),
                        tuple(tuple(s) for _, _, s in outs), tuple(needed), max(int(ir_version), 3))


def summarize(fallbacks: Sequence[FallbackNode]) -> str:
    """"not optimized: 2 Resize nodes (cubic mode), 1 Loop node (control flow)" (empty when none)."""
    if not fallbacks:
        return ""
    groups: dict[tuple[str, str], int] = {}
    for f in fallbacks:
        groups[(f.op, f.reason)] = groups.get((f.op, f.reason), 0) + 1
    parts = [f"{n} {op} node{'s' if n > 1 else ''} ({reason})" for (op, reason), n in groups.items()]
    return "not optimized: " + ", ".join(parts)


__all__ = ["KIND", "FallbackNode", "FallbackError", "OnnxNodeSpec", "make_spec", "run_node", "session", "set_threads",
           "infer_node_outputs", "fallback_inputs", "outer_scope_reads", "summarize", "superopt_dtype"]
