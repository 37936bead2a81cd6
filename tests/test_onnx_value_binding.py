"""The backend binds the graph inputs behind a tensor a converter needs as a compile-time value (NeedsConstant):
float Resize scales, a scales tensor computed from an input, a Compress condition. It compiles once per
distinct value and checks against onnx.reference."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import superopt.backend as backend
from superopt.frontends.onnx_frontend import OnnxImportError, import_onnx_model

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=19):
    g = helper.make_graph(nodes, "bind", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_float_resize_scales_input_compiled_once_per_value():
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")],
               [("x", F, (1, 2, 4, 4)), ("scales", F, (4,))], [("y", F, None)])
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    rep = backend.prepare(m)
    ref = ReferenceEvaluator(m)
    for s in ([1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 2, 2]):
        feed = {"x": x, "scales": np.array(s, np.float32)}
        (y,) = rep.run(feed)
        np.testing.assert_allclose(y, ref.run(None, feed)[0], rtol=1e-5, atol=1e-6)
    assert rep._bound == ["scales"] and len(rep._cache) == 2  # the third run reused the first value's build


def test_inputs_behind_a_computed_tensor_are_bound():
    """Upsample's scales are Mul(s, 2): the tensor it needs is not an input, the input s behind it is bound."""
    m = _model([helper.make_node("Mul", ["s", "two"], ["scales"]),
                helper.make_node("Upsample", ["x", "scales"], ["y"])],
               [("x", F, (1, 1, 2, 3)), ("s", F, (4,))], [("y", F, None)], [("two", np.float32(2.0))], opset=9)
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    rep = backend.prepare(m)
    (y,) = rep.run({"x": x, "s": np.array([0.5, 0.5, 1, 1], np.float32)})
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3))
    assert rep._bound == ["s"]


@pytest.mark.parametrize("cond", [[True, False, True], [False, False, False]])
def test_compress_condition_input(cond):
    m = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=0)],
               [("x", F, (3, 2)), ("c", TensorProto.BOOL, (3,))], [("y", F, None)])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    (y,) = backend.prepare(m).run({"x": x, "c": np.array(cond)})
    np.testing.assert_array_equal(y, np.compress(cond, x, axis=0))


def test_compress_condition_longer_than_the_axis_is_refused():
    m = _model([helper.make_node("Compress", ["x", "c"], ["y"], axis=1)], [("x", F, (3, 2))], [("y", F, None)],
               [("c", np.array([True, False, True]))])
    with pytest.raises(OnnxImportError, match="does not fit"):
        import_onnx_model(m)


def test_dropout_training_mode_input_is_bound_and_random_dropout_refused():
    m = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"], seed=0)],
               [("x", F, (2, 3)), ("r", F, ()), ("t", TensorProto.BOOL, ())], [("y", F, (2, 3))], opset=13)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    rep = backend.prepare(m)
    for r, t in ((0.5, False), (0.0, True)):  # inference, or training that drops nothing: the identity
        (y,) = rep.run({"x": x, "r": np.array(r, np.float32), "t": np.array(t)})
        np.testing.assert_array_equal(y, x)
    with pytest.raises(OnnxImportError, match="training mode with ratio 0.5 drops at random"):
        rep.run({"x": x, "r": np.array(0.5, np.float32), "t": np.array(True)})
