"""Models at opsets below 9: each old op version's semantics (superopt.frontends.onnx_ops.old_versions), checked
against the formula the ONNX changelog gives for that version (numpy) or onnx.reference where it has the version."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import superopt.backend as backend
from superopt.frontends.onnx_frontend import OnnxImportError, import_onnx_model

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(node, inputs, outputs, opset, inits=()):
    g = helper.make_graph([node], "old", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3
    return m


def _run(m, feeds, mode="reference"):
    return backend.prepare(m, mode=mode).run(feeds)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op, fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)])
def test_binary_broadcast_from_axis(op, fn):
    """Add-6 ... with broadcast=1, axis=1: B (3, 4) lines up with A's axes 1 and 2."""
    a, b = _x(2, 3, 4, 5), _x(3, 4) + 3.0
    m = _model(helper.make_node(op, ["a", "b"], ["y"], broadcast=1, axis=1),
               [("a", F, a.shape), ("b", F, b.shape)], [("y", F, a.shape)], 6)
    (y,) = _run(m, {"a": a, "b": b})
    np.testing.assert_allclose(y, fn(a, b[None, :, :, None]), rtol=1e-6)


def test_binary_broadcast_suffix_scalar_and_consumed_inputs_compiled():
    """Mul-1 (consumed_inputs) with a suffix-aligned B, then Sub-6 with a one-element B of higher rank, compiled."""
    a, b, s = _x(2, 3, 4), _x(4), _x(1, 1, 1, 1)
    g = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["t"], broadcast=1, consumed_inputs=[0, 0]),
         helper.make_node("Sub", ["t", "s"], ["y"], broadcast=1)], "old",
        [helper.make_tensor_value_info(n, F, v.shape) for n, v in (("a", a), ("b", b), ("s", s))],
        [helper.make_tensor_value_info("y", F, a.shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    (y,) = _run(m, {"a": a, "b": b, "s": s}, mode="compiled")
    np.testing.assert_allclose(y, a * b - s.reshape(()), rtol=1e-6)


def test_comparison_broadcast_from_axis():
    a, b = _x(2, 3, 4), _x(2)
    m = _model(helper.make_node("Greater", ["a", "b"], ["y"], broadcast=1, axis=0),
               [("a", F, a.shape), ("b", F, b.shape)], [("y", TensorProto.BOOL, a.shape)], 1)
    (y,) = _run(m, {"a": a, "b": b})
    np.testing.assert_array_equal(y, a > b[:, None, None])


def test_binary_without_broadcast_needs_one_shape():
    m = _model(helper.make_node("Add", ["a", "b"], ["y"], name="add_old"),
               [("a", F, (2, 3)), ("b", F, (3,))], [("y", F, (2, 3))], 6)
    with pytest.raises(OnnxImportError, match="one shape"):
        import_onnx_model(m, strict=True)


def test_broadcast_b_not_part_of_a():
    m = _model(helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=0),
               [("a", F, (2, 3)), ("b", F, (3,))], [("y", F, (2, 3))], 6)
    with pytest.raises(OnnxImportError, match="starts at axis 0"):
        import_onnx_model(m, strict=True)


@pytest.mark.parametrize("broadcast, c_shape", [(1, (5,)), (0, (3, 5))])
def test_gemm_6(broadcast, c_shape):
    a, b, c = _x(4, 3), _x(4, 5), _x(*c_shape)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, alpha=0.5, beta=2.0, broadcast=broadcast)
    m = _model(node, [("a", F, a.shape), ("b", F, b.shape), ("c", F, c.shape)], [("y", F, (3, 5))], 6)
    (y,) = _run(m, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(y, 0.5 * a.T @ b + 2.0 * c, rtol=1e-5)
    if broadcast:  # onnx.reference's Gemm-6 drops beta when broadcast=0
        np.testing.assert_allclose(y, ReferenceEvaluator(m).run(None, {"a": a, "b": b, "c": c})[0], rtol=1e-5)


def test_batch_norm_6_test_mode_and_7_per_activation():
    x = _x(2, 3, 4)
    sc, bi, mu, var = _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5
    m = _model(helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1, epsilon=1e-3),
               [("x", F, x.shape)], [("y", F, x.shape)], 6, [("s", sc), ("b", bi), ("m", mu), ("v", var)])
    (y,) = _run(m, {"x": x}, mode="compiled")
    want = (x - mu[:, None]) / np.sqrt(var[:, None] + 1e-3) * sc[:, None] + bi[:, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    sc, bi, mu, var = _x(3, 4), _x(3, 4), _x(3, 4), np.abs(_x(3, 4)) + 0.5  # spatial=0: statistics per activation
    m = _model(helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0),
               [("x", F, x.shape)], [("y", F, x.shape)], 7, [("s", sc), ("b", bi), ("m", mu), ("v", var)])
    (y,) = _run(m, {"x": x})
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * sc + bi, rtol=1e-5, atol=1e-6)


def test_training_mode_batch_norm_and_dropout_are_refused():
    p = [("s", _x(3)), ("b", _x(3)), ("m", _x(3)), ("v", np.ones(3, np.float32))]
    m = _model(helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn_train"),
               [("x", F, (2, 3))], [("y", F, (2, 3))], 6, p)
    with pytest.raises(OnnxImportError, match=r"bn_train.*is_test=0"):
        import_onnx_model(m, strict=True)
    m = _model(helper.make_node("Dropout", ["x"], ["y"], ratio=0.3), [("x", F, (2, 3))], [("y", F, (2, 3))], 6)
    with pytest.raises(OnnxImportError, match="at random"):
        import_onnx_model(m, strict=True)
    assert len(import_onnx_model(m, strict=False).fallbacks) == 1  # not strict: it is named as a fallback node


def test_dropout_6_test_mode_copies():
    x = _x(2, 3)
    m = _model(helper.make_node("Dropout", ["x"], ["y"], is_test=1, ratio=0.3), [("x", F, x.shape)],
               [("y", F, x.shape)], 6)
    np.testing.assert_array_equal(_run(m, {"x": x})[0], x)


def test_reshape_1_pad_1_concat_1():
    x = _x(2, 3, 4)
    m = _model(helper.make_node("Reshape", ["x"], ["y"], shape=[0, -1]), [("x", F, x.shape)], [("y", F, (2, 12))], 1)
    np.testing.assert_array_equal(_run(m, {"x": x})[0], x.reshape(2, 12))
    m = _model(helper.make_node("Pad", ["x"], ["y"], paddings=[0, 1, 2, 0, 2, 1], mode="reflect"),
               [("x", F, x.shape)], [("y", F, (2, 6, 7))], 1)
    (y,) = _run(m, {"x": x})
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 2), (2, 1)], mode="reflect"))
    np.testing.assert_array_equal(y, ReferenceEvaluator(m).run(None, {"x": x})[0])
    z = _x(2, 5, 4)
    g = helper.make_graph([helper.make_node("Concat", ["x", "z"], ["y"])], "old",
                          [helper.make_tensor_value_info("x", F, x.shape), helper.make_tensor_value_info("z", F, z.shape)],
                          [helper.make_tensor_value_info("y", F, (2, 8, 4))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 1)])
    m.ir_version = 3
    np.testing.assert_array_equal(_run(m, {"x": x, "z": z})[0], np.concatenate([x, z], axis=1))


def test_split_1_from_input_and_tile_1():
    x = _x(2, 6)
    node = helper.make_node("Split", ["x", "parts"], ["a", "b"], axis=1)
    m = _model(node, [("x", F, x.shape)], [("a", F, (2, 2)), ("b", F, (2, 4))], 1,
               [("parts", np.array([2, 4], np.int64))])
    a, b = _run(m, {"x": x})
    np.testing.assert_array_equal(a, x[:, :2])
    np.testing.assert_array_equal(b, x[:, 2:])
    node = helper.make_node("Tile", ["x", "tiles", "axis"], ["y"])
    m = _model(node, [("x", F, x.shape)], [("y", F, (2, 18))], 1,
               [("tiles", np.array(3, np.int64)), ("axis", np.array(1, np.int64))])
    np.testing.assert_array_equal(_run(m, {"x": x})[0], np.tile(x, (1, 3)))


def test_upsample_1_and_7():
    x = _x(1, 2, 2, 3)
    m = _model(helper.make_node("Upsample", ["x"], ["y"], height_scale=2.0, width_scale=3.0),
               [("x", F, x.shape)], [("y", F, (1, 2, 4, 9))], 1)
    np.testing.assert_array_equal(_run(m, {"x": x})[0], x.repeat(2, axis=2).repeat(3, axis=3))
    m = _model(helper.make_node("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0], mode="linear"),
               [("x", F, x.shape)], [("y", F, (1, 2, 4, 6))], 7)
    want = _linear_asymmetric(_linear_asymmetric(x, 2, 2), 3, 2)
    np.testing.assert_allclose(_run(m, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def _linear_asymmetric(x, axis, scale):
    """Upsample's linear mode along one axis: source position out/scale, neighbours clamped to the edge."""
    n = x.shape[axis]
    pos = np.arange(n * scale) / scale
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    w = (pos - lo).reshape([-1 if k == axis else 1 for k in range(x.ndim)])
    return np.take(x, lo, axis=axis) * (1 - w) + np.take(x, hi, axis=axis) * w


def test_cast_1_type_name_and_sum_6_prelu_6():
    x = _x(2, 3) * 10
    m = _model(helper.make_node("Cast", ["x"], ["y"], to="INT32"), [("x", F, x.shape)],
               [("y", TensorProto.INT32, x.shape)], 1)
    np.testing.assert_array_equal(_run(m, {"x": x})[0], x.astype(np.int32))
    m = _model(helper.make_node("Sum", ["x", "x", "x"], ["y"]), [("x", F, x.shape)], [("y", F, x.shape)], 6)
    np.testing.assert_allclose(_run(m, {"x": x})[0], 3 * x, rtol=1e-6)
    m = _model(helper.make_node("PRelu", ["x", "s"], ["y"]), [("x", F, x.shape)], [("y", F, x.shape)], 6,
               [("s", np.array([0.25], np.float32))])
    np.testing.assert_allclose(_run(m, {"x": x})[0], np.where(x < 0, 0.25 * x, x), rtol=1e-6)


def test_unchanged_ops_at_old_opsets_and_no_opset_zero():
    """Ops whose schema has not changed since (Softmax-1, Transpose-1) convert as at opset 9; And-7 too."""
    x = _x(2, 5)
    m = _model(helper.make_node("Softmax", ["x"], ["y"]), [("x", F, x.shape)], [("y", F, x.shape)], 3)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(_run(m, {"x": x})[0], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    m.opset_import[0].version = 0
    with pytest.raises(OnnxImportError, match="opset 0"):
        import_onnx_model(m)


def test_every_changed_version_has_an_adapter_or_a_reason():
    """Each op superopt converts whose schema changed between opset 1 and 9 is adapted (listed) or refused
    by name, never converted with the opset-9 semantics by mistake."""
    from superopt.frontends.onnx_ops import CONVERTERS
    from superopt.frontends.onnx_ops.old_versions import ADAPTERS, converter_at, since_version

    for op, conv in CONVERTERS.items():
        for opset in range(1, 9):
            old = since_version(op, opset)
            if old is None or old == since_version(op, 9):
                continue
            got, why = converter_at(op, opset, conv)
            assert (got is not None) == ((op, old) in ADAPTERS), (op, opset)
            assert got is not None or f"{op}-{old}" in why
    assert onnx.defs.get_schema("Add", 6).since_version == 6  # the table above is keyed by these versions
