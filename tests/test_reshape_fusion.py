"""A ShuffleNet unit's grouped conv, batch norm, relu and channel shuffle: the elementwise tail after the merging
reshape joins the grouped conv (rewrite_rules/reshape_fusion.py), and the program matches onnxruntime."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rewrite_rules.reshape_fusion import FUSE_THROUGH_RESHAPE
from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.interp.reference import evaluate

GROUPS, CIN, COUT, HW = 4, 24, 32, 6


def _shuffle_unit() -> onnx.ModelProto:
    """Grouped 1x1 conv -> BatchNorm -> Relu -> channel shuffle (reshape, transpose, reshape) -> depthwise 3x3
    conv -> BatchNorm, as ShuffleNet writes it."""
    rng = np.random.default_rng(7)

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)

    inits = [const("w1", rng.standard_normal((COUT, CIN // GROUPS, 1, 1)) * 0.3),
             const("s1", rng.uniform(0.5, 1.5, COUT)), const("b1", rng.standard_normal(COUT) * 0.1),
             const("m1", rng.standard_normal(COUT) * 0.1), const("v1", rng.uniform(0.5, 1.5, COUT)),
             const("w2", rng.standard_normal((COUT, 1, 3, 3)) * 0.3),
             const("s2", rng.uniform(0.5, 1.5, COUT)), const("b2", rng.standard_normal(COUT) * 0.1),
             const("m2", rng.standard_normal(COUT) * 0.1), const("v2", rng.uniform(0.5, 1.5, COUT)),
             numpy_helper.from_array(np.array([1, GROUPS, COUT // GROUPS, HW, HW], np.int64), "shape5"),
             numpy_helper.from_array(np.array([1, COUT, HW, HW], np.int64), "shape4")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], group=GROUPS),
             helper.make_node("BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Reshape", ["r1", "shape5"], ["g5"]),
             helper.make_node("Transpose", ["g5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "shape4"], ["sh"]),
             helper.make_node("Conv", ["sh", "w2"], ["c2"], group=COUT, pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "s2", "b2", "m2", "v2"], ["y"])]
    g = helper.make_graph(nodes, "shuffle_unit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CIN, HW, HW])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, COUT, HW, HW])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _feed(shape=(1, CIN, HW, HW)) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


def test_the_batch_norm_and_shuffle_fuse_through_the_merging_reshape_exactly():
    graph = import_onnx_model(_shuffle_unit()).graph
    from rewrite_rules import rewrite_greedy
    from rewrite_rules.fusion import FUSE_ELEMENTWISE
    from rewrite_rules.movement import INLINE_COPY

    graph = rewrite_greedy(graph, [FUSE_ELEMENTWISE, INLINE_COPY])[0]  # the tails fused as far as they go alone
    sites = FUSE_THROUGH_RESHAPE.sites(graph)
    assert len(sites) == 2  # after the grouped conv and after the depthwise conv
    fused = graph
    for _ in sites:
        fused = FUSE_THROUGH_RESHAPE.apply(fused, FUSE_THROUGH_RESHAPE.sites(fused)[0])
    computes = [n for n in fused.nodes if not n.is_extern]
    assert len(computes) == len([n for n in graph.nodes if not n.is_extern]) - 2
    x = _feed().astype(np.float64)
    want = evaluate(graph, {graph.inputs[0]: x})[graph.outputs[0]]
    got = evaluate(fused, {fused.inputs[0]: x})[fused.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_pipeline_runs_the_unit_as_two_kernels_matching_onnxruntime():
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session

    model = _shuffle_unit()
    # one expansion, the first descent (where a large model's budget ends): the split of the tail's loops
    # alone gains nothing, so only the one move of split and fusion reaches the fused graph
    config = OptimizeConfig(threads=1, cost_model=None, program_cache=False, graph_expansions=1)
    prog = optimize(model.SerializeToString(), config)
    computes = [n for n in prog.executor.graph.nodes if not n.is_extern]
    # the grouped conv with its batch norm, relu and shuffled write-back; the depthwise conv with its batch norm
    # (a layout conversion may surround them where the machine's ceilings favour blocking)
    convs = [n for n in computes if any(st.reduce == "+=" for st in n.op.statements)]
    assert len(convs) == 2
    assert all(len(n.op.statements) >= 2 for n in convs)
    assert len(computes) - len(convs) <= 2
    x = _feed()
    (want,) = _ort_session(model.SerializeToString(), 1).run(None, {"x": x})
    np.testing.assert_allclose(prog(x)[0], want, rtol=1e-4, atol=1e-4)


def test_a_reshape_read_by_an_extern_is_no_site():
    """A merging reshape whose one reader is an extern (here a TopK) offers no loops to split: no site, no error."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 1, 1)) * 0.3).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 8 * 4 * 4], np.int64), "shape")
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["flat"]),
             helper.make_node("TopK", ["flat", "k"], ["v", "i"])]
    g = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 3])], [w, shape, k])
    graph = import_onnx_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph
    reshapes = [n for n in graph.nodes if n.is_extern and n.op.kind == "reshape"]
    assert [r.is_extern for n in reshapes for r in graph.consumers[n.outputs[0]]] == [True]
    assert FUSE_THROUGH_RESHAPE.sites(graph) == []
