"""A compiled program called from several threads at once: its intermediates live in buffers planned once
per program, so the calls take turns and each gets its own inputs' result (the verifier's reference thread
runs control-flow bodies while the program runs them too)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from onnx import TensorProto, helper

from superopt.api import define_op
from superopt.frontends.onnx_frontend import import_onnx_model
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.subgraph import run_body
from superopt.schedule.graph_defaults import default_schedules


def _check_concurrent(run, want, feeds) -> None:
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(run, feeds * 20))
    for feed, got in zip(feeds * 20, outs):
        np.testing.assert_allclose(got, want(feed), rtol=1e-4, atol=1e-4)


def test_concurrent_calls_of_one_executor_each_get_their_own_result():
    nodes = [helper.make_node("MatMul", ["A", "B"], ["t"]), helper.make_node("Softmax", ["t"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "B"], ["C"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [48, 48]) for n in "ABC"]
    m = helper.make_model(helper.make_graph(nodes, "g", vi[:2], vi[2:]), opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx_model(m).graph
    config = ExecutorConfig(threads=1)
    ex = GraphExecutor(g, default_schedules(g, config.resolved_target()), config)
    assert ex.memory.buffer_bytes  # the intermediates t and s live in planned buffers
    rng = np.random.default_rng(0)
    feeds = [{"A": rng.standard_normal((48, 48)).astype(np.float32),
              "B": rng.standard_normal((48, 48)).astype(np.float32)} for _ in range(6)]

    def want(f):
        t = f["A"].astype(np.float64) @ f["B"]
        s = np.exp(t - t.max(-1, keepdims=True))
        return (s / s.sum(-1, keepdims=True)) @ f["B"]

    _check_concurrent(lambda f: ex(f)[g.outputs[0]], want, feeds)


def test_concurrent_runs_of_one_control_flow_body():
    g = define_op("t[i] = exp(x[i]) + 1.0\ny[i] = t[i] * x[i] - t[i]", {"x": (1000,)})
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal(1000).astype(np.float32) for _ in range(6)]
    _check_concurrent(lambda x: run_body(g, [x])[0],
                      lambda x: (np.exp(x) + 1) * x - (np.exp(x) + 1), feeds)
