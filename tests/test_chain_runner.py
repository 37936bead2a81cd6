"""The executor's fast path: chains of kernels run by one native call (runtime/chain.py), C implementations of
common externs (runtime/native_externs.py), tiny kernels without parallel regions, fresh outputs per call."""

from __future__ import annotations

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.ir.externs import evaluate_extern
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import kernel_work
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import host_target

MATMUL = "Y[i,j] += X[i,k] * W[k,j]"


def _executor(graph, cache, **kw) -> GraphExecutor:
    return GraphExecutor(graph, default_schedules(graph, host_target(2)), ExecutorConfig(compiler=cache, **kw))


def _resize_attrs(sizes, mode="linear", coord="half_pixel", **kw):
    attrs = dict(sizes=tuple(sizes), scales=None, mode=mode, coordinate_transformation_mode=coord,
                 nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False,
                 extrapolation_value=0.0, antialias=False, roi=None)
    attrs.update(kw)
    return attrs


def _mixed_graph():
    """Compute nodes, reshapes (of an input, of an intermediate), native externs (gather, topk, arg_reduce,
    gather_elements, resize) and a numpy-only extern (cumulative) between chains; outputs from every kind."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("mixed")
    x = b.input("x", (4, 6))
    ids = b.input("ids", (5,), "int64")
    table = b.constant(rng.standard_normal((10, 6)).astype(np.float32), "table")
    w = b.constant(rng.standard_normal((6, 8)).astype(np.float32), "w")
    (emb,) = b.extern("gather", [table, ids], axis=0)  # (5, 6)
    xs = b.compute1("Z[i,j] = tanh(X[i,j])", {"X": x}, "act")
    (flat,) = b.extern("reshape", [x], shape=(24,))  # an alias of a run-time input
    y = b.compute1(MATMUL, {"X": xs, "W": w}, "mm")  # (4, 8)
    (cum,) = b.extern("cumulative", [y], fn="sum", axis=1, exclusive=False, reverse=False)  # numpy only
    e2 = b.compute1("E[i,j] = X[i,j] * 2.0", {"X": emb}, "scale")
    vals, idx = b.extern("topk", [cum], k=3, axis=1, largest=True)
    (am,) = b.extern("arg_reduce", [e2], fn="max", axis=1, keepdims=False, select_last_index=False)
    (ge,) = b.extern("gather_elements", [cum, idx], axis=1)
    img = b.extern("reshape", [y], shape=(1, 1, 4, 8))[0]
    (up,) = b.extern("resize", [img], **_resize_attrs((1, 1, 8, 16)))
    s = b.compute1("S[i,j] = V[i,j] + G[i,j]", {"V": vals, "G": ge}, "sum")
    f2 = b.compute1("F[i] = A[i] * 1.5", {"A": flat}, "flatscale")
    return b.build([s, am, up, f2, cum, idx]), {"x": rng.standard_normal((4, 6)).astype(np.float32),
                                               "ids": np.array([0, 9, -1, 3, 3], np.int64)}


def test_chained_path_matches_per_node_path_and_reference(kernel_cache):
    g, feed = _mixed_graph()
    ex = _executor(g, kernel_cache)
    assert set(ex.natives) >= {"gather", "topk", "arg_reduce", "gather_elements", "resize"} & set(ex.natives)
    assert len(ex.natives) == 5 and len(ex.chains) >= 2  # the numpy cumulative splits the chains
    got, plain = ex(feed), ex.run_per_node(feed)
    ref = evaluate(g, feed)
    for o in g.outputs:
        np.testing.assert_array_equal(got[o], plain[o])
        np.testing.assert_allclose(got[o], ref[o], rtol=1e-5, atol=1e-5)


def test_chained_results_equal_per_node_results_on_several_graphs(kernel_cache):
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (32, 16))
    h = x
    for layer in range(3):
        w = b.constant(rng.standard_normal((16, 16)).astype(np.float32) / 4, f"w{layer}")
        h = b.compute1(MATMUL, {"X": h, "W": w}, "mm")
        h = b.compute1("Z[i,j] = tanh(Y[i,j])", {"Y": h}, "act")
    mid = h
    (r,) = b.extern("reshape", [h], shape=(16, 32))
    out = b.compute1("Q[i,j] = R[i,j] * R[i,j]", {"R": r}, "sq")
    g = b.build([out, mid])  # an intermediate that is also an output
    feed = {"x": rng.standard_normal((32, 16)).astype(np.float32)}
    for kw in ({}, {"serial_below": 0}, {"native_externs": False}):
        ex = _executor(g, kernel_cache, **kw)
        got, plain = ex(feed), ex.run_per_node(feed)
        assert len(ex.chains) == 1 and ex.chains[0].n == 7
        for o in g.outputs:
            np.testing.assert_array_equal(got[o], plain[o])
    assert len(_executor(g, kernel_cache, chain=False).chains) == 0


@pytest.mark.parametrize("largest", [True, False])
def test_native_topk_and_arg_reduce_match_numpy_with_ties_and_nans(kernel_cache, largest):
    b = GraphBuilder()
    x = b.input("x", (3, 40, 2))
    xi = b.input("xi", (5, 9), "int64")
    outs = list(b.extern("topk", [x], k=7, axis=1, largest=largest))
    outs += b.extern("topk", [xi], k=9, axis=1, largest=largest)  # k = n: a stable sort
    for fn in ("max", "min"):
        for last in (False, True):
            outs += b.extern("arg_reduce", [x], fn=fn, axis=1, keepdims=True, select_last_index=last)
            outs += b.extern("arg_reduce", [xi], fn=fn, axis=0, keepdims=False, select_last_index=last)
    outs.append(b.compute1("Z[i,j,k] = X[i,j,k] + 1.0", {"X": x}, "inc"))
    g = b.build(outs)
    ex = _executor(g, kernel_cache)
    assert len(ex.natives) == 10
    rng = np.random.default_rng(2)
    v = rng.integers(-3, 3, (3, 40, 2)).astype(np.float32)  # many ties
    v[0, 5, 0] = v[0, 17, 0] = np.nan
    v[1, :, 1] = np.nan
    v[2, 3, 0] = -0.0
    feed = {"x": v, "xi": rng.integers(-2, 2, (5, 9))}
    got = ex(feed)
    for n in g.nodes:
        if n.is_extern:
            want = evaluate_extern(n.op.kind, [feed[i] for i in n.inputs], n.op.attr)
            for o, w in zip(n.outputs, want):
                np.testing.assert_array_equal(got[o], w, err_msg=f"{n.name} {n.op.attr}")


@pytest.mark.parametrize("mode,coord,extra", [
    ("linear", "half_pixel", {}), ("linear", "align_corners", {}), ("cubic", "half_pixel", {}),
    ("cubic", "asymmetric", {"exclude_outside": True}), ("nearest", "asymmetric", {}),
    ("nearest", "half_pixel", {"nearest_mode": "ceil"}), ("linear", "pytorch_half_pixel", {"antialias": True}),
    ("linear", "tf_crop_and_resize", {"roi": (0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3), "extrapolation_value": -7.0}),
])
def test_native_resize_matches_numpy(kernel_cache, mode, coord, extra):
    b = GraphBuilder()
    x = b.input("x", (1, 2, 5, 6))
    up = b.extern("resize", [x], **_resize_attrs((1, 2, 9, 4), mode, coord, **extra))[0]
    g = b.build([up, b.compute1("Z[i,j,k,l] = X[i,j,k,l] * 2.0", {"X": x}, "dbl")])
    ex = _executor(g, kernel_cache)
    assert "resize" in ex.natives
    feed = {"x": np.random.default_rng(3).standard_normal((1, 2, 5, 6)).astype(np.float32)}
    want = evaluate_extern("resize", [feed["x"]], g.nodes[0].op.attr)[0]
    np.testing.assert_allclose(ex(feed)[up], want, rtol=1e-6, atol=1e-6)


def test_native_index_out_of_range_raises_the_reference_error(kernel_cache):
    b = GraphBuilder()
    data = b.input("data", (4, 3))
    idx = b.input("idx", (2, 3), "int64")
    ids = b.input("ids", (2,), "int64")
    (ge,) = b.extern("gather_elements", [data, idx], axis=0)
    (ga,) = b.extern("gather", [data, ids], axis=0)
    g = b.build([b.compute1("Z[i,j] = A[i,j] + 1.0", {"A": ge}, "inc"), ga])
    ex = _executor(g, kernel_cache)
    assert len(ex.natives) == 2
    ok = {"data": np.arange(12, dtype=np.float32).reshape(4, 3), "idx": np.array([[0, -1, 3], [2, 1, -4]]),
          "ids": np.array([-4, 3])}
    np.testing.assert_array_equal(ex(ok)[ga], ok["data"][[0, 3]])
    with pytest.raises(IndexError, match="gather_elements: index 4 is out of range for an axis of extent 4"):
        ex({**ok, "idx": np.array([[0, 4, 0], [0, 0, 0]])})
    with pytest.raises(IndexError):
        ex({**ok, "ids": np.array([0, 4])})
    odd = {**ok, "ids": np.array([0, -5])}  # numpy's gather wraps -5 + 4 once more: the native path defers to it
    np.testing.assert_array_equal(ex(odd)[ga], ex.run_per_node(odd)[ga])
    np.testing.assert_array_equal(ex(ok)[ga], ok["data"][[0, 3]])  # the status flag was reset


def test_outputs_are_fresh_arrays_never_overwritten_by_a_later_call(kernel_cache):
    g, feed = _mixed_graph()
    ex = _executor(g, kernel_cache)
    first = ex(feed)
    keep = {o: v.copy() for o, v in first.items()}
    second = ex({"x": feed["x"] * 3, "ids": feed["ids"][::-1].copy()})
    for o in g.outputs:
        np.testing.assert_array_equal(first[o], keep[o])
        assert not np.shares_memory(first[o], second[o])
        assert not any(np.shares_memory(first[o], buf) for buf in ex._buffers)


def test_memory_plan_lists_every_buffer_of_a_chained_executor(kernel_cache):
    g, _ = _mixed_graph()
    ex = _executor(g, kernel_cache)
    listed = {t for b in ex.memory.buffers for t in b.tensors}
    for n in g.nodes:
        for o in n.outputs:
            root = ex.root.get(o, o)
            if root in g.inputs or root in g.constant:  # an alias of the caller's or a constant's memory
                continue
            assert root in ex.memory.buffer_of or root in listed, f"{o} of {n.name} is in no listed buffer"
    for call in ex._calls.values():
        for _, local, tensor, buf in call.packs:
            assert any(b.kind == "packed_per_call" and b.tensors == (local, tensor) and b.nbytes == buf.nbytes
                       for b in ex.memory.buffers)


def test_tiny_kernels_are_compiled_without_parallel_regions(kernel_cache):
    b = GraphBuilder()
    small = b.input("s", (4, 8))
    big = b.input("b", (256, 256))
    o1 = b.compute1("Z[i,j] = exp(X[i,j])", {"X": small}, "tiny")
    o2 = b.compute1("Z[i,j] = exp(X[i,j])", {"X": big}, "large")
    g = b.build([o1, o2])
    ex = _executor(g, kernel_cache, serial_below=10_000)
    by_node = {n.name: ex.kernels[ex.node_kernel[n.name]] for n in g.nodes}
    assert kernel_work(by_node["tiny"].compute) == 32 * 9 and kernel_work(by_node["large"].compute) == 65536 * 9
    assert "omp parallel" not in by_node["tiny"].source.code
    assert "omp parallel" in by_node["large"].source.code
    feed = {"s": np.ones((4, 8), np.float32), "b": np.zeros((256, 256), np.float32)}
    out = ex(feed)
    np.testing.assert_allclose(out[o1], np.e, rtol=1e-6)
    np.testing.assert_allclose(out[o2], 1.0)


def test_an_output_the_caller_let_go_is_reused_one_still_held_never(kernel_cache):
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.compute1("Z[i,j] = X[i,j] * 2.0", {"X": x}, "dbl")
    (flat,) = b.extern("reshape", [y], shape=(32,))
    g = b.build([flat])
    ex = _executor(g, kernel_cache)
    ones = np.ones((4, 8), np.float32)
    held = ex({"x": ones})[flat]  # a reshape of the kernel's fresh output
    view = held[::2]
    again = ex({"x": 3 * ones})[flat]
    assert not np.shares_memory(held, again) and (held == 2).all() and (view == 2).all()
    del held
    fourth = ex({"x": 4 * ones})[flat]  # the view still refers to the first call's memory
    assert not np.shares_memory(view, fourth) and (view == 2).all()
    del view, fourth, again
    last = ex({"x": 5 * ones})[flat]
    address = last.__array_interface__["data"][0]
    del last  # the caller drops it: the next call may write into the same memory
    third = ex({"x": 6 * ones})[flat]
    assert third.__array_interface__["data"][0] == address and (third == 12).all()
