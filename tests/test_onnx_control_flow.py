"""If, Loop and Scan run natively: branches and bodies imported by superopt and compiled, compared with onnxruntime
(onnx.reference runs no iteration of a Loop whose condition input is omitted)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import superopt.backend as backend
from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.frontends.onnx_ops import OnnxImportError
from superopt.testing.onnx_compare import backend_matches_onnxruntime

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=17):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _kinds(model, **kw):
    return [n.op.kind for n in import_onnx_model(model, **kw).graph.nodes if n.is_extern]


def _check(model, feeds, rtol=1e-5, atol=1e-6):
    pytest.importorskip("onnxruntime")
    return backend_matches_onnxruntime(model, feeds, rtol, atol)


def test_if_with_a_run_time_condition_runs_the_branch_taken():
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["t"])], "then", [], [_vi("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "y"], ["e"])], "else", [], [_vi("e", F, [2, 3])])
    m = _model([helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
               [_vi("c", B, []), _vi("x", F, [2, 3]), _vi("y", F, [2, 3])], [_vi("out", F, [2, 3])])
    assert _kinds(m) == ["if"]
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    _check(m, [{"c": np.array(v), "x": x, "y": y} for v in (True, False)])


def test_if_with_a_constant_condition_is_resolved_when_importing():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", F, [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", F, [4])])
    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", B, [], [False])),
             helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [_vi("x", F, [4])], [_vi("out", F, [4])])
    assert _kinds(m) == []  # the else branch, inlined
    _check(m, [{"x": np.array([1, -2, 3, -4], np.float32)}])


def _accumulate_loop(n_scan_outputs: int, cond_from_iteration: bool = False):
    """acc += x * w per iteration (w read from the enclosing graph); optionally a scan output of acc."""
    body_nodes = [helper.make_node("Mul", ["x_in", "w"], ["xw"]), helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
                  helper.make_node("Identity", ["x_in"], ["x_out"])]
    if cond_from_iteration:  # keep going while i < 2
        body_nodes += [helper.make_node("Constant", [], ["two"], value=helper.make_tensor("t", I64, [], [2])),
                       helper.make_node("Less", ["i", "two"], ["cond_out"])]
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    outs = [_vi("cond_out", B, []), _vi("acc_out", F, [3]), _vi("x_out", F, [3])]
    if n_scan_outputs:
        body_nodes.append(helper.make_node("Identity", ["acc_out"], ["acc_scan"]))
        outs.append(_vi("acc_scan", F, [3]))
    body = helper.make_graph(body_nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [3]),
                                                 _vi("x_in", F, [3])], outs)
    loop_outs = ["acc", "x_last"] + (["stack"] if n_scan_outputs else [])
    return body, loop_outs


def test_loop_with_a_run_time_trip_count_runs_its_compiled_body():
    body, outs = _accumulate_loop(0)
    m = _model([helper.make_node("Loop", ["n", "", "acc0", "x"], outs, body=body)],
               [_vi("n", I64, []), _vi("acc0", F, [3]), _vi("x", F, [3]), _vi("w", F, [3])],
               [_vi("acc", F, [3]), _vi("x_last", F, [3])])
    assert _kinds(m) == ["loop"]
    x, w = np.array([1, 2, 3], np.float32), np.array([0.5, -1, 2], np.float32)
    rep = _check(m, [{"n": np.array(k, np.int64), "acc0": np.ones(3, np.float32), "x": x, "w": w} for k in (0, 3, 5)])
    assert rep._static is not None  # one import and compilation served every trip count


def test_loop_scan_outputs_stack_per_iteration_and_an_early_stop_is_a_clear_error():
    body, outs = _accumulate_loop(1)
    m = _model([helper.make_node("Loop", ["n", "", "acc0", "x"], outs, body=body)],
               [_vi("n", I64, []), _vi("acc0", F, [3]), _vi("x", F, [3]), _vi("w", F, [3])],
               [_vi("acc", F, [3]), _vi("x_last", F, [3]), _vi("stack", F, [4, 3])])
    feed = {"n": np.array(4, np.int64), "acc0": np.zeros(3, np.float32), "x": np.arange(3, dtype=np.float32),
            "w": np.full(3, 2.0, np.float32)}
    assert _kinds(m, bind={"n": feed["n"]}) == ["loop"]
    _check(m, [feed])
    body, outs = _accumulate_loop(1, cond_from_iteration=True)
    m = _model([helper.make_node("Loop", ["n", "", "acc0", "x"], outs, body=body)], list(m.graph.input),
               list(m.graph.output)[:2] + [_vi("stack", F, [None, 3])])
    with pytest.raises(RuntimeError, match="ran 3 iterations but its scan outputs were compiled for 4"):
        backend.prepare(m).run([feed[i.name] for i in m.graph.input])


def test_loop_whose_body_needs_its_iteration_number_is_unrolled():
    const_x = helper.make_tensor("cx", F, [5], [1, 2, 3, 4, 5])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["x"], value=const_x),
         helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", I64, [], [1])),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "axes"], ["start1"]),
         helper.make_node("Unsqueeze", ["end", "axes"], ["end1"]),
         helper.make_node("Slice", ["x", "start1", "end1"], ["piece"]),
         helper.make_node("Add", ["y_in", "piece"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("y_in", F, [1])],
        [_vi("cond_out", B, []), _vi("y_out", F, [1]), _vi("scan_out", F, [1])],
        initializer=[helper.make_tensor("axes", I64, [1], [0])])
    nodes = [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n5", I64, [], [5])),
             helper.make_node("Constant", [], ["go"], value=helper.make_tensor("t", B, [], [True])),
             helper.make_node("Loop", ["n", "go", "y"], ["res_y", "res_scan"], body=body)]
    m = _model(nodes, [_vi("y", F, [1])], [_vi("res_y", F, [1]), _vi("res_scan", F, [5, 1])])
    assert "loop" not in _kinds(m)
    _check(m, [{"y": np.array([-2.0], np.float32)}])


def test_scan_slices_and_stacks_along_axes_in_both_directions():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]), helper.make_node("Mul", ["s_out", "b"], ["y"]),
         helper.make_node("Add", ["y", "bias"], ["z"])],
        "body", [_vi("s_in", F, [2]), _vi("a", F, [2]), _vi("b", F, [2])],
        [_vi("s_out", F, [2]), _vi("z", F, [2])])
    node = helper.make_node("Scan", ["s0", "xa", "xb"], ["s", "zs"], body=body, num_scan_inputs=2,
                            scan_input_axes=[0, 1], scan_input_directions=[0, 1], scan_output_axes=[-1],
                            scan_output_directions=[1])
    m = _model([node], [_vi("s0", F, [2]), _vi("xa", F, [4, 2]), _vi("xb", F, [2, 4]), _vi("bias", F, [2])],
               [_vi("s", F, [2]), _vi("zs", F, [2, 4])])
    assert _kinds(m) == ["scan"]
    rng = np.random.default_rng(1)
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in
            (("s0", (2,)), ("xa", (4, 2)), ("xb", (2, 4)), ("bias", (2,)))}
    _check(m, [feed])


def test_a_body_without_native_lowering_makes_the_whole_node_fall_back():
    body = helper.make_graph(
        [helper.make_node("GlobalLpPool", ["s_in"], ["p"], p=2), helper.make_node("Add", ["s_in", "p"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "body", [_vi("s_in", F, [1, 2, 3]), _vi("x", F, [1])], [_vi("s_out", F, [1, 2, 3]), _vi("y", F, [1, 2, 3])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)
    m = _model([node], [_vi("s0", F, [1, 2, 3]), _vi("xs", F, [2, 1])], [_vi("s", F, [1, 2, 3]),
                                                                         _vi("ys", F, [2, 1, 2, 3])])
    with pytest.raises(OnnxImportError, match="scan body: GlobalLpPool"):
        import_onnx_model(m, strict=True)
    im = import_onnx_model(m, strict=False)
    assert [(f.op, f.reason.split(":")[0]) for f in im.fallbacks] == [("Scan", "scan body")]


def test_optimize_keeps_control_flow_native_and_reports_no_fallback():
    from superopt.api import OptimizeConfig, optimize

    ort = pytest.importorskip("onnxruntime")
    body, outs = _accumulate_loop(0)
    then_g = helper.make_graph([helper.make_node("Neg", ["acc"], ["t"])], "then", [], [_vi("t", F, [3])])
    else_g = helper.make_graph([helper.make_node("Exp", ["acc"], ["e"])], "else", [], [_vi("e", F, [3])])
    nodes = [helper.make_node("Relu", ["x0"], ["x"]),
             helper.make_node("Loop", ["n", "", "x", "x"], outs, body=body),
             helper.make_node("ReduceSum", ["acc"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "g", [_vi("x0", F, [3]), _vi("w", F, [3])], [_vi("y", F, [3])],
                          initializer=[helper.make_tensor("n", I64, [], [3]), helper.make_tensor("zero", F, [], [0.0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    prog = optimize(m, OptimizeConfig(cost_model=None))
    assert prog.report.fallbacks == []
    assert {"if", "loop"} <= {n.op.kind for n in prog.graph.nodes if n.is_extern}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for w in ([0.5, -1, 2], [-3, -3, -3]):
        feed = {"x0": np.array([1, -2, 3], np.float32), "w": np.array(w, np.float32)}
        np.testing.assert_allclose(prog(feed["x0"], feed["w"])[0], sess.run(None, feed)[0], rtol=1e-5)


def test_reference_interprets_bodies_instead_of_running_the_compiled_ones():
    """The verifier's reference runs a control-flow body through the interpreter (in its own precision), so a
    compiled body is checked against the spec, not against itself: a broken body runner does not reach it."""
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.interp.magnitude import reference_with_magnitudes
    from superopt.interp.reference import evaluate
    from superopt.ir.externs.control_flow import bodies_run_by

    body, outs = _accumulate_loop(0)
    nodes = [helper.make_node("Loop", ["n", "", "x", "x"], outs, body=body)]
    g = helper.make_graph(nodes, "g", [_vi("x", F, [3]), _vi("w", F, [3])], [_vi(outs[0], F, [3])],
                          initializer=[helper.make_tensor("n", I64, [], [3])])
    graph = import_onnx_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).graph
    x, w = np.array([1, -2, 3], np.float32), np.array([0.5, -1, 2], np.float32)
    want = x + 3 * x * w  # acc starts at x and adds x * w three times

    def broken(body_graph, xs):
        return [np.zeros(t.shape, t.np_dtype) for t in map(body_graph.type_of.__getitem__, body_graph.outputs)]

    with bodies_run_by(broken):
        got = evaluate(graph, [x, w])[graph.outputs[0]]
        ref, _ = reference_with_magnitudes(graph, dict(zip(graph.inputs, [x, w])))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(ref[graph.outputs[0]], want, rtol=1e-12)
    assert ref[graph.outputs[0]].dtype == np.float64
