"""The optimized graph as an ONNX model that standard ONNX tools open (``optimized.onnx``).

Each fused kernel becomes one node of the custom domain ``ai.superopt`` (op type ``Kernel``) carrying its
index-notation text in the ``text`` attribute (and its schedule trace, when given, in ``schedule``); extern
ops become ``ai.superopt`` nodes named after their kind with their attributes as strings. Graph constants
are initializers, so the file is self-contained. The model is for reading (Netron, onnx.checker, diffing
two optimizations), not for running in another runtime: onnxruntime has no kernels for the custom domain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from superopt.ir.graph import Graph

DOMAIN = "ai.superopt"
_ELEM = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE, "int64": onnx.TensorProto.INT64,
         "int32": onnx.TensorProto.INT32, "bool": onnx.TensorProto.BOOL}


def _value_info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    t = graph.type_of[name]
    return helper.make_tensor_value_info(name, _ELEM[t.dtype], list(t.shape))


def graph_to_onnx(graph: Graph, schedules: Mapping[str, Sequence] | None = None,
                  doc: str = "optimized by superopt") -> onnx.ModelProto:
    nodes = []
    for n in graph.nodes:
        if n.is_extern:
            attrs = {k: str(v) for k, v in n.op.attrs}
            nodes.append(helper.make_node(n.op.kind, list(n.inputs), list(n.outputs), name=n.name, domain=DOMAIN,
                                          **attrs))
            continue
        attrs = {"text": n.op.text(), "local_inputs": ",".join(n.op.inputs), "local_outputs": ",".join(n.op.outputs)}
        if schedules is not None and n.name in schedules:
            attrs["schedule"] = "; ".join(repr(p) for p in schedules[n.name])
        nodes.append(helper.make_node("Kernel", list(n.inputs), list(n.outputs), name=n.name, domain=DOMAIN, **attrs))
    produced = {o for n in graph.nodes for o in n.outputs}
    inits = [numpy_helper.from_array(np.asarray(c.array), name) for name, c in graph.constants]
    value_info = [_value_info(graph, t) for t in sorted(produced - set(graph.outputs))]
    g = helper.make_graph(nodes, graph.name, [_value_info(graph, i) for i in graph.inputs],
                          [_value_info(graph, o) for o in graph.outputs], inits, value_info=value_info)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)],
                              producer_name="superopt", doc_string=doc)
    model.ir_version = 8
    return model


__all__ = ["DOMAIN", "graph_to_onnx"]
