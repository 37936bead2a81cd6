"""A pointwise conv on NCHW run over one pixel axis (the layout pass): exact, and only where it applies."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite_rules import RuleNotApplicable
from rewrite_rules.pixel_merge import MERGE_PIXELS, merge_pixels_where
from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.interp.reference import evaluate


def _conv_bn_relu(c: int, k: int, hw: int, groups: int) -> onnx.ModelProto:
    """Conv (k x k, ``groups``) -> BatchNormalization -> Relu on [1, c, hw, hw], as ShuffleNet's blocks."""
    rng = np.random.default_rng(groups + k)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c // groups, k, k)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "m"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[k // 2] * 4, group=groups),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_grouped_pointwise_conv_merges_its_pixel_axes_exactly():
    graph = import_onnx_model(_conv_bn_relu(24, 1, 7, 4)).graph
    (site,) = MERGE_PIXELS.sites(graph)
    merged = MERGE_PIXELS.apply(graph, site)
    conv = next(n for n in merged.nodes if n.name == site[0])
    assert all(len(t.shape) == 4 and t.shape[-1] == 49 for t in (merged.type_of[o] for o in conv.outputs))
    assert merged.type_of[conv.inputs[0]].shape == (1, 24, 49)  # the image, a free reshape of x
    x = np.random.default_rng(0).standard_normal((1, 24, 7, 7))
    want = evaluate(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    got = evaluate(merged, {merged.inputs[0]: x})[merged.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k, groups", [(3, 4), (3, 24)])
def test_a_conv_with_a_window_is_no_site(k, groups):
    graph = import_onnx_model(_conv_bn_relu(24, k, 7, groups)).graph
    assert MERGE_PIXELS.sites(graph) == []
    conv = next(n for n in graph.nodes if not n.is_extern)
    with pytest.raises(RuleNotApplicable):
        MERGE_PIXELS.apply(graph, (conv.name,))


def test_rows_that_fill_whole_vectors_are_left_alone():
    graph = import_onnx_model(_conv_bn_relu(24, 1, 16, 4)).graph
    assert MERGE_PIXELS.sites(graph)
    assert merge_pixels_where(graph, 16) is graph  # 16 columns: whole vectors already
    assert merge_pixels_where(graph, 8) is graph
    assert merge_pixels_where(import_onnx_model(_conv_bn_relu(24, 1, 7, 4)).graph, 16) is not graph


def test_the_pipeline_runs_a_grouped_pointwise_conv_over_one_pixel_axis_matching_onnxruntime():
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session

    model = _conv_bn_relu(272, 1, 14, 4)  # ShuffleNet's second stage: 4 groups of 68 channels, 14 x 14
    prog = optimize(model.SerializeToString(), OptimizeConfig(threads=2, cost_model=None, program_cache=False))
    g = prog.executor.graph
    convs = [n for n in g.nodes if not n.is_extern and any(st.reduce == "+=" for st in n.op.statements)]
    assert convs and all(g.type_of[n.outputs[0]].shape[-1] == 196 for n in convs)
    x = np.random.default_rng(1).standard_normal((1, 272, 14, 14)).astype(np.float32)
    (want,) = _ort_session(model.SerializeToString(), 2).run(None, {"x": x})
    got = prog(x)[0]
    assert np.count_nonzero(got) > got.size // 4  # the relu leaves a real output, not a constant
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

