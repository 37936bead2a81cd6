"""Symbolic dimensions: one OptimizedModel specializes, compiles and verifies each input shape once."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import superopt.api as api
from superopt.api import OptimizeConfig, OptimizedModel, optimize
from superopt.cli import main
from superopt.frontends.onnx_ops import CONVERTERS, OnnxImportError
from superopt.frontends.onnx_shapes import resolve_shapes, symbolic_inputs

FAST = OptimizeConfig(cost_model=None)


@pytest.fixture(autouse=True)
def _hardmax_falls_back(monkeypatch):
    """Hardmax stands in for a node with no native lowering: its converter is removed for these tests, so each
    shape's program also specializes a fallback node."""
    monkeypatch.delitem(CONVERTERS, "Hardmax", raising=False)


def _batch_model():
    """x[batch, 6] @ W + b -> Relu -> Hardmax (a fallback node) + Softmax: a symbolic batch and a fallback."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bias")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Hardmax", ["r"], ["h"], name="hm"),
             helper.make_node("Softmax", ["a"], ["s"], axis=-1), helper.make_node("Add", ["h", "s"], ["y"])]
    g = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], initializer=[w, bias])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ort(m, x):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_batches_1_4_7_compile_once_each_and_match_onnxruntime(monkeypatch):
    compiled = []
    real = api._optimize_onnx_static

    def counting(model, shapes, arrays, config, *timing):
        compiled.append(dict(shapes))
        return real(model, shapes, arrays, config, *timing)

    monkeypatch.setattr(api, "_optimize_onnx_static", counting)
    m = _batch_model()
    rng = np.random.default_rng(1)
    xs = {n: rng.standard_normal((n, 6)).astype(np.float32) for n in (1, 4, 7)}
    prog = optimize(m, {"x": xs[1]}, FAST)
    assert isinstance(prog, OptimizedModel)
    for n in (1, 4, 7, 4, 1, 7):
        np.testing.assert_allclose(prog(xs[n])[0], _ort(m, xs[n]), rtol=1e-4, atol=1e-5)
    assert [s["x"] for s in compiled] == [(1, 6), (4, 6), (7, 6)]  # each shape once, in order of first use
    assert prog.compiles == 3 and [s["x"] for s in prog.compiled_shapes] == [(1, 6), (4, 6), (7, 6)]
    text = str(prog.report)
    assert "compiled for 3 shapes: x=1x6 | x=4x6 | x=7x6" in text and "1 Hardmax node" in text
    assert prog(x=xs[4])[0].shape == (4, 5)  # by name too


def test_shapes_instead_of_arrays():
    m = _batch_model()
    prog = optimize(m, [(3, 6)], FAST)
    assert prog.compiled_shapes == [{"x": (3, 6)}]
    x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_allclose(prog(x)[0], _ort(m, x), rtol=1e-4, atol=1e-5)


def test_no_shapes_is_a_clear_error():
    with pytest.raises(OnnxImportError) as err:
        optimize(_batch_model(), FAST)
    msg = str(err.value)
    assert "\n" not in msg and "'batch'" in msg and "'x'" in msg and "example inputs" in msg


def test_resolve_shapes_from_dims_and_checks():
    m = _batch_model()
    assert symbolic_inputs(m) == {"x": ("batch", 6)}
    assert resolve_shapes(m, dims={"batch": 5}) == {"x": (5, 6)}
    with pytest.raises(OnnxImportError, match="no dimension named 'seq'"):
        resolve_shapes(m, dims={"seq": 5})
    with pytest.raises(OnnxImportError, match="shape given"):
        resolve_shapes(m, {"x": (2, 7)})


def test_cli_dim_and_shape(tmp_path, capsys):
    path = tmp_path / "dyn.onnx"
    onnx.save(_batch_model(), str(path))
    base = ["optimize", str(path), "--repeat", "1", "--no-db", "--no-cost-model"]
    assert main(base + ["--dim", "batch=2"]) == 0
    assert "compiled for 1 shape: x=2x6" in capsys.readouterr().out
    assert main(base + ["--shape", "x=3x6"]) == 0
    assert "x=3x6" in capsys.readouterr().out
    assert main(base) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dim batch=" in err
