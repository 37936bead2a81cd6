"""Rewritten weights (folded, re-laid out, transformed) are computed where the program is built, not for each
candidate graph of the search; equal to eager constants by content; and the imported weights are let go of
before the build computes the rewritten ones."""

import pickle
import tracemalloc
import weakref

import numpy as np
import pytest

import superopt.api as api
from superopt.builder import GraphBuilder
from superopt.ir.graph import OWN_PAGES_BYTES, Constant, DeferredConstant, Graph, GraphError, _owned
from superopt.ir.types import TensorType


def test_a_deferred_constant_is_its_computed_value_by_content():
    a = Constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    calls = []

    def transpose(x):
        calls.append(1)
        return x.T * 2

    d = DeferredConstant(TensorType((4, 3), "float32"), "2 x^T", (a,), transpose)
    eager = Constant(np.arange(12, dtype=np.float32).reshape(3, 4).T * 2)
    assert d.type == eager.type and not calls  # typed without computing
    assert d == eager and hash(d) == hash(eager) and d.digest() == eager.digest()
    assert len(calls) == 1 and not d.computed  # the digest computed it and let it go
    np.testing.assert_array_equal(d.array, eager.array)
    assert d.computed and len(calls) == 2 and d.array is d.array  # kept from the first read on
    assert not d.array.flags.writeable and d.array.ctypes.data % 64 == 0
    back = pickle.loads(pickle.dumps(d))
    assert type(back) is Constant and back == d
    assert d != DeferredConstant(TensorType((4, 3), "float32"), "x^T", (a,), lambda x: x.T)


def test_a_deferred_constant_of_the_wrong_type_is_named_when_computed():
    a = Constant(np.zeros((2, 3), np.float32))
    d = DeferredConstant(TensorType((2, 3), "float32"), "the transpose", (a,), lambda x: x.T)
    with pytest.raises(GraphError, match=r"deferred constant \(the transpose\) computed float32\[3,2\], declared float32\[2,3\]"):
        _ = d.array


def test_a_large_constant_has_pages_of_its_own_and_is_not_copied_again():
    big = np.random.default_rng(0).standard_normal(OWN_PAGES_BYTES // 4 + 3).astype(np.float32)
    c = Constant(big)
    assert _owned(c.array) and not c.array.flags.writeable and c.array.ctypes.data % 64 == 0
    np.testing.assert_array_equal(c.array, big)
    assert np.shares_memory(Constant(c.array).array, c.array)
    with pytest.raises(ValueError):
        c.array[0] = 1.0


def _cnn(layers: int, channels: int, seed: int = 1) -> Graph:
    """conv -> batch norm -> relu, ``layers`` times, at 8x8 pixels: the weights are most of the graph's bytes."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("cnn")
    h = b.input("x", (1, channels, 8, 8))
    for k in range(layers):
        w = b.constant((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), f"w{k}")
        y = b.compute1("O[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]", {"X": h, "W": w}, f"conv{k}",
                       extents={"y": 8, "x": 8}, padding={"X": 0.0})
        g, bias, m = (b.constant(rng.standard_normal(channels).astype(np.float32), f"bn{k}_{s}") for s in "gbm")
        v = b.constant((rng.random(channels) + 0.5).astype(np.float32), f"bn{k}_v")
        y = b.compute1("O[n,c,y,x] = (A[n,c,y,x] - M[c]) * (G[c] * rsqrt(V[c] + 0.00001)) + B[c]",
                       {"A": y, "G": g, "B": bias, "M": m, "V": v}, f"bn{k}")
        h = b.compute1("O[n,c,y,x] = relu(A[n,c,y,x])", {"A": y}, f"relu{k}")
    return b.build([h])


def test_the_graph_search_holds_no_rewritten_weight():
    api.search_rewrites(_cnn(layers=2, channels=8, seed=0), api.OptimizeConfig(threads=2))  # (the imports)
    graph = _cnn(layers=6, channels=96)
    weights = sum(c.array.nbytes for _, c in graph.constants)
    tracemalloc.start()
    try:
        rewritten, report = api.search_rewrites(graph, api.OptimizeConfig(threads=2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.applied and not report.rule_errors
    made = [c for _, c in rewritten.constants if isinstance(c, DeferredConstant)]
    assert made and not any(c.computed for c in made)  # folded and blocked, computed for digests only
    # held by each candidate, the folded and re-laid-out weights came to 3.6 times the model's own; computed one
    # at a time for a digest and let go, what is left is the search's own graphs and a layer's float64 fold
    assert peak < 1.5 * weights, peak / weights


def test_the_imported_weights_are_let_go_before_the_build(tmp_path, monkeypatch):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from superopt.runtime.compiler import CompilerConfig

    rng = np.random.default_rng(2)
    c = 32
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
              (("g", rng.standard_normal(c)), ("b", rng.standard_normal(c)), ("m", rng.standard_normal(c)),
               ("v", rng.random(c) + 0.5))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "g", "b", "m", "v"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]
    g = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c, 8, 8])], inits)
    path = tmp_path / "cbr.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    seen: dict = {}
    search, start, executor = api.search_rewrites, api.start_reference, api.GraphExecutor

    def watched_search(graph, *a, **k):
        seen["graph"], seen["weight"] = weakref.ref(graph), weakref.ref(graph.constant["w"])
        return search(graph, *a, **k)

    def finished_reference(graph, *a, **k):  # (done before the rewrite: the thread lets go of the graph)
        future = start(graph, *a, **k)
        future.result()
        return future

    def watched_build(graph, *a, **k):
        import gc

        gc.collect()
        seen["graph at build"] = seen["graph"]() is not None
        return executor(graph, *a, **k)

    monkeypatch.setattr(api, "search_rewrites", watched_search)
    monkeypatch.setattr(api, "start_reference", finished_reference)
    monkeypatch.setattr(api, "GraphExecutor", watched_build)
    cfg = api.OptimizeConfig(threads=1, cost_model=None, program_cache=False,
                             compiler=CompilerConfig(cache_dir=tmp_path / "cache"))
    prog = api.optimize(str(path), cfg)
    assert prog.report.max_error is not None and prog.report.max_error <= cfg.rtol
    assert not seen["graph at build"]  # its weights held only by the rewritten ones they are computed into
    import gc

    gc.collect()
    assert seen["weight"]() is None  # the folded weight computed, the imported one is gone
