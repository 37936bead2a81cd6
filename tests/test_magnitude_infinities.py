import warnings

import numpy as np
from onnx import TensorProto, helper

from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.interp.magnitude import reference_with_magnitudes


def test_an_infinite_padding_passed_through_an_extern_keeps_the_magnitudes_finite():
    """A tensor padded with -inf for a max pool and reshaped by an extern: the perturbed copies keep its
    infinities exact (inf - inf would make every magnitude downstream NaN, and the check meaningless)."""
    nodes = [helper.make_node("Pad", ["x", "p", "v"], ["y"], mode="constant"),
             helper.make_node("Reshape", ["y", "s"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["z"], kernel_shape=[3, 3])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 1, 6, 6])],
                          initializer=[helper.make_tensor("p", TensorProto.INT64, [8], [0, 0, 1, 1, 0, 0, 1, 1]),
                                       helper.make_tensor("v", TensorProto.FLOAT, [], [-np.inf]),
                                       helper.make_tensor("s", TensorProto.INT64, [4], [2, 1, 8, 8])])
    graph = import_onnx_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph
    assert any(n.is_extern and n.op.kind == "reshape" for n in graph.nodes)
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ref, mags = reference_with_magnitudes(graph, {graph.inputs[0]: x})
    (out,) = graph.outputs
    assert np.isfinite(ref[out]).all() and np.isfinite(mags[out]).all()
