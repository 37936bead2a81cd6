"""A batch-1 fully connected layer (a GEMV, memory-bound): its weight packed once and read in parallel panels."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def test_a_batch_one_fully_connected_layer_reads_its_weight_packed_once_in_parallel_panels():
    """AlexNet's classifier layers at batch 1 (a GEMV over the weight): the weight is packed ahead of time
    into panels of output columns (no per-call packing), the panels split among the threads, and the result
    matches onnxruntime."""
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session
    from superopt.schedule import Pack, Parallel

    rng = np.random.default_rng(2)
    k, n = 1152, 512
    w = numpy_helper.from_array((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])],
                          "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    prog = optimize(model.SerializeToString(), OptimizeConfig(threads=2, program_cache=False))
    ex = prog.executor
    (fc,) = [node for node in ex.graph.nodes if not node.is_extern]
    trace = ex.traces[fc.name]
    assert any(isinstance(p, Pack) for p in trace) and any(isinstance(p, Parallel) for p in trace)
    kinds = {buf.kind for buf in ex.memory.of_node(fc.name)}
    assert "packed" in kinds and "packed_per_call" not in kinds
    x = rng.standard_normal((1, k)).astype(np.float32)
    (want,) = _ort_session(model.SerializeToString(), 2).run(None, {"x": x})
    np.testing.assert_allclose(prog(x)[0], want, rtol=1e-4, atol=1e-4)
