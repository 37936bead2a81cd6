"""Index-set splitting (superopt/loopnest/index_sets.py): loops that test their own variable run as one
loop per range of equal outcomes, the tests resolved; the result is still exact."""

from dataclasses import replace

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp.reference import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest import Loop, build_loopnest, walk
from superopt.loopnest.index_sets import split_index_sets
from superopt.loopnest.values import Load, Op, value_nodes
from superopt.runtime.kernel import build_kernel
from superopt.schedule.plan import lower
from superopt.schedule.primitives import Fuse, Parallel, Vectorize
from superopt.target import host_target

TARGET = host_target(2)
CONCAT = "O[c,i,l] = relu(where(16*c + l < 64, A[c,i,l], B[c-4,i,l]))"


def _tests_left(nest) -> int:
    """Padded reads and index comparisons still evaluated per element."""
    n = 0
    for v in walk(nest):
        val = getattr(v.node, "value", None)
        for x in value_nodes(val) if val is not None else ():
            n += isinstance(x, Load) and bool(x.checks) or isinstance(x, Op) and x.op == "<"
    return n


def _run(c, trace, inputs):
    (got,) = build_kernel(c, trace, target=TARGET)(*inputs)
    (want,) = evaluate_compute(c, inputs, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return got


def test_a_concatenation_runs_as_two_loops_without_a_select_and_matches_the_reference():
    c = compile_op(CONCAT, {"A": (4, 9, 16), "B": (4, 9, 16)}, extents={"c": 8}, padding={"A": 0.0, "B": 0.0})
    trace = [Vectorize("O", "l"), Parallel("O", "c")]
    nest = build_loopnest(lower(c, trace, TARGET))
    loops = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.kind == "parallel"]
    assert [lp.extent for lp in loops] == [4, 4]
    assert _tests_left(nest) == 0
    assert "?" not in emit_c(nest).code.split("*/", 1)[1].replace("< 0 ? 0 :", "")  # only relu's select is left
    rng = np.random.default_rng(0)
    _run(c, trace, [rng.standard_normal((4, 9, 16), np.float32) for _ in range(2)])


def test_a_padded_copy_keeps_its_bound_checks_nowhere_and_matches_the_reference():
    c = compile_op("O[c,y,x] = X[c,y-1,x-1]", {"X": (3, 7, 10)}, extents={"y": 9, "x": 12}, padding={"X": 0.0})
    trace = [Parallel("O", "c")]
    nest = build_loopnest(lower(c, trace, TARGET))
    assert _tests_left(nest) == 0
    rng = np.random.default_rng(1)
    _run(c, trace, [rng.standard_normal((3, 7, 10), np.float32)])


def test_a_test_on_an_enclosing_loops_variable_is_left_alone():
    # j + i < 6: the outcome on a range of i depends on j, which the loop over i cannot see as fixed
    c = compile_op("O[j,i] = where(j + i < 6, X[j,i], 0.0 - X[j,i])", {"X": (5, 8)})
    nest = build_loopnest(lower(c, [], TARGET))
    inner = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.var == "i"]
    assert len(inner) == 1 and _tests_left(nest) == 1
    _run(c, [], [np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)])


@pytest.mark.parametrize("threads, split", [(2, True), (4, False)])
def test_a_parallel_loop_is_split_only_into_pieces_every_thread_can_share(threads, split):
    # pieces of 4 channels: enough for 2 threads (at least 2 iterations each), not for 4
    c = compile_op(CONCAT, {"A": (4, 9, 16), "B": (4, 9, 16)}, extents={"c": 8}, padding={"A": 0.0, "B": 0.0})
    nest = build_loopnest(lower(c, [Vectorize("O", "l"), Parallel("O", "c")], host_target(threads)))
    parallel = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.kind == "parallel"]
    assert len(parallel) == (2 if split else 1)
    assert split_index_sets(nest, min_parallel=1) != nest or split


def test_fused_loops_and_many_pieces_are_not_split_and_stay_exact():
    # a fused loop over (c, i): the test reads c as a div of the fused variable
    c = compile_op(CONCAT, {"A": (4, 9, 16), "B": (4, 9, 16)}, extents={"c": 8}, padding={"A": 0.0, "B": 0.0})
    trace = [Fuse("O", "c", "i"), Vectorize("O", "l"), Parallel("O", "c_i")]
    rng = np.random.default_rng(3)
    _run(c, trace, [rng.standard_normal((4, 9, 16), np.float32) for _ in range(2)])
    # five ranges of one loop (more than MAX_PIECES): left as it is
    c = compile_op("O[i] = where(i < 2, X[i], where(i < 4, 2.0 * X[i], where(i < 6, 3.0 * X[i], "
                   "where(i < 8, 4.0 * X[i], 5.0 * X[i]))))", {"X": (12,)})
    nest = build_loopnest(lower(c, [], TARGET))
    assert len([v for v in walk(nest) if isinstance(v.node, Loop)]) == 1
    _run(c, [], [rng.standard_normal(12).astype(np.float32)])


def test_a_long_padded_loop_is_split_at_its_two_edges_and_matches_the_reference():
    # 200006 iterations: the change points are found by binary search, not by visiting every iteration
    c = compile_op("O[i] = X[i-3]", {"X": (200000,)}, extents={"i": 200006}, padding={"X": 0.0})
    nest = build_loopnest(lower(c, [], TARGET))
    loops = [v.node for v in walk(nest) if isinstance(v.node, Loop)]
    assert [lp.extent for lp in loops] == [3, 200000, 3] and _tests_left(nest) == 0
    _run(c, [], [np.random.default_rng(4).standard_normal(200000).astype(np.float32)])


def test_a_loop_whose_variable_a_split_index_rebuilds_is_not_split():
    # r = so_o * 16 + so_l is printed from names: shifting so_o would leave r pointing at the old range
    from superopt.ir.expr import Affine
    from superopt.loopnest import StageNest
    from superopt.loopnest.index import BufferAccess, FlatIndex, InBounds
    from superopt.loopnest.kernel import LoopNest
    from superopt.loopnest.statements import Assign, SplitIndex
    from superopt.loopnest.values import Literal

    so_o = Affine.of({"so_o": 1})
    read = Load(BufferAccess("X", FlatIndex(Affine.of({"so_o": 16, "so_l": 1})), "float32"),
                (InBounds(so_o, False, 2),), Literal(0.0, "float32"))
    store = Assign(BufferAccess("O", FlatIndex(Affine.of({"r": 1})), "float32"), read)
    inner = Loop("so_l", 16, "vectorized", (SplitIndex("r", "so_o", 16, "so_l"), store))
    outer = Loop("so_o", 4, "serial", (inner,))
    nest = LoopNest((), (), (StageNest("O", "O", (outer,)),), (), (), ())
    assert split_index_sets(nest) == nest
    # without the SplitIndex the same loop splits at so_o = 2
    plain = Loop("so_o", 4, "serial", (Loop("so_l", 16, "vectorized", (replace(store, target=read.source),)),))
    split = split_index_sets(LoopNest((), (), (StageNest("O", "O", (plain,)),), (), (), ()))
    assert [lp.extent for lp in split.body[0].body] == [2, 2]


def test_a_vectorized_loop_that_tests_its_own_variable_is_split_into_vectorized_pieces():
    # NCHW padded copy vectorized along x: the bounds test moves with the lanes; split, the interior
    # piece reads X without a test (contiguous vectors, not masked gathers)
    c = compile_op("O[c,y,x] = X[c,y-1,x-1]", {"X": (3, 7, 20)}, extents={"y": 9, "x": 22}, padding={"X": 0.0})
    trace = [Vectorize("O", "x"), Parallel("O", "c")]
    nest = build_loopnest(lower(c, trace, TARGET))
    vec = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.kind == "vectorized"]
    assert sorted(lp.extent for lp in vec) == [1, 1, 20, 22, 22] and _tests_left(nest) == 0
    _run(c, trace, [np.random.default_rng(5).standard_normal((3, 7, 20), np.float32)])
    # a vectorized reduction over a padded row: each piece keeps its reduction clause, the sum is exact
    s = compile_op("S[c] += X[c,k-2]", {"X": (5, 30)}, extents={"k": 34}, padding={"X": 0.0})
    nest = build_loopnest(lower(s, [Vectorize("S", "k")], TARGET))
    vec = [v.node for v in walk(nest) if isinstance(v.node, Loop) and v.node.kind == "vectorized"]
    assert len(vec) == 3 and all(lp.reductions for lp in vec) and _tests_left(nest) == 0
    _run(s, [Vectorize("S", "k")], [np.random.default_rng(6).standard_normal((5, 30), np.float32)])
