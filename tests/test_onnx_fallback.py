"""The ONNX fallback: nodes superopt does not lower run as opaque onnx_node externs, named in the report;
strict mode refuses them in one line; opsets 9 to the newest onnx knows import."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from superopt.api import OptimizeConfig, optimize
from superopt.cli import main
from superopt.frontends.onnx_fallback import KIND, OnnxNodeSpec
from superopt.frontends.onnx_frontend import MAX_ACCEPTED_OPSET, import_onnx_model
from superopt.frontends.onnx_ops import CONVERTERS, OnnxImportError
from superopt.interp import evaluate

FAST = OptimizeConfig(cost_model=None)


@pytest.fixture(autouse=True)
def _det_has_no_converter(monkeypatch):
    """Det (no native lowering today) is the fallback op here; should a converter appear, the test removes it."""
    monkeypatch.delitem(CONVERTERS, "Det", raising=False)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _det_model(opset=17):
    """Relu -> Det (no native lowering) -> Add: superopt kernels on both sides of one fallback node."""
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [3], [0.5, -1.0, 2.0])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("Det", ["r"], ["d"], name="the_det"),
             helper.make_node("Add", ["d", "bias"], ["y"], name="add0")]
    return _model(nodes, [_vi("x", [3, 4, 4])], [_vi("y", [3])], opset, [bias])


def _ort(m, feed):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _rng_feed(m, seed=0):
    rng = np.random.default_rng(seed)
    feed = {}
    for vi in m.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feed[vi.name] = rng.standard_normal(shape).astype(dt) if np.dtype(dt).kind == "f" else \
            rng.integers(0, 3, shape).astype(dt)
    return feed


def test_fallback_node_runs_between_kernels_and_matches_onnxruntime():
    m = _det_model()
    prog = optimize(m, FAST)
    kinds = [n.op.kind for n in prog.graph.nodes if n.is_extern]
    assert kinds == [KIND]
    assert sum(not n.is_extern for n in prog.graph.nodes) >= 1  # Relu/Add are compiled kernels
    feed = _rng_feed(m)
    np.testing.assert_allclose(prog(feed["x"])[0], _ort(m, feed)[0], rtol=1e-5, atol=1e-5)
    [f] = prog.report.fallbacks
    assert (f.op, f.node, f.reason) == ("Det", "the_det", "no native lowering")
    assert "not optimized: 1 Det node (no native lowering)" in str(prog.report)


def test_cli_optimize_names_fallback_and_strict_fails_in_one_line(tmp_path, capsys):
    path = tmp_path / "det.onnx"
    onnx.save(_det_model(), str(path))
    args = ["optimize", str(path), "--repeat", "1", "--no-db", "--no-cost-model"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "not optimized: 1 Det node" in out and "the_det" in out
    assert main(args + ["--strict"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "Det" in err and "the_det" in err and "strict" in err


def test_strict_config_raises_naming_the_node():
    with pytest.raises(OnnxImportError, match="the_det") as err:
        optimize(_det_model(), OptimizeConfig(cost_model=None, strict=True))
    assert "\n" not in str(err.value) and "Det" in str(err.value)


def test_converter_refusal_becomes_fallback_with_its_reason(monkeypatch):
    """A converter raising OnnxImportError for an attribute combination falls back, the reason reported."""
    def refuse(ctx, ins):
        raise OnnxImportError(f"Elu with alpha={ctx.attr('alpha')} is not supported")

    monkeypatch.setitem(CONVERTERS, "Elu", refuse)
    m = _model([helper.make_node("Elu", ["x"], ["e"], name="elu7", alpha=0.3),
                helper.make_node("Mul", ["e", "x"], ["y"], name="mul0")], [_vi("x", [4, 5])], [_vi("y", [4, 5])])
    prog = optimize(m, FAST)
    [f] = prog.report.fallbacks
    assert f.op == "Elu" and f.node == "elu7" and "alpha=0.3" in f.reason and "elu7" not in f.reason
    feed = _rng_feed(m)
    np.testing.assert_allclose(prog(feed["x"])[0], _ort(m, feed)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(OnnxImportError, match="elu7"):
        import_onnx_model(m, strict=True)


def _loop_model():
    """y = x after 3 steps of acc = acc * w + x (w read from the outer scope inside the body)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_in", "w"], ["t"]),
         helper.make_node("Add", ["t", "x"], ["acc_out"])],
        "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [2, 3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2, 3])],
    )
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [3])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    nodes = [helper.make_node("Relu", ["x"], ["w"], name="relu_w"),
             helper.make_node("Loop", ["trip", "cond", "x"], ["acc"], name="the_loop", body=body),
             helper.make_node("Sigmoid", ["acc"], ["y"], name="sig")]
    return _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], 17, [trip, cond])


def _if_model():
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["o1"])], "then", [], [_vi("o1", [2, 3])])
    other = helper.make_graph([helper.make_node("Exp", ["x"], ["o2"])], "else", [], [_vi("o2", [2, 3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["z"], name="the_if", then_branch=then, else_branch=other),
             helper.make_node("Add", ["z", "x"], ["y"], name="add")]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    return _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], 17, [zero])


@pytest.mark.parametrize("make,op,node", [(_loop_model, "Loop", "the_loop"), (_if_model, "If", "the_if")])
def test_control_flow_falls_back_as_a_whole_node(make, op, node, monkeypatch):
    monkeypatch.delitem(CONVERTERS, op)  # it runs natively (tests/test_onnx_control_flow.py); without a converter:
    m = make()
    prog = optimize(m, FAST)
    assert [(f.op, f.node, f.reason) for f in prog.report.fallbacks] == [(op, node, "control flow")]
    [ext] = [n for n in prog.graph.nodes if n.is_extern and n.op.kind == KIND]
    spec: OnnxNodeSpec = ext.op.attr["spec"]
    assert "x" in spec.inputs  # the outer-scope value the subgraph reads is an explicit input
    for seed in range(3):
        feed = _rng_feed(m, seed)
        np.testing.assert_allclose(prog(feed["x"])[0], _ort(m, feed)[0], rtol=1e-5, atol=1e-6)


def test_other_domain_op_runs_through_onnxruntime():
    """A com.microsoft contrib op (no ONNX schema: its output shape is learned by running it once)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Gelu", ["r"], ["g"], domain="com.microsoft", name="ms_gelu"),
             helper.make_node("Add", ["g", "x"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [_vi("x", [2, 5])], [_vi("y", [2, 5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    prog = optimize(m, FAST)
    assert [(f.op, f.node) for f in prog.report.fallbacks] == [("com.microsoft.Gelu", "ms_gelu")]
    feed = _rng_feed(m)
    np.testing.assert_allclose(prog(feed["x"])[0], _ort(m, feed)[0], rtol=1e-5, atol=1e-6)


def test_fallback_outputs_of_data_dependent_shape_need_example_values(monkeypatch):
    monkeypatch.delitem(CONVERTERS, "NonZero")  # natively a run-time shape (tests/test_onnx_data_dependent.py)
    m = _model([helper.make_node("NonZero", ["x"], ["nz"], name="nz0")], [_vi("x", [2, 3])],
               [_vi("nz", None, TensorProto.INT64)])
    with pytest.raises(OnnxImportError, match="nz0.*example inputs") as err:
        import_onnx_model(m, strict=False)
    assert "\n" not in str(err.value)
    x = np.array([[1, 0, 2], [0, 0, 3]], np.float32)
    im = import_onnx_model(m, strict=False, example={"x": x})
    got = evaluate(im.graph, {im.graph.inputs[0]: x})[im.graph.outputs[0]]
    np.testing.assert_array_equal(got, np.array(np.nonzero(x)))


def test_fallback_on_constants_folds_at_import():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 2], [1.0, 2.0, 3.0, 4.0, 2.0, 0.0, 0.0, 5.0])
    m = _model([helper.make_node("Det", ["w"], ["d"], name="det_const"),
                helper.make_node("Mul", ["d", "x"], ["y"], name="mul")], [_vi("x", [2])], [_vi("y", [2])], 17, [w])
    im = import_onnx_model(m, strict=False)
    assert not any(n.is_extern for n in im.graph.nodes) and im.fallbacks == []
    x = np.array([1.0, 3.0], np.float32)
    np.testing.assert_allclose(evaluate(im.graph, {"x": x})[im.graph.outputs[0]], _ort(m, {"x": x})[0], rtol=1e-6)


def test_float16_edges_compute_in_float32():
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Det", ["r"], ["h"], name="det16"),
                helper.make_node("Add", ["h", "s"], ["y"], name="add")],
               [_vi("x", [2, 3, 3], TensorProto.FLOAT16), _vi("s", [2], TensorProto.FLOAT16)],
               [_vi("y", [2], TensorProto.FLOAT16)])
    prog = optimize(m, FAST)
    assert [f.op for f in prog.report.fallbacks] == ["Det"]
    rng = np.random.default_rng(0)
    x, sv = rng.standard_normal((2, 3, 3)).astype(np.float16), rng.standard_normal(2).astype(np.float16)
    got = prog(x, sv)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), _ort(m, {"x": x, "s": sv})[0].astype(np.float32), rtol=2e-3,
                               atol=2e-3)


@pytest.mark.parametrize("opset", range(22, MAX_ACCEPTED_OPSET + 1))
def test_newer_opsets_import(opset):
    """Every opset after 21 that the installed onnx knows: native nodes and a fallback node both run."""
    m = _det_model(opset)
    im = import_onnx_model(m, strict=False)
    assert [f.op for f in im.fallbacks] == ["Det"]
    x = np.random.default_rng(opset).standard_normal((3, 4, 4)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(evaluate(im.graph, {"x": x})[im.graph.outputs[0]], want, rtol=1e-5, atol=1e-6)


def test_opset_newer_than_onnx_is_one_line_naming_both():
    m = _det_model(17)
    m.opset_import[0].version = 99
    with pytest.raises(OnnxImportError) as err:
        import_onnx_model(m, strict=False)
    msg = str(err.value)
    assert "\n" not in msg and "opset 99" in msg and onnx.__version__ in msg and str(MAX_ACCEPTED_OPSET) in msg
