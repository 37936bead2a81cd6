"""C code generation: every op-table case compiles and matches its reference, illegal schedules
are rejected with a reason, traces round-trip through JSON, and a few kernels are snapshotted."""

from pathlib import Path

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate
from superopt.lang import compile_op
from superopt.loopnest import Loop, build_loopnest
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import build_kernel
from superopt.schedule import (
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    Pack,
    Parallel,
    Reorder,
    Split,
    Unroll,
    Vectorize,
    trace_from_json,
    trace_to_json,
)
from superopt.schedule.default import default_schedule
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.plan import ScheduleError, lower
from superopt.target import avx512_target, h200_target, host_target
from superopt.testing.op_table import CASES, case_graph, case_reference

SNAPSHOTS = Path(__file__).parent / "snapshots"
MATMUL = "C[i,j] += A[i,k] * B[k,j]"
SOFTMAX = "m[i] max= X[i,j]\ne[i,j] = exp(X[i,j] - m[i])\ns[i] += e[i,j]\nY[i,j] = e[i,j] / s[i]"
CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
CONV_BIAS_RELU = ("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\nT[n,co,y,x] = P[n,co,y,x] + B[co]\n"
                  "O[n,co,y,x] = relu(T[n,co,y,x])")


def test_every_op_table_case_compiles_and_matches_reference(kernel_cache):
    """One executor per case, all with default schedules: compiled C vs the independent reference."""
    failures = []
    for case in CASES:
        graph, feed = case_graph(case)
        ex = GraphExecutor(graph, default_schedules(graph, host_target(2)),
                           ExecutorConfig(threads=2, compiler=kernel_cache))
        got = [ex(feed)[o] for o in graph.outputs]
        for g, r in zip(got, case_reference(case)):
            if g.shape != r.shape or not np.allclose(g, r, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                                     equal_nan=True):
                failures.append(case.name)
    assert not failures, f"compiled output differs from reference for {failures}"


def test_default_schedules_match_interpreter(kernel_cache):
    rng = np.random.default_rng(0)
    cases = [
        (compile_op(MATMUL, {"A": (67, 45), "B": (45, 83)}), None),
        (compile_op(SOFTMAX, {"X": (33, 70)}), None),
        (compile_op(CAPSULE, {"P": (2, 9, 9, 8, 4, 4), "W": (3, 3, 8, 8, 4, 4)}), None),
    ]
    for c, _ in cases:
        trace = default_schedule(c)
        assert trace, "the heuristic found no schedule"
        k = build_kernel(c, trace, kernel_cache, threads=2)
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        g_outs = k(*args)
        from superopt.interp import evaluate_compute

        for got, ref in zip(g_outs, evaluate_compute(c, args, np.float64)):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("trace, reason", [
    ([Split("C", "q", 4)], "has no loop 'q'"),
    ([Parallel("C", "k")], "reduction loop cannot run in parallel"),
    ([Vectorize("C", "i")], "must be innermost"),
    ([Reorder("C", ("i", "k", "j")), Fuse("C", "i", "k")], "cannot fuse a reduction loop with a spatial loop"),
    ([Parallel("C", "i"), Parallel("C", "j")], "serial loops outside it"),
    ([Unroll("C", "i")], "too large to unroll"),
    ([Inline("C")], "only elementwise"),
    ([Pack("C", (0, 1))], "only kernel inputs"),
    ([Pack("A", (0, 0))], "not a permutation"),
    ([ComputeAt("C", "C", "i")], "no consumer stage"),
    ([CacheWrite("C", "zz")], "has no loop 'zz'"),
])
def test_illegal_schedules_are_rejected_with_reason(trace, reason):
    c = compile_op(MATMUL, {"A": (128, 64), "B": (64, 96)})
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace)


def test_compute_at_requires_whole_bound_loops():
    c = compile_op(SOFTMAX, {"X": (8, 16)})
    with pytest.raises(ScheduleError, match="read by"):
        lower(c, [ComputeAt("m", "Y", "i")])  # e also reads m
    # (attached at the outer loop of a split, a stage computes the split's block: tests/test_attention_blocks.py;
    # an inner loop fused with another one leaves no block)
    with pytest.raises(ScheduleError, match="split or fused"):
        lower(c, [Split("Y", "i", 2), Fuse("Y", "i_i", "j")] + [ComputeAt(t, "Y", "i_o") for t in ("s", "e", "m")])


def test_trace_json_round_trip():
    trace = [Split("C", "i", 6), Reorder("C", ("i_o", "j", "k", "i_i")), Fuse("C", "i_o", "j"),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "i_i"), Parallel("C", "i_o_j"),
             ComputeAt("m", "Y", "i"), Inline("e"), Pack("B", (1, 0), 1, 16), Epilogue("O", "C")]
    again = trace_from_json(trace_to_json(trace))
    assert list(again) == trace
    assert trace_to_json(again) == trace_to_json(trace)
    with pytest.raises(ValueError, match="unknown schedule primitive"):
        trace_from_json('[{"kind": "Teleport", "stage": "C"}]')


SNAPSHOT_CASES = {
    "matmul_tiled": (MATMUL, {"A": (64, 48), "B": (48, 64)},
                     [Split("C", "i", 4), Split("C", "j", 32), Reorder("C", ("i_o", "j_o", "k", "i_i", "j_i")),
                      CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Parallel("C", "i_o"),
                      Pack("B", (0, 1), 1, 32)]),
    "softmax_rowwise": (SOFTMAX, {"X": (16, 40)}, None),
    "capsule_default": (CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)}, None),
    "conv_bias_relu_epilogue": (CONV_BIAS_RELU, {"X": (1, 16, 10, 10), "W": (32, 16, 3, 3), "B": (32,)}, None,
                                {"extents": {"y": 10, "x": 10}, "padding": {"X": 0.0}, "outputs": ["O"]}),
}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_CASES))
def test_generated_c_snapshot(name, update_snapshots):
    src, shapes, trace, *kw = SNAPSHOT_CASES[name]
    c = compile_op(src, shapes, **(kw[0] if kw else {}))
    target = avx512_target(2)  # the snapshots are of the AVX-512 schedules, whatever the host
    trace = default_schedule(c, target) if trace is None else trace
    code = "/* trace: " + trace_to_json(trace) + " */\n" + emit_c(lower(c, trace, target), name).code
    path = SNAPSHOTS / f"{name}.c"
    if update_snapshots or not path.exists():
        path.write_text(code)
    assert code == path.read_text(), f"generated C for {name} changed; rerun with --update-snapshots if intended"


def test_kernel_rejects_wrong_shapes(kernel_cache):
    c = compile_op(MATMUL, {"A": (4, 3), "B": (3, 5)})
    k = build_kernel(c, [], kernel_cache)
    with pytest.raises(ValueError, match="input 'A' has shape"):
        k(np.zeros((3, 4), np.float32), np.zeros((3, 5), np.float32))


def test_executor_reuses_buffers_and_matches(kernel_cache):
    from superopt.builder import GraphBuilder

    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", (32, 16))
    h = x
    for layer in range(4):
        w = b.constant(rng.standard_normal((16, 16)).astype(np.float32) / 4, f"w{layer}")
        h = b.compute1(MATMUL.replace("C[", "Y[").replace("A[", "X[").replace("B[", "W["), {"X": h, "W": w}, "mm")
        h = b.compute1("Z[i,j] = tanh(Y[i,j])", {"Y": h}, "act")
    g = b.build([h])
    ex = GraphExecutor(g, default_schedules(g, host_target(2)), ExecutorConfig(compiler=kernel_cache))
    assert len(ex.memory.buffer_bytes) <= 2  # 7 intermediates share two buffers
    X = rng.standard_normal((32, 16)).astype(np.float32)
    first = ex({"x": X})[h]
    second = ex({"x": X})[h]
    np.testing.assert_allclose(first, evaluate(g, {"x": X}, np.float64)[h], rtol=1e-5, atol=1e-6)
    assert first is not second and np.array_equal(first, second)


def test_vectorized_max_min_and_exp_keep_ieee_special_values(kernel_cache):
    """The fast paths (NaN flag beside a plain max/min chain, branch-free exp) must keep NaN and limits."""
    src = "mx[i] max= X[i,j]\nmn[i] min= X[i,j]\nE[i,j] = exp(X[i,j])"
    c = compile_op(src, {"X": (6, 40)}, outputs=["mx", "mn", "E"])
    X = np.random.default_rng(5).standard_normal((6, 40)).astype(np.float32) * 30
    X[1, 7] = np.nan  # NaN anywhere in a row poisons max and min
    X[2, 39] = np.nan  # ... also in the vector tail
    X[3, :4] = [np.inf, -np.inf, 88.5, -88.5]
    X[4, :6] = [100.0, -100.0, -87.2, 88.7, 0.0, 1e-30]
    for trace in (default_schedule(c), []):
        mx, mn, E = build_kernel(c, trace, kernel_cache)(X)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(mx, X.max(1))
            np.testing.assert_array_equal(mn, X.min(1))
            np.testing.assert_allclose(E, np.exp(X), rtol=2e-6, atol=1e-37, equal_nan=True)


def test_relu_keeps_nan_inline_and_in_a_contraction_epilogue(kernel_cache):
    """relu(NaN) and sign(NaN) are NaN, as numpy's maximum(x, 0) and onnxruntime (a NaN input row must not come out as 0)."""
    src = "T[i,j] += X[i,k] * W[k,j]\nO[i,j] = relu(T[i,j])\nR[i,j] = relu(X[i,j])\nS[i,j] = sign(X[i,j])"
    c = compile_op(src, {"X": (4, 16), "W": (16, 8)}, outputs=["O", "R", "S"])
    X = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    X[0, 0], X[2, 3] = np.nan, -np.inf
    W = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    want_o, want_r = np.maximum(X.astype(np.float64) @ W, 0), np.maximum(X, 0)
    for trace in (default_schedule(c), []):
        O, R, S = build_kernel(c, trace, kernel_cache)(X, W)
        assert np.isnan(O[0]).all() and np.isnan(R[0, 0]) and np.isnan(S[0, 0])
        np.testing.assert_array_equal(S, np.sign(X))
        np.testing.assert_allclose(O, want_o, rtol=1e-5, atol=1e-5, equal_nan=True)
        np.testing.assert_array_equal(R, want_r)


def test_buffers_superopt_owns_are_cache_line_aligned(kernel_cache):
    from superopt.runtime.buffers import aligned_empty, is_aligned

    for shape in [(1,), (3, 5), (7, 64, 3)]:
        a = aligned_empty(shape, np.float32)
        assert a.shape == shape and a.flags.c_contiguous and is_aligned(a)
    c = compile_op(MATMUL, {"A": (9, 20), "B": (20, 40)})
    trace = default_schedule(c)
    assert any(isinstance(p, Pack) for p in trace)
    k = build_kernel(c, trace, kernel_cache)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((9, 20), np.float32), rng.standard_normal((20, 40), np.float32)
    packed = k.pack("B", B)
    (C,) = k(A, B)
    assert is_aligned(packed) and is_aligned(C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-5)


EPILOGUE_MM = "P[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(P[i,j] + C[j]) + R[i,j]"


@pytest.mark.parametrize("extra, reason", [
    ([Reorder("P", ("k", "i", "j")), Epilogue("O", "P")], "needs a CacheWrite"),
    ([CacheWrite("P", "k"), Epilogue("P", "O")], "is a reduction, not an elementwise stage"),
    ([CacheWrite("P", "k"), Epilogue("O", "Q")], "no producer stage"),
    ([CacheWrite("P", "k"), Epilogue("O", "P"), Epilogue("O", "P")], "one epilogue"),
])
def test_illegal_epilogues_are_rejected_with_reason(extra, reason):
    c = compile_op(EPILOGUE_MM, {"A": (8, 4), "B": (4, 16), "C": (16,), "R": (8, 16)}, outputs=["O"])
    with pytest.raises(ScheduleError, match=reason):
        lower(c, extra)


def test_epilogue_reading_the_producer_elsewhere_is_rejected():
    c = compile_op("P[i,j] += A[i,k] * B[k,j]\nO[i,j] = P[i,j] + P[j,i]", {"A": (8, 4), "B": (4, 8)}, outputs=["O"])
    with pytest.raises(ScheduleError, match="only at its own output index"):
        lower(c, [CacheWrite("P", "k"), Epilogue("O", "P")])


def test_epilogue_runs_on_the_register_tile_and_the_producer_is_never_stored(kernel_cache):
    c = compile_op(EPILOGUE_MM, {"A": (37, 50), "B": (50, 70), "C": (70,), "R": (37, 70)}, outputs=["O"])
    trace = default_schedule(c)
    assert Epilogue("O", "P") in trace
    source = emit_c(lower(c, trace), "k")
    assert source.workspace == () and not [ln for ln in source.code.splitlines() if "P[" in ln and "/*" not in ln]
    rng = np.random.default_rng(2)
    A, B, C, R = (rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B, C, R)
    np.testing.assert_allclose(got, np.maximum(A @ B + C, 0) + R, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k, block, outputs", [(50, 8, ["O"]), (48, 16, ["O"]), (50, 50, ["O"]), (50, 8, ["O", "P"])])
def test_epilogue_after_reduction_blocks_outside_the_tile(k, block, outputs, kernel_cache):
    """k split into blocks outside the spatial loops (weights reused from cache): the blocks before the
    last keep the running sum in a buffer (P's own when P is an output, else O's), the last adds it to its
    tile and runs the epilogue on the whole sum."""
    c = compile_op(EPILOGUE_MM, {"A": (37, k), "B": (k, 70), "C": (70,), "R": (37, 70)}, outputs=outputs)
    trace = [Split("P", "k", block), Split("P", "j", 16), Reorder("P", ("k_o", "i", "j_o", "k_i", "j_i")),
             CacheWrite("P", "k_i"), Vectorize("P", "j_i"), Epilogue("O", "P")]
    source = emit_c(lower(c, trace), "k")
    assert source.workspace == ()
    rng = np.random.default_rng(k + block)
    A, B, C, R = (rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs)
    got = build_kernel(c, trace, kernel_cache)(A, B, C, R)
    want = {"P": A.astype(np.float64) @ B, "O": np.maximum(A.astype(np.float64) @ B + C, 0) + R}
    for name, value in zip(outputs, got):
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-5)


def test_epilogue_after_reduction_blocks_needs_a_cpu_target_and_one_buffer_type():
    c = compile_op(EPILOGUE_MM, {"A": (8, 32), "B": (32, 16), "C": (16,), "R": (8, 16)}, outputs=["O"])
    trace = [Split("P", "k", 8), Reorder("P", ("k_o", "i", "j", "k_i")), CacheWrite("P", "k_i"), Epilogue("O", "P")]
    with pytest.raises(ScheduleError, match="CPU targets only"):
        lower(c, trace, h200_target())
    mixed = compile_op("P[i,j] += A[i,k] * B[k,j]\nO[i,j] = cast_float64(P[i,j])", {"A": (8, 32), "B": (32, 16)},
                       outputs=["O"])
    with pytest.raises(ScheduleError, match="combined in O's buffer, whose type float64 is not float32"):
        lower(mixed, trace)


def test_default_schedule_packs_weights_but_not_small_run_time_operands(kernel_cache):
    small = compile_op(MATMUL, {"A": (64, 48), "B": (48, 256)})  # (more columns than one register tile)
    big = compile_op(MATMUL, {"A": (64, 1024), "B": (1024, 1024)})
    reread = compile_op(MATMUL, {"A": (1200, 48), "B": (48, 256)})  # 200 blocks of 6 rows read every panel

    def packs(c, consts):
        return [p.stage for p in default_schedule(c, host_target(2), consts) if isinstance(p, Pack)]

    assert packs(small, frozenset({"B"})) == ["B"]  # a weight: packed once, ahead of time
    assert packs(small, frozenset()) == []  # a run-time B already [k, j]: a per-call copy would not pay
    assert packs(big, frozenset()) == ["B"]  # 4 MiB of strided panels: the copy pays for itself
    assert packs(reread, frozenset()) == ["B"]  # re-read by 200 row blocks: whole aligned lines pay for the copy
    from superopt.runtime.kernel import build_kernel

    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((1200, 48), np.float32), rng.standard_normal((48, 256), np.float32)
    (got,) = build_kernel(reread, default_schedule(reread, host_target(2), frozenset()), kernel_cache, 2)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-4, atol=1e-4)


def test_vectorizable_erf_is_accurate(kernel_cache):
    import math

    c = compile_op("Y[i] = erf(X[i])", {"X": (40_003,)})
    x = np.concatenate([np.linspace(-6, 6, 40_000), [np.nan, np.inf, -np.inf]]).astype(np.float32)
    (y,) = build_kernel(c, default_schedule(c), kernel_cache)(x)
    ref = np.array([math.erf(float(v)) if np.isfinite(v) else np.sign(v) if not np.isnan(v) else np.nan for v in x])
    np.testing.assert_allclose(y, ref, rtol=0, atol=5e-7, equal_nan=True)


@pytest.mark.parametrize("n", [128, 320, 200])
def test_long_vector_sums_split_into_partial_sums(n, kernel_cache):
    c = compile_op("S[i] += X[i,j] * X[i,j]\nM[i] = S[i] / 7.0", {"X": (5, n)}, outputs=["M"])
    t = host_target(2)
    trace = default_schedule(c, t)
    assert ("acc_v[" in emit_c(lower(c, trace, t), "k").code) == (n % t.split_sum_lanes == 0 and n >= 2 * t.split_sum_lanes)
    X = np.random.default_rng(n).standard_normal((5, n)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(X)
    np.testing.assert_allclose(got, (X.astype(np.float64) ** 2).sum(1) / 7.0, rtol=1e-5)


def test_last_axis_softmax_and_layernorm_of_rank_4_run_row_wise(kernel_cache):
    """A [1, heads, L, S] softmax is a [heads*L, S] row softmax: parallel rows, statistics per row."""
    from superopt import ops
    from superopt.builder import GraphBuilder

    b = GraphBuilder("g")
    x = b.input("x", (1, 3, 5, 40))
    g = b.constant(np.linspace(0.5, 2.0, 40, dtype=np.float32), "g")
    s = ops.softmax(b, x, -1)
    n = ops.layer_norm(b, s, g, None, -1)
    graph = b.build([n])
    ex = GraphExecutor(graph, default_schedules(graph, host_target(2)), ExecutorConfig(compiler=kernel_cache))
    for node in graph.nodes:
        if not node.is_extern:
            assert node.op.type_of[node.op.outputs[0]].rank == 2
            trace = ex.traces[node.name]  # the rows in parallel, or blocks of rows (a max taken a row ahead)
            assert any(isinstance(p, ComputeAt) for p in trace) and \
                {Parallel(node.op.outputs[0], "i0"), Parallel(node.op.outputs[0], "i0_o")} & set(trace)
    X = np.random.default_rng(4).standard_normal((1, 3, 5, 40)).astype(np.float32)
    e = np.exp(X - X.max(-1, keepdims=True))
    sm = e / e.sum(-1, keepdims=True)
    want = (sm - sm.mean(-1, keepdims=True)) / np.sqrt(sm.var(-1, keepdims=True) + 1e-5) * np.linspace(0.5, 2.0, 40)
    np.testing.assert_allclose(ex({"x": X})[n], want, rtol=1e-4, atol=1e-4)


def test_transposes_are_copied_in_blocks(kernel_cache):
    c = compile_op("O[a,j,i] = X[a,i,j]", {"X": (3, 48, 32)})
    lanes = host_target(2).lanes("float32")
    trace = default_schedule(c, host_target(2))
    assert Split("O", "i", lanes) in trace and Split("O", "j", lanes) in trace
    X = np.random.default_rng(0).standard_normal((3, 48, 32)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache)(X)
    np.testing.assert_array_equal(got, X.transpose(0, 2, 1))
    odd = compile_op("O[j,i] = X[i,j]", {"X": (20, 7)})  # a side shorter than a vector: the plain schedule
    assert not any(isinstance(p, Split) for p in default_schedule(odd))
    # NCHWc back to NCHW (56 pixels a row: blocks of 8, which 56 and the lanes divide, are copied whole)
    tail = compile_op("O[b,c,y,x] = X[b,y,x,c]", {"X": (2, 5, 56, lanes)})
    trace = default_schedule(tail, host_target(2))
    assert Split("O", "x", 8) in trace
    X = np.random.default_rng(1).standard_normal((2, 5, 56, lanes)).astype(np.float32)
    (got,) = build_kernel(tail, trace, kernel_cache)(X)
    np.testing.assert_array_equal(got, X.transpose(0, 3, 1, 2))


def test_vectorizable_exp_is_accurate_over_the_whole_float_range(kernel_cache):
    c = compile_op("Y[i] = exp(X[i])", {"X": (200_003,)})
    x = np.concatenate([np.linspace(-104, 90, 200_000), [88.72, 88.7228, 88.73]]).astype(np.float32)
    (y,) = build_kernel(c, default_schedule(c), kernel_cache)(x)
    ref = np.exp(x.astype(np.float64))
    normal = (ref > 1e-37) & (ref < np.finfo(np.float32).max)
    assert np.max(np.abs(y[normal] - ref[normal]) / ref[normal]) < 2.5e-7  # about 2 ulp
    assert np.all(np.isinf(y[ref >= np.finfo(np.float32).max]))  # overflow is +inf, below it is finite
    assert np.all(np.abs(y[ref <= 1e-37]) <= 1e-37)  # deep underflow flushes to 0


def test_tail_guard_survives_when_the_accumulator_sits_on_the_tailed_loop(kernel_cache):
    """Found by the sampler: a tile lane past the tail may be computed, but never written back."""
    c = compile_op(CONV_BIAS_RELU, {"X": (1, 3, 6, 7), "W": (5, 3, 3, 3), "B": (5,)},
                   extents={"y": 6, "x": 7}, padding={"X": 0.0}, outputs=["O"])
    trace = [Split("P", "x", 2), Reorder("P", ("co", "y", "x_o", "kw", "ci", "kh", "n", "x_i")),
             CacheWrite("P", "x_i"), Fuse("P", "co", "y"), Vectorize("P", "x_i")]
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    from superopt.interp import evaluate_compute

    (got,) = build_kernel(c, trace, kernel_cache)(*args)
    np.testing.assert_allclose(got, evaluate_compute(c, args, np.float64)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,k", [((21, 3), 1), ((9, 7), -2), ((5, 12), 3), ((33, 17), 0)])
def test_index_comparisons_compile_as_integer_compares(shape, k):
    """A Trilu-style mask compares index expressions; compared as floats (int64 -> float), gcc 12 -O3 -mavx2
    vectorized it wrongly and dropped elements (found by the differential fuzzer, seed 229)."""
    import numpy as np

    from superopt.api import OptimizeConfig, optimize_op

    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1
    src = f"Y[i,j] = where(j <= i + {float(k)}, X[i,j], 0.0)"
    prog = optimize_op(src, {"X": shape}, OptimizeConfig(threads=1, cost_model=None))
    np.testing.assert_array_equal(prog(x)[0], np.tril(x, k))
    code = open(prog.executor.kernels[0].lib._name[:-3] + ".c").read()
    assert "<= 0)" in code and "1.0f)" not in code.split("void k0")[1]


@pytest.mark.parametrize("cols", [512, 500])
def test_large_packs_are_split_among_the_threads(cols, kernel_cache):
    """A pack of at least PARALLEL_PACK_ELEMENTS elements runs as a parallel loop (a run-time input is
    packed on every call); an exact last panel needs no range test, a partial one zero-fills its tail."""
    from superopt.loopnest.build_packs import PARALLEL_PACK_ELEMENTS

    c = compile_op("O[i,j] += A[i,k] * B[k,j]", {"A": (64, 256), "B": (256, cols)})
    target = host_target(2)
    trace = default_schedule(c, target)
    src = emit_c(lower(c, trace, target), "mm").code
    pack = src[src.index("_pack_B("):]
    assert 256 * cols >= PARALLEL_PACK_ELEMENTS and "#pragma omp parallel for" in pack
    assert "? src[" not in pack  # (a run-time bound on the last panel, not a test per element)
    assert ("] = 0;" in pack) == (cols % 64 != 0)  # panels of 64 columns: a partial last one zero-filled
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, cols)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=target)(A, B)
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cols, split", [(19, False), (44, False), (56, True)])
def test_a_window_row_whose_last_tile_would_be_narrower_than_a_vector_is_one_tile(cols, split, kernel_cache):
    """A depthwise conv of 19 or 44 output columns (16 + 3, 32 + 12 on AVX-512): the last column tile would
    be narrower than a vector, a loop gcc runs whole in its scalar remainder, so the row is one tile (its
    last vector partial). 56 (32 + 24) keeps its split. Either way the result matches the reference."""
    from superopt.schedule.primitives import Split

    h = cols + 4
    c = compile_op("O[c,y,x] += X[c,y+kh,x+kw] * W[c,kh,kw]", {"X": (6, h, h), "W": (6, 5, 5)})
    trace = default_schedule(c, avx512_target(2))
    assert any(isinstance(p, Split) and p.loop == "x" for p in trace) == split, trace
    rng = np.random.default_rng(7)
    X, W = rng.standard_normal((6, h, h)).astype(np.float32), rng.standard_normal((6, 5, 5)).astype(np.float32)
    (got,) = build_kernel(c, default_schedule(c, host_target(2)), kernel_cache)(X, W)
    want = sum(X[:, kh:kh + cols, kw:kw + cols].astype(np.float64) * W[:, kh, kw, None, None]
               for kh in range(5) for kw in range(5))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_depthwise_conv_columns_are_not_fused_through_its_window_and_its_channels_run_in_parallel(kernel_cache):
    """A depthwise conv reading a padded copy (rows of 58 for an output row of 56): fusing y and x into one
    column loop would make the read a div/mod (gathers), so x alone is the vector column; its two panels of
    x (32 + a partial 24) cannot feed 2 threads, so the channel loop is the parallel one. The copy itself
    is not an explicit simd loop over x (its bounds test would become masked gathers)."""
    from superopt.schedule.primitives import Fuse, Parallel

    src = "P[c,py,px] = X[c,py-1,px-1]\nO[c,y,x] += P[c,y+kh,x+kw] * W[c,kh,kw]"
    c = compile_op(src, {"X": (16, 56, 56), "W": (16, 3, 3)}, extents={"py": 58, "px": 58, "y": 56, "x": 56},
                   padding={"X": 0.0}, outputs=["O"])
    trace = default_schedule(c, avx512_target(2))
    assert not [p for p in trace if isinstance(p, Fuse) and p.stage == "O"]
    assert Parallel("O", "c") in trace
    # the padded copy's bounds test moves with x: left to the compiler, not an explicit simd loop
    assert not [p for p in trace if isinstance(p, Vectorize) and p.stage == "P"]
    rng = np.random.default_rng(6)
    X, W = rng.standard_normal((16, 56, 56)).astype(np.float32), rng.standard_normal((16, 3, 3)).astype(np.float32)
    (got,) = build_kernel(c, default_schedule(c, host_target(2)), kernel_cache)(X, W)
    xp = np.pad(X.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    want = sum(xp[:, kh:kh + 56, kw:kw + 56] * W[:, kh, kw, None, None] for kh in range(3) for kw in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_vectorized_exp_is_within_one_ulp_and_keeps_its_edges(kernel_cache):
    """so_expf fixes its range on the result (not by clamping x, which GCC turned into four compares and three
    blends): NaN stays NaN, -inf and anything below -87 give 0, above ln(FLT_MAX) +inf; 1 ulp in between."""
    edges = np.array([np.nan, -np.inf, np.inf, -1e30, 1e30, -100.0, -87.5, -87.0, 0.0, -0.0, 88.5, 88.7228, 88.723,
                      89.0], np.float32)
    xs = np.concatenate([edges, np.random.default_rng(0).uniform(-86.9, 88.7, 100_000).astype(np.float32)])
    c = compile_op("Y[i] = exp(X[i])", {"X": xs.shape})
    trace = default_schedule(c)
    assert any(isinstance(s, Vectorize) for s in trace), "the exp loop should be vectorized"
    (got,) = build_kernel(c, trace, kernel_cache, threads=1)(xs)
    want = [np.nan, 0.0, np.inf, 0.0, np.inf, 0.0, 0.0, 0.0, 1.0, 1.0, np.exp(np.float64(88.5)),
            np.exp(np.float64(np.float32(88.7228))), np.inf, np.inf]
    np.testing.assert_allclose(got[:len(edges)], np.array(want, np.float32), rtol=2e-7)
    ref = np.exp(xs[len(edges):].astype(np.float64)).astype(np.float32)
    ulps = np.abs(got[len(edges):] - ref) / np.spacing(ref)
    assert ulps.max() <= 1.0, f"exp is {ulps.max()} ulp off"


def test_a_short_window_reduction_is_unrolled_and_a_matrix_reduction_is_not(kernel_cache):
    """The tiled contraction fully unrolls its innermost reduction when it is a conv window's columns of at
    most UNROLL_REDUCTION steps (kw in X[.., x+kw]); capsule votes' 4-step matrix reduction r stays rolled."""
    from superopt.schedule.contraction import UNROLL_REDUCTION

    conv = compile_op(CONV_BIAS_RELU, {"X": (1, 8, 12, 12), "W": (16, 8, 3, 3), "B": (16,)},
                      extents={"y": 12, "x": 12}, padding={"X": 0.0}, outputs=["O"])
    trace = default_schedule(conv)
    assert Unroll("P", "kw") in trace and 3 <= UNROLL_REDUCTION
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(conv.type_of[i].shape).astype(np.float32) for i in conv.inputs]
    from superopt.interp import evaluate_compute

    (got,) = build_kernel(conv, trace, kernel_cache, threads=2)(*args)
    np.testing.assert_allclose(got, evaluate_compute(conv, args, np.float64)[0], rtol=1e-4, atol=1e-4)
    caps = compile_op(CAPSULE, {"P": (2, 9, 9, 8, 4, 4), "W": (3, 3, 8, 8, 4, 4)})
    caps_trace = default_schedule(caps)
    innermost_red = [d for d in [p for p in caps_trace if isinstance(p, Reorder)][-1].order
                     if d in caps.statements[0].reduce_dims][-1]
    assert innermost_red == "r" and Unroll("V", "r") not in caps_trace


@pytest.mark.parametrize("depth", [48, 36])
def test_a_pack_that_transposes_copies_register_blocks_where_the_extents_allow(depth, kernel_cache):
    """B read as B[j, k] by a tile that vectorizes j is packed k-major: the pack copies lanes x lanes blocks
    transposed in registers (so_transposeL), and where an extent is not a multiple of the lanes, the blocks at its
    edge element by element; either way the product matches float64."""
    c = compile_op("O[i,j] += A[i,k] * B[j,k]", {"A": (24, depth), "B": (64, depth)})
    target = host_target(2)
    lanes = target.lanes("float32")
    trace = default_schedule(c, target)
    nest = lower(c, trace, target)
    src = emit_c(nest, "mmt").code
    pack = src[src.index("_pack_B("):]
    assert f"so_transpose{lanes}(" in pack, pack
    assert (f"so_transpose{lanes}p(" in pack) == ("_e = " in pack) == (depth % lanes != 0), pack  # (edge blocks)
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((24, depth)).astype(np.float32), rng.standard_normal((64, depth)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=target)(A, B)
    np.testing.assert_allclose(got, A.astype(np.float64) @ B.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes", [8, 16])
def test_the_register_transposes_of_the_prelude_transpose(lanes, tmp_path):
    """so_transpose8/16 on a strided block: row k of the output is column k of the input."""
    import ctypes

    from superopt.runtime.compiler import CompilerConfig, compile_library

    code = (f"void tr(const float *s, float *d) {{ so_transpose{lanes}(s, {lanes + 3}, d, {lanes + 5}); }}\n")
    lib = ctypes.CDLL(str(compile_library([code], CompilerConfig(cache_dir=tmp_path))))
    src = np.arange(lanes * (lanes + 3), dtype=np.float32)
    dst = np.zeros(lanes * (lanes + 5), np.float32)
    lib.tr(src.ctypes.data_as(ctypes.c_void_p), dst.ctypes.data_as(ctypes.c_void_p))
    block = src.reshape(lanes, lanes + 3)[:, :lanes]
    np.testing.assert_array_equal(dst.reshape(lanes, lanes + 5)[:, :lanes], block.T)
    assert not dst.reshape(lanes, lanes + 5)[:, lanes:].any()  # nothing written between the rows


@pytest.mark.parametrize("rows, cols, call", [(64, 48, "so_transpose16("), (16, 56, "so_transpose8("),
                                             (40, 20, "so_transpose16p(")])
def test_a_transpose_copies_whole_blocks_by_register_shuffles(rows, cols, call, kernel_cache):
    """``O[j,i] = X[i,j]``: blocks both sides divide (16, else 8) are one so_transposeL each (the loop
    nest's ``transposed`` loops); sides that leave partial blocks copy them with masked loads and stores
    (so_transposeLp). Exact either way."""
    target = avx512_target(2)
    c = compile_op("O[j,i] = X[i,j]", {"X": (rows, cols)})
    trace = default_schedule(c, target)
    kinds = [v.node.kind for v in build_loopnest(lower(c, trace, target)).walk() if isinstance(v.node, Loop)]
    code = emit_c(lower(c, trace, target), "tr").code
    assert "transposed" in kinds and call in code, code
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=target)(x)
    np.testing.assert_array_equal(got, x.T)


@pytest.mark.parametrize("exponent", [0.5, 0.25, 0.75, 1.5, -0.5, -0.75, 2.0])
def test_powers_by_square_roots_match_powf_and_keep_its_special_values(exponent, kernel_cache):
    """pow with a literal exponent that roots reach (LRN's 0.75) is spelled by sqrt, which vectorizes; the
    results stay within 2 ulp of the exact power, with powf's values at 0, -0, inf, -inf, NaN and below 0."""
    c = compile_op(f"Y[i] = pow(X[i], {exponent})", {"X": (4_011,)})
    assert "powf(" not in emit_c(lower(c, default_schedule(c))).code
    x = np.concatenate([np.geomspace(1e-30, 1e30, 4_000), [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -2.5, 1.0,
                                                            3e-39, 2.0, 16.0]]).astype(np.float32)
    (y,) = build_kernel(c, default_schedule(c), kernel_cache)(x)
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), exponent)
        ref[np.isneginf(x)] = np.inf if exponent > 0 else 0.0  # C's pow at -inf (numpy's float64 agrees)
        ref32 = ref.astype(np.float32)
    same_special = np.isnan(ref32) == np.isnan(y)
    assert same_special.all(), x[~same_special]
    finite = np.isfinite(ref32) & (ref32 != 0)
    np.testing.assert_array_equal(y[~finite & ~np.isnan(ref32)], ref32[~finite & ~np.isnan(ref32)])
    assert not np.signbit(y[x == 0]).any()
    np.testing.assert_allclose(y[finite], ref[finite], rtol=2.5e-7, atol=1e-44)  # (a few ulps of a subnormal)
