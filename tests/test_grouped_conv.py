"""A grouped conv split into one conv per group by the layout pass, then blocked: same output as onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite_rules import RuleNotApplicable
from rewrite_rules.grouped_conv import SPLIT_GROUPED_CONV, analyse, split_where
from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.interp.reference import evaluate


def _grouped(cin: int, cout: int, k: int, hw: int, groups: int) -> onnx.ModelProto:
    rng = np.random.default_rng(groups)
    w = numpy_helper.from_array((rng.standard_normal((cout, cin // groups, k, k)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, group=groups),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, hw, hw])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_split_is_exact_and_only_where_the_groups_fill_blocks():
    graph = import_onnx_model(_grouped(32, 64, 3, 6, 2)).graph
    (site,) = SPLIT_GROUPED_CONV.sites(graph)
    gc = analyse(graph, next(n for n in graph.nodes if n.name == site[0]))
    assert (gc.groups, gc.in_per_group, gc.out_per_group) == (2, 16, 32)
    split = split_where(graph, 16)
    assert sum("_group" in n.name and "slice" not in n.name for n in split.nodes) == 2
    assert split_where(graph, 32) is graph  # 16 input channels per group fill no 32-block: left alone
    x = np.random.default_rng(0).standard_normal((1, 32, 6, 6))
    want = evaluate(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    got = evaluate(split, {split.inputs[0]: x})[split.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_depthwise_conv_is_no_site():
    graph = import_onnx_model(_grouped(32, 32, 3, 6, 32)).graph
    assert SPLIT_GROUPED_CONV.sites(graph) == []
    with pytest.raises(RuleNotApplicable):
        SPLIT_GROUPED_CONV.apply(graph, ("conv",))


def test_the_blocked_layout_runs_a_grouped_conv_as_blocked_convs_matching_onnxruntime():
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session

    model = _grouped(32, 64, 3, 8, 2)
    prog = optimize(model.SerializeToString(), OptimizeConfig(threads=1, layout="nchw16c", cost_model=None))
    names = [n.name for n in prog.executor.graph.nodes]
    assert any(n.endswith("_group0") for n in names) and any(n.endswith("_group1") for n in names)
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(np.float32)
    (want,) = _ort_session(model.SerializeToString(), 1).run(None, {"x": x})
    np.testing.assert_allclose(prog(x)[0], want, rtol=1e-4, atol=1e-4)
