"""Bad models fail with one-line errors that name the problem."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import superopt.backend as be
from superopt.frontends import OnnxImportError, import_onnx
from superopt.frontends.onnx_ops import CONVERTERS


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _good_model():
    return _model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", [2, 3])], [_vi("y", [2, 3])]
    )


def _one_line(err):
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_good_model_imports():
    g = import_onnx(_good_model())
    assert len(g.nodes) == 1


def test_truncated_file(tmp_path):
    data = _good_model().SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError) as err:
        import_onnx(p)
    msg = _one_line(err)
    assert "cannot parse" in msg and "trunc.onnx" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_garbled_bytes():
    with pytest.raises(OnnxImportError) as err:
        import_onnx(b"\xff\x00garbage\x13\x37" * 7)
    assert "cannot parse" in _one_line(err)


def test_unknown_op():
    m = _model(
        [
            helper.make_node("Relu", ["x"], ["t"], name="ok"),
            helper.make_node("FancyOp", ["t"], ["y"], name="weird_node", domain=""),
        ],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 3])],
    )
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m.SerializeToString())
    msg = _one_line(err)
    assert "FancyOp" in msg and "weird_node" in msg and "17" in msg


def test_unsupported_op_names_type_node_and_opset_in_strict_mode(monkeypatch):
    monkeypatch.delitem(CONVERTERS, "Det", raising=False)  # Det has no native lowering (should it gain one: removed)
    m = _model(
        [helper.make_node("Det", ["x"], ["y"], name="det0")],
        [_vi("x", [2, 3, 3])],
        [_vi("y", [2])],
        opset=13,
    )
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m, strict=True)
    msg = _one_line(err)
    assert "Det" in msg and "'det0'" in msg and "opset 13" in msg
    assert len(import_onnx(m).nodes) == 1  # not strict: the node runs through the ONNX fallback


def test_symbolic_input_without_shapes_explains_how_to_give_them():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3])])
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m)
    msg = _one_line(err)
    assert "'x'" in msg and "'batch'" in msg and "--shape" in msg and "--dim batch=" in msg


def test_opset_too_old():
    m = _good_model()
    m.opset_import[0].version = 0  # opsets 1 to 8 import (tests/test_onnx_old_opsets.py); there is no opset 0
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m)
    assert "opset 0" in _one_line(err)


def test_mismatched_shapes():
    m = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm_bad")],
        [_vi("a", [2, 3]), _vi("b", [4, 5])],
        [_vi("y", [2, 5])],
    )
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m)
    msg = _one_line(err)
    assert "mm_bad" in msg or "MatMul" in msg


def test_mismatched_broadcast_names_node():
    m = _model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add_bad")],
        [_vi("a", [2, 3]), _vi("b", [4])],
        [_vi("y", [2, 3])],
    )
    with pytest.raises(OnnxImportError) as err:
        import_onnx(m)
    assert "add_bad" in _one_line(err) or "Add" in str(err.value)


def test_unknown_backend_mode_lists_modes():
    with pytest.raises(ValueError, match="reference"):
        be.prepare(_good_model(), mode="warp-speed")


def test_backend_run_node():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.ones((2, 3), np.float32)
    (c,) = be.run_node(node, [a, a])
    assert c.dtype == np.float32 and np.all(c == 2)


def test_empty_model_bytes():
    with pytest.raises(OnnxImportError) as err:
        import_onnx(onnx.ModelProto().SerializeToString())
    _one_line(err)
