"""The schedule space: the default is one point; random knob assignments are either rejected with
ScheduleError (and nothing else) or compile and match the reference; points round-trip."""

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.default import default_schedule
from superopt.schedule.graph_defaults import constant_inputs
from superopt.schedule.plan import ScheduleError
from superopt.schedule.primitives import CacheWrite, Fuse, Split
from superopt.schedule.space import Point, ScheduleSpace, check
from superopt.target import avx512_target, host_target
from superopt.testing.op_table import CASES, case_graph, case_reference

MATMUL = "C[i,j] += A[i,k] * B[k,j]"
CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"


@pytest.mark.parametrize("target", [host_target(2), avx512_target(2)], ids=["host", "avx512"])
def test_default_heuristic_is_a_point_of_the_space(target):
    for case in CASES:
        graph, _ = case_graph(case)
        for n in graph.nodes:
            if n.is_extern:
                continue
            consts = constant_inputs(graph, n)
            space = ScheduleSpace(n.op, target, consts)
            assert list(space.trace(space.default_point())) == default_schedule(n.op, target, consts), case.name


def test_knobs_are_named_by_role_and_change_one_thing():
    c = compile_op(MATMUL, {"A": (96, 80), "B": (80, 200)})
    space = ScheduleSpace(c, host_target(2))
    base = space.default_point()
    _, used, domains = space.resolve(base)
    assert {"C.rows", "C.width", "C.k_tile", "C.panel_outer"} <= set(used)
    rows = next(r for r in domains["C.rows"] if r != used["C.rows"])
    changed = Point.of(base.sketch, {**used, "C.rows": rows})
    _, used2, _ = space.resolve(changed)
    assert used2["C.rows"] == rows
    assert {k: v for k, v in used2.items() if k != "C.rows"} == {k: v for k, v in used.items() if k != "C.rows"}
    lanes = host_target(2).lanes()
    assert Split("C", "i", rows) in space.trace(changed) and used["C.width"] % lanes == 0


def test_neighbours_change_one_knob_each_and_compile_to_the_reference(kernel_cache):
    """Each neighbour of the default sets one knob other than the default does (others it pushed out of their
    domains back to the heuristic's choice), is legal, and has a trace of its own; the structural knobs of a
    contraction of run-time operands are among those changed, and the neighbours compute the op."""
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernel

    c = compile_op("C[i,j,k] += A[l,i,k] * B[j,l]", {"A": (24, 20, 37), "B": (30, 24)})
    space = ScheduleSpace(c, host_target(2), frozenset())
    base = space.default_point()
    _, used, domains = space.resolve(base)
    near = space.neighbours(base)
    traces = [space.trace(p) for p in near]
    assert len(set(traces)) == len(traces) and space.trace(base) not in traces
    changed = []
    for p in near:
        _, got, _ = space.resolve(p)
        diff = {k for k in got if got[k] != used.get(k)}
        asked = {k for k, v in p.knob_map.items() if used.get(k) != v}
        assert len(asked) == 1 and asked <= diff, (p, diff)
        changed.append(next(iter(asked)))
    for knob in ("C.panel_outer", "C.swap", "C.pack"):
        assert len(domains[knob]) > 1 and knob in changed, (knob, changed)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs}
    ref = evaluate_compute(c, feed)[0]
    for p in near[::3]:
        out = build_kernel(c, space.trace(p), kernel_cache, threads=2)(*[feed[n] for n in c.inputs])[0]
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=str(p))


def test_point_json_round_trip_and_normalize():
    c = compile_op(MATMUL, {"A": (64, 64), "B": (64, 64)})
    space = ScheduleSpace(c, host_target(2))
    rng = random.Random(3)
    for _ in range(10):
        p = space.sample(rng)
        assert Point.from_json(p.to_json()) == p
        assert space.trace(space.normalize(p)) == space.trace(p)


def test_check_raises_only_schedule_error():
    c = compile_op(MATMUL, {"A": (32, 48), "B": (48, 40)})
    t = host_target(2)
    bad = [[CacheWrite("C", "k"), Fuse("C", "i", "j"), Split("C", "i_j", 3)],  # (A[i,k] reads i but not j)
           [Split("C", "i", 0)], [Fuse("C", "i", "k")], [CacheWrite("C", "nope")]]
    for trace in bad:
        with pytest.raises(ScheduleError):
            check(c, trace, t)


def test_knob_values_outside_the_domain_are_rejected_with_schedule_error():
    c = compile_op(MATMUL, {"A": (256, 256), "B": (256, 256)})
    space = ScheduleSpace(c, host_target(2))
    with pytest.raises(ScheduleError):  # a 32768-element tile: past any target's register budget (8x its file)
        space.trace(Point.of(space.default_point().sketch, {"C.rows": 128, "C.width": 256}))
    with pytest.raises(ScheduleError):
        space.trace(Point.of("no-such-sketch"))


SETTINGS = settings(max_examples=2, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@SETTINGS
@given(seed=st.integers(0, 2**31 - 1))
def test_random_knob_assignments_compile_and_match_reference(case, seed, kernel_cache):
    """Every random point of the space is either rejected with ScheduleError or correct."""
    graph, feed = case_graph(case)
    target = host_target(2)
    rng = random.Random(seed)
    schedules = {}
    for n in graph.nodes:
        if n.is_extern:
            continue
        space = ScheduleSpace(n.op, target, constant_inputs(graph, n))
        point = space.sample(rng)
        try:
            schedules[n.name] = space.trace(point)
        except ScheduleError:
            schedules[n.name] = space.trace(space.default_point())
    ex = GraphExecutor(graph, schedules, ExecutorConfig(threads=2, compiler=kernel_cache, target=target))
    out = ex(feed)
    for o, ref in zip(graph.outputs, case_reference(case)):
        np.testing.assert_allclose(out[o], ref, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                   err_msg=f"schedules {schedules}")


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_points_of_capsule_votes(seed, kernel_cache):
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernels

    c = compile_op(CAPSULE, {"P": (2, 7, 7, 4, 4, 4), "W": (3, 3, 4, 6, 4, 4)})
    target = host_target(2)
    space = ScheduleSpace(c, target)
    rng = random.Random(seed)
    traces = []
    while len(traces) < 4:
        try:
            traces.append(space.trace(space.sample(rng)))
        except ScheduleError:
            continue
    args = [np.random.default_rng(seed).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, 2, target)):
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


@pytest.mark.parametrize("knobs", [{}, {"V.rows2": 1}, {"V.rows2": 3, "V.rows2_dim": 1}, {"V.rows2": 2, "V.rows2_dim": 2},
                                   {"V.panel_pos": 3}, {"V.rows2": 4, "V.width": 32, "V.panel_pos": 2}],
                         ids=["default", "one_row_dim", "y3", "x2", "panel_inner", "n4_w32"])
def test_few_rows_take_a_second_row_dim_and_every_setting_matches_the_reference(knobs, kernel_cache):
    """Capsule votes' 4 matrix rows (p) are too few for a register tile: with 32 registers the default adds
    2 of the batch (the first outer dim that 2 divides) and takes 3 vectors of columns (2 x 4 x 3 = 24
    accumulators, where 4 x 8 vectors would spill), the column panels inside the batch loop; 16 registers
    keep one row dim. Every setting of the new knobs matches the reference."""
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernels

    c = compile_op(CAPSULE, {"P": (4, 9, 9, 4, 4, 4), "W": (3, 3, 4, 16, 4, 4)})
    avx512 = avx512_target(2)
    space = ScheduleSpace(c, avx512, frozenset({"W"}))
    _, used, domains = space.resolve(space.default_point())
    assert (used["V.rows2"], used["V.rows2_dim"], used["V.width"], used["V.panel_pos"]) == (2, 0, 48, 1)
    assert domains["V.rows2"] == (1, 2, 3, 4) and domains["V.rows2_dim"] == (0, 1, 2)
    avx2 = ScheduleSpace(c, replace(avx512, vector_bits=256, vector_registers=16), frozenset({"W"}))
    assert avx2.resolve(avx2.default_point())[1]["V.rows2"] == 1
    trace = space.trace(Point.of(space.default_point().sketch, knobs))
    rows2 = knobs.get("V.rows2", 2)
    assert any(isinstance(x, Split) and x.factor == rows2 for x in trace) == (rows2 > 1)
    target = host_target(2)
    if target.vector_registers < 32:
        return  # AVX-512 code runs only on a host with it
    args = [np.random.default_rng(1).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, trace)], kernel_cache, 2, avx512)
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def test_column_panels_stay_inside_the_batch_loops_and_match_the_reference(kernel_cache):
    """A column panel outside the row loops stays in cache across them (sgemm: panels outermost); in a batched
    contraction a panel is not reused from one batch to the next, so the batch loops come first (16 GEMMs of
    49 x 256 x 256 with a constant operand each, Winograd's at a 14 x 14 x 256 conv: 205 -> 278 GFLOP/s)."""
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernels
    from superopt.schedule.primitives import Reorder

    avx512 = avx512_target(2)
    bmm = compile_op("C[b,i,j] += A[b,i,k] * B[b,k,j]", {"A": (3, 20, 32), "B": (3, 32, 128)})
    space = ScheduleSpace(bmm, avx512, frozenset({"B"}))
    trace, used, _ = space.resolve(space.default_point())
    order = [p for p in trace if isinstance(p, Reorder)][-1].order
    assert used["C.panel_outer"] and order[:3] == ("b", "j_o", "i_o"), order
    mm = compile_op(MATMUL, {"A": (96, 80), "B": (80, 200)})
    mm_space = ScheduleSpace(mm, avx512, frozenset({"B"}))
    mm_order = [p for p in mm_space.resolve(mm_space.default_point())[0] if isinstance(p, Reorder)][-1].order
    assert mm_order[0] == "j_o"  # no batch: the panels outermost
    if host_target(2).vector_registers < 32:
        return  # AVX-512 code runs only on a host with it
    args = [np.random.default_rng(2).standard_normal(bmm.type_of[i].shape).astype(np.float32) for i in bmm.inputs]
    (ref,) = evaluate_compute(bmm, args, np.float64)
    (kernel,) = build_kernels([(bmm, space.trace(space.default_point()))], kernel_cache, 2, avx512)
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4)


CONV1X1 = "Y[n,co,y,x] += X[n,ci,y+kh,x+kw] * W[co,ci,kh,kw]"


def test_a_fused_contiguous_loop_splits_by_any_factor_and_matches_the_reference(kernel_cache):
    """Where every operand reads two fused dims as one contiguous run (j split then fused back; a 1x1 conv's
    y and x), lowering makes the fused loop linear and a split needs no multiple of the inner extent; with
    another stage attached, a pack or padding it stays a ScheduleError."""
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernels
    from superopt.schedule.primitives import Pack, Reorder, Unroll, Vectorize

    t = host_target(2)
    mm = compile_op(MATMUL, {"A": (32, 48), "B": (48, 40)})
    refold = [CacheWrite("C", "k"), Split("C", "j", 8), Fuse("C", "j_o", "j_i"), Split("C", "j_o_j_i", 3)]
    check(mm, refold, t)
    with pytest.raises(ScheduleError, match="made linear"):
        check(mm, [*refold, Pack("B", (0, 1))], t)
    conv = compile_op(CONV1X1, {"X": (1, 32, 10, 10), "W": (8, 32, 1, 1)})
    pixels = [Reorder("Y", ("n", "co", "y", "x", "ci", "kh", "kw")), Fuse("Y", "y", "x"), Split("Y", "y_x", 16),
              Reorder("Y", ("y_x_o", "n", "co", "ci", "kh", "kw", "y_x_i")), CacheWrite("Y", "ci"),
              Vectorize("Y", "y_x_i")]
    padded = compile_op("Y[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]", {"X": (1, 4, 10, 10), "W": (2, 4, 1, 1)},
                        padding={"X": 0.0}, extents={"y": 10, "x": 10})
    with pytest.raises(ScheduleError, match="multiple"):
        check(padded, [Reorder("Y", ("n", "co", "y", "x", "ci", "kh", "kw")), Fuse("Y", "y", "x"), Split("Y", "y_x", 16)], t)
    space = ScheduleSpace(conv, t, frozenset({"W"}))
    point = Point.of(space.default_point().sketch, {"Y.swap": False, "Y.width": 32})
    searched = space.trace(point)
    assert Split("Y", "y_x", 32) in searched  # 100 pixels in tiles of 32, not rows of 10
    assert Split("Y", "y_x", 32) not in space.trace(space.default_point())
    # with x alone vectorized the register rows are y by default (each row loads its own vector); row_dim
    # picks co, whose rows share every vector of X
    x_only = {"Y.swap": False, "Y.col_dims": 1}
    _, used, domains = space.resolve(Point.of(point.sketch, x_only))
    assert used["Y.row_dim"] == 1 and domains["Y.row_dim"] == (0, 1)
    co_rows = space.trace(Point.of(point.sketch, {**x_only, "Y.row_dim": 0}))
    assert Unroll("Y", "co") in co_rows and Unroll("Y", "y_i") in space.trace(Point.of(point.sketch, x_only))
    rng = np.random.default_rng(4)
    cases = [(mm, refold), (conv, pixels), (conv, searched), (conv, co_rows)]
    for (c, trace), kernel in zip(cases, build_kernels(cases, kernel_cache, 2, t)):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        (ref,) = evaluate_compute(c, args, np.float64)
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def test_search_points_keep_the_register_tile_inside_the_register_file():
    """Seven rows and a second row dim (``C[k,j,i] += A[j,i,m,l] * B[k,m,l]``): a tile of all 7 rows x 4 of the
    second x 3 vectors (84 accumulators) spills, and gcc takes seconds over it. The rows' domain shrinks with
    the second row dim, a point that combines values no resolve offered together is rejected, and every point
    the search can reach holds its tile and a row of the column operand in 32 registers."""
    from superopt.loopnest import Alloc, build_loopnest, walk
    from superopt.schedule.plan import lower

    c = compile_op("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", {"A": (7, 146, 54, 7), "B": (898, 54, 7)})
    target = avx512_target(2)
    space = ScheduleSpace(c, target)
    sketch = space.default_point().sketch
    seven = {"C.swap": True, "C.row_dim": 0}  # (rows along j, 7 of them)
    _, _, alone = space.resolve(Point.of(sketch, seven))
    _, _, with_four = space.resolve(Point.of(sketch, seven | {"C.rows2": 4}))
    assert 4 in alone["C.rows"] and 4 not in with_four["C.rows"] and 128 not in with_four["C.width"]
    with pytest.raises(ScheduleError, match="outside their domains"):
        space.trace(Point.of(sketch, seven | {"C.rows2": 4, "C.rows": 4, "C.width": 48}))
    rng = random.Random(0)
    points = [space.sample(rng, sketch) for _ in range(40)] + [Point.of(sketch, seven | {"C.rows2": r})
                                                               for r in (2, 3, 4)]
    points += [space.mutate(p, rng, 2) for p in points] + [space.crossover(a, b, rng) for a, b in zip(points, points[1:])]
    tiles = []
    for p in points:
        try:
            trace = space.trace(p)
        except ScheduleError:
            continue
        nest = build_loopnest(lower(c, trace, target))
        tiles += [v.node.size // 16 for v in walk(nest) if isinstance(v.node, Alloc) and v.node.kind == "register_tile"]
    assert len(tiles) > 20 and max(tiles) <= target.vector_registers - 2, sorted(tiles)
