"""Materialize or recompute: reductions of a contraction's result folded into its write-back.

``T[i,j,k] += A[i,k,r] * B[r,j]; S[i,j] += T[i,j,k]; Q[i,j] += T[i,j,k] * T[i,j,k]``: with
``ReduceEpilogue`` the contraction's register tile is consumed by S and Q as it is written back, so T
is never stored. Checked against the reference interpreter (several shapes, tails), through the
executor's memory plan (no buffer holds T), and for illegal folds (a one-line reason each).
"""

import re

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate
from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import build_kernel
from superopt.schedule.default import FOLD_REDUCTIONS, default_schedule, sketch_names
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    InPlace,
    NextRow,
    Parallel,
    ReduceEpilogue,
    Reorder,
    Split,
    Vectorize,
    trace_from_json,
    trace_to_json,
)
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import host_target

MOMENTS = "T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k]\nQ[i,j] += T[i,j,k] * T[i,j,k]"


def _compile(graph, kernel_cache) -> GraphExecutor:
    """The graph as it is (no rewrites), default schedules, 2 threads."""
    target = host_target(2)
    return GraphExecutor(graph, default_schedules(graph, target), ExecutorConfig(2, kernel_cache, target))


def _graph(src: str, shapes: dict[str, tuple[int, ...]], outputs: list[str], extents=None):
    b = GraphBuilder("fold")
    names = {local: b.input(local.lower(), shape) for local, shape in shapes.items()}
    outs = b.compute(src, names, "ms", outputs=outputs, extents=extents)
    return b.build(outs), names


def _feed(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}


def _check(graph, ex, rtol: float = 1e-4) -> None:
    feed = _feed(graph)
    got, ref = ex(feed), evaluate(graph, feed, np.float64)
    for o in graph.outputs:
        scale = max(float(np.abs(ref[o]).max()), 1e-30)
        assert np.abs(got[o] - ref[o]).max() <= rtol * scale, o


@pytest.mark.parametrize("i, j, k, r", [(3, 20, 13, 5), (4, 16, 8, 32), (2, 7, 9, 3), (5, 33, 17, 40)])
def test_moments_fold_into_the_contraction_and_match_reference(i, j, k, r, kernel_cache):
    graph, _ = _graph(MOMENTS, {"A": (i, k, r), "B": (r, j)}, ["S", "Q"])
    ex = _compile(graph, kernel_cache)
    (trace,) = ex.traces.values()
    assert ReduceEpilogue("S", "T") in trace and ReduceEpilogue("Q", "T") in trace
    _check(graph, ex)
    (node,) = graph.nodes
    assert not ex.memory.holding("T", node.name), ex.memory  # T lives in registers only
    code = emit_c(lower(node.op, trace)).code
    assert "workspace" not in code and not [ln for ln in code.splitlines() if "T[" in ln and "/*" not in ln]


@pytest.mark.parametrize("src, outputs", [
    # a weighted sum and a weighted sum of squares, the weights indexed by the reduced dim
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k] * C[k]\nQ[i,j] += T[i,j,k] * T[i,j,k] * C[k]", ["S", "Q"]),
    # reductions over another dim (the vector columns must then be k) and a max
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,k] += T[i,j,k]\nM[i,k] max= T[i,j,k]", ["S", "M"]),
    # the contraction is an output too: stored, and folded
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[j] += T[i,j,k]", ["T", "S"]),
    # an elementwise epilogue and a folded reduction at the same write-back
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nU[i,j,k] = relu(T[i,j,k])\nS[i,j] += T[i,j,k]", ["U", "S"]),
    # a folded reduction read by a later stage (complete once the contraction's loops end)
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k]\nO[i,j] = S[i,j] * 2.0 + 1.0", ["O"]),
])
def test_other_folded_reductions_match_reference(src, outputs, kernel_cache):
    graph, _ = _graph(src, {"A": (3, 11, 6), "B": (6, 19), "C": (11,)} if "C[" in src else
                      {"A": (3, 11, 6), "B": (6, 19)}, outputs)
    ex = _compile(graph, kernel_cache)
    (trace,) = ex.traces.values()
    assert any(isinstance(p, ReduceEpilogue) for p in trace), trace
    _check(graph, ex)


def test_vector_lanes_over_a_folded_reduction_dim_stay_correct(kernel_cache):
    """A tile vectorized along k, which S sums over: the write-back loop is not vectorized (lanes would
    update one element of S at once), and the result is exact."""
    c = compile_op(MOMENTS, {"A": (3, 24, 4), "B": (4, 5)}, outputs=["S", "Q"])
    trace = [Reorder("T", ("i", "j", "r", "k")), CacheWrite("T", "r"), Vectorize("T", "k"), Parallel("T", "i"),
             ReduceEpilogue("S", "T"), ReduceEpilogue("Q", "T")]
    code = emit_c(lower(c, trace)).code
    assert code.count("#pragma omp simd") == 1  # the accumulation only
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((3, 24, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    S, Q = build_kernel(c, trace, kernel_cache, threads=2)(A, B)
    T = np.einsum("ikr,rj->ijk", A.astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(S, T.sum(2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(Q, (T * T).sum(2), rtol=1e-4, atol=1e-4)


FOLD_BASE = [CacheWrite("T", "r"), ReduceEpilogue("S", "T")]


@pytest.mark.parametrize("src, trace, reason", [
    (MOMENTS, [CacheWrite("T", "r"), Parallel("T", "k"), Reorder("T", ("k", "i", "j", "r")),
               ReduceEpilogue("S", "T")], "walks \\['k'\\], which S reduces over"),
    (MOMENTS, [Split("T", "r", 2), Reorder("T", ("r_o", "i", "j", "k", "r_i")), CacheWrite("T", "r_i"),
               ReduceEpilogue("S", "T")], "needs a CacheWrite holding its whole reduction"),
    (MOMENTS, [Reorder("T", ("r", "i", "j", "k")), ReduceEpilogue("S", "T")], "needs a CacheWrite"),
    (MOMENTS, [CacheWrite("T", "r"), ReduceEpilogue("S", "X")], "no producer stage"),
    (MOMENTS, FOLD_BASE + [ReduceEpilogue("S", "T")], "folded once"),
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k] + T[i,j,0]", FOLD_BASE, "at one index"),
    ("T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] = T[i,j,0]", FOLD_BASE, "is elementwise, not a reduction"),
])
def test_illegal_folds_are_rejected_with_reason(src, trace, reason):
    c = compile_op(src, {"A": (4, 6, 3), "B": (3, 5)}, outputs=["S"])
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace)


def test_fold_is_a_sketch_of_the_schedule_space_and_round_trips():
    c = compile_op(MOMENTS, {"A": (4, 12, 8), "B": (8, 32)}, outputs=["S", "Q"])
    target = host_target(2)
    assert sketch_names(c, target)[0] == FOLD_REDUCTIONS
    space = ScheduleSpace(c, target)
    assert space.default_point().sketch == FOLD_REDUCTIONS and "stages+epilogue" in space.sketches
    trace = default_schedule(c, target)
    assert tuple(trace) == space.trace(space.default_point())
    assert trace_from_json(trace_to_json(trace)) == tuple(trace)
    # a knob of the sketch changes the tile, the result stays legal
    other = space.trace(Point.of(FOLD_REDUCTIONS, {"T.rows": 3}))
    assert other != tuple(trace)


def test_memory_plan_reports_kernel_workspace_per_node_and_tensor(kernel_cache):
    """Materialized (the stages+epilogue sketch), T is a workspace buffer the plan names; folded, none."""
    graph, _ = _graph(MOMENTS, {"A": (3, 9, 4), "B": (4, 10)}, ["S", "Q"])
    (node,) = graph.nodes
    space = ScheduleSpace(node.op, host_target(2))
    stored = space.trace(Point.of("stages+epilogue"))
    ex = GraphExecutor(graph, {node.name: stored}, ExecutorConfig(threads=2, compiler=kernel_cache))
    (buf,) = ex.memory.holding("T", node.name)
    assert (buf.kind, buf.nbytes, buf.node) == ("workspace", 3 * 10 * 9 * 4, node.name)
    assert ex.memory.total_bytes >= buf.nbytes
    assert {b.kind for b in ex.memory.of_node(node.name)} >= {"workspace", "output"}
    _check(graph, ex)


def test_full_size_moments_never_store_t(kernel_cache):
    """The benchmark's size: T would be 256*256*800 floats (210 MB); the memory plan holds no buffer of it
    and nothing near its size. Rows of the result are checked against numpy in float64."""
    i, j, k, r = 256, 256, 800, 32
    graph, names = _graph(MOMENTS, {"A": (i, k, r), "B": (r, j)}, ["S", "Q"])
    (node,) = graph.nodes
    ex = _compile(graph, kernel_cache)
    t_bytes = i * j * k * 4
    assert t_bytes >= 200e6
    assert not ex.memory.holding("T", node.name)
    assert max(b.nbytes for b in ex.memory.buffers) < t_bytes // 100, ex.memory
    rng = np.random.default_rng(0)
    A = rng.standard_normal((i, k, r)).astype(np.float32)
    B = rng.standard_normal((r, j)).astype(np.float32)
    got = ex({names["A"]: A, names["B"]: B})
    S, Q = got[graph.outputs[0]], got[graph.outputs[1]]
    for row in (0, 97, 255):
        T = A[row].astype(np.float64) @ B.astype(np.float64)  # [k, j]
        np.testing.assert_allclose(S[row], T.sum(0), rtol=1e-4, atol=1e-3 * np.abs(T.sum(0)).max())
        np.testing.assert_allclose(Q[row], (T * T).sum(0), rtol=1e-4)


# ---- a row sum folded into the elementwise stage it sums (softmax's Z[i] += E[i, r]) -------------

SOFTMAX = ("M[i,u] max= X[i,r]\nE[i,j] = exp(X[i,j] - M[i,0])\nZ[i,u] += E[i,r]\nR[i,u] = 1.0 / Z[i,u]\n"
           "O[i,j] = E[i,j] * R[i,0]")
ROW_BASE = [ComputeAt("M", "O", "i"), ComputeAt("E", "O", "i"), Vectorize("E", "j"), ComputeAt("Z", "O", "i"),
            ComputeAt("R", "O", "i"), Parallel("O", "i")]


def _softmax(rows: int, cols: int):
    return compile_op(SOFTMAX, {"X": (rows, cols)}, extents={"u": 1})


@pytest.mark.parametrize("rows, cols", [(64, 1000), (7, 16), (5, 24), (33, 257)])
def test_softmax_sums_its_row_as_it_computes_it_and_matches_reference(rows, cols, kernel_cache):
    c = _softmax(rows, cols)
    space = ScheduleSpace(c, host_target(2))
    trace = space.trace(space.default_point())
    assert ReduceEpilogue("Z", "E") in trace  # the default folds the sum
    assert InPlace("E", "O") in trace  # and writes exp into the output row, scaled there in place
    code = emit_c(lower(c, trace)).code
    assert "reduction(+:Z_acc)" in code and not [ln for ln in code.splitlines() if "Z_r" in ln]  # no pass of its own
    assert "float E[" not in code and re.search(r"O\[E_j [^\]]*\] = so_expf\(", code)
    # rows divide into blocks of at least 2 rows, 2 blocks a thread: the next row's max is taken in the exp loop
    assert (NextRow("M", "E") in trace) == (rows in (64, 33))
    X = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32) * 4
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(X)
    ref = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    np.testing.assert_allclose(got, ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    # the same rows summed in a second pass: the knob that turns the fold off
    two_pass = space.trace(Point.of(space.default_point().sketch, {"Z.fold": False, "E.in_place": False}))
    assert not any(isinstance(p, (ReduceEpilogue, InPlace)) for p in two_pass)
    for knobs in ({"Z.fold": False}, {"E.in_place": False}, {"M.next_row": False}):  # each alone: legal, exact
        (got,) = build_kernel(c, space.trace(Point.of(space.default_point().sketch, knobs)), kernel_cache,
                              threads=2)(X)
        np.testing.assert_allclose(got, ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("extra, reason", [
    ([ReduceEpilogue("Z", "E")], None),  # legal: the base case
    ([ReduceEpilogue("M", "E")], "must read E at one index"),  # M reduces X, not E
    ([ReduceEpilogue("R", "E")], "is elementwise, not a reduction"),
])
def test_row_fold_legality(extra, reason):
    c = _softmax(8, 32)
    if reason is None:
        lower(c, ROW_BASE + extra)
        return
    with pytest.raises(ScheduleError, match=reason):
        lower(c, ROW_BASE + extra)


def test_row_fold_needs_both_stages_at_one_loop_a_sum_and_a_cpu():
    c = _softmax(8, 32)
    with pytest.raises(ScheduleError, match="computed at the same consumer loop"):
        lower(c, [ComputeAt("Z", "O", "i"), ComputeAt("R", "O", "i"), Parallel("O", "i"),
                  ReduceEpilogue("Z", "E")])  # E (and M) are root stages
    mx = compile_op("E[i,j] = exp(X[i,j])\nZ[i,u] max= E[i,r]\nO[i,j] = E[i,j] - Z[i,0]", {"X": (8, 32)},
                    extents={"u": 1})
    with pytest.raises(ScheduleError, match="only a sum"):
        lower(mx, [ComputeAt("E", "O", "i"), ComputeAt("Z", "O", "i"), ReduceEpilogue("Z", "E")])
    from superopt.target import h200_target

    with pytest.raises(ScheduleError, match="CPU targets only"):
        lower(c, [p for p in ROW_BASE if not isinstance(p, (Vectorize, Parallel))] + [ReduceEpilogue("Z", "E")],
              h200_target())


@pytest.mark.parametrize("src, trace, reason", [
    # the consumer reads the row at another index (reversed): it would read what it already overwrote
    ("E[i,j] = exp(X[i,j])\nO[i,j] = E[i,j] - E[i,7-j]", [ComputeAt("E", "O", "i"), InPlace("E", "O")],
     "only at its own index"),
    # not attached: E has a buffer of its own
    ("E[i,j] = exp(X[i,j])\nO[i,j] = E[i,j] * 2.0", [InPlace("E", "O")], "computed at O"),
])
def test_in_place_rows_are_rejected_where_a_read_would_see_an_overwrite(src, trace, reason):
    c = compile_op(src, {"X": (4, 8)}, extents={"u": 1} if "u]" in src else None)
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace)


def test_in_place_rows_are_cpu_only():
    from superopt.target import h200_target

    c = compile_op("E[i,j] = exp(X[i,j])\nO[i,j] = E[i,j] * 2.0", {"X": (4, 8)})
    with pytest.raises(ScheduleError, match="CPU targets only"):
        lower(c, [ComputeAt("E", "O", "i"), InPlace("E", "O")], h200_target())


# ---- a row reduction computed one row ahead (softmax's max of row i+1 inside row i's exp loop) --------

AHEAD_BASE = [Split("O", "i", 4), ComputeAt("M", "O", "i_i"), ComputeAt("E", "O", "i_i"), Vectorize("E", "j"),
              ComputeAt("Z", "O", "i_i"), ComputeAt("R", "O", "i_i"), Parallel("O", "i_o")]


@pytest.mark.parametrize("rows, cols, block", [(16, 40, 4), (13, 37, 4), (9, 16, 9), (6, 2, 3)])
def test_next_row_max_matches_reference_with_nan_inf_and_tails(rows, cols, block, kernel_cache):
    """The max of row i+1 reduced inside row i's exp loop (NextRow), blocks of ``block`` rows (13 rows:
    a partial last block), rows holding a NaN, a +inf and only -inf: NaN rows stay NaN, the rest exact."""
    c = _softmax(rows, cols)
    trace = [Split("O", "i", block)] + AHEAD_BASE[1:-1] + [Parallel("O", "i_o"), NextRow("M", "E")]
    code = emit_c(lower(c, trace)).code
    assert "reduction(max:M_next)" in code  # reduced in E's loop, across its lanes
    X = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32) * 4
    X[1, cols // 2] = np.nan
    X[2, 0] = np.inf
    X[3, :] = -np.inf
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(X)
    x = X.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ref = np.exp(x - x.max(1, keepdims=True))
        ref = ref / ref.sum(1, keepdims=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("trace, reason", [
    (AHEAD_BASE + [NextRow("Z", "E")], "read kernel inputs only"),  # Z sums E, a stage
    (AHEAD_BASE + [NextRow("M", "R")], "walk exactly the dim"),  # R has no row to walk
    (AHEAD_BASE + [NextRow("M", "O")], "O must be computed at M's consumer loop"),  # O is the consumer
    ([ComputeAt("M", "O", "i"), ComputeAt("E", "O", "i"), ComputeAt("Z", "O", "i"), ComputeAt("R", "O", "i"),
      Parallel("O", "i"), NextRow("M", "E")], "must be serial"),
])
def test_next_row_is_rejected_with_reason(trace, reason):
    with pytest.raises(ScheduleError, match=reason):
        lower(_softmax(8, 32), trace)


def test_next_row_is_cpu_only_and_round_trips():
    from superopt.target import h200_target

    trace = [p for p in AHEAD_BASE if not isinstance(p, (Vectorize, Parallel))] + [NextRow("M", "E")]
    with pytest.raises(ScheduleError, match="CPU targets only"):
        lower(_softmax(8, 32), trace, h200_target())
    assert trace_from_json(trace_to_json(trace)) == tuple(trace)


@pytest.mark.parametrize("rows, cols, into", [(16, 40, "D"), (12, 256, "Q")])
def test_layernorm_sum_of_squares_takes_the_next_rows_sum(rows, cols, into, kernel_cache):
    """The row computed ahead goes into the first stage after it that walks the row: the centred row D
    when it is stored (a division by 40 is not inlined, on by default), else layernorm's sum of squares,
    another row reduction (a split vector sum, knob on), which adds up the next row's sum as it walks
    this row."""
    c = compile_op("S[i,u] += X[i,r]\nD[i,j] = X[i,j] - S[i,0] / " + f"{cols}.0" + "\nQ[i,u] += D[i,r] * D[i,r]\n"
                   "O[i,j] = D[i,j] / sqrt(Q[i,0] / " + f"{cols}.0" + " + 0.00001)", {"X": (rows, cols)},
                   extents={"u": 1}, outputs=["O"])
    space = ScheduleSpace(c, host_target(2))
    default = space.trace(space.default_point())
    assert (NextRow("S", into) in default) == (into == "D")  # into a reduction: a knob, off by default
    trace = space.trace(Point.of(space.default_point().sketch, {"S.next_row": True}))
    assert NextRow("S", into) in trace
    X = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32) + 3
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(X)
    x = X.astype(np.float64)
    d = x - x.mean(1, keepdims=True)
    np.testing.assert_allclose(got, d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-5)
