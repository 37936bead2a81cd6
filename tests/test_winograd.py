"""Winograd F(4x4,3x3) convs (rewrite_rules/winograd.py) and the schedules of their kernels: the rewritten
graph computes the conv (float64 reference), its kernels compile and match the reference under their
default schedules and random points of their schedule spaces, and the rule stays off the convs it does
not fit."""

import random

import numpy as np
import pytest

from rewrite_rules.layout import materialize_padding
from rewrite_rules.layout_choice import block_node_in, cancel_all
from rewrite_rules.winograd import (
    F2,
    F4,
    WINOGRAD,
    batched_matmul,
    input_transform,
    select_rows,
    transformed_weights,
    winograd_all,
)
from superopt.api import OptimizeConfig, optimize
from superopt.builder import GraphBuilder
from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate, evaluate_compute
from superopt.interp.inputs import random_inputs
from superopt.runtime.kernel import build_kernel
from superopt.schedule.default import default_schedule, sketch_names
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.space import ScheduleSpace
from superopt.schedule.tile_transform import TILE_TRANSFORM
from superopt.target import avx512_target, host_target
from superopt.testing.targets import avx2

AVX2 = avx2(2)


def _conv_graph(c=8, k=16, hw=24, stride=1, block=8, seed=0, residual=False):
    rng = np.random.default_rng(seed)
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, hw, hw))
    w = b.constant((rng.standard_normal((k, c, 3, 3)) * 0.2).astype(np.float32), "w")
    bias = b.constant(rng.standard_normal(k).astype(np.float32), "bias")
    ins = {"X": x, "W": w, "B": bias}
    out = (hw - 1) // stride + 1
    src = f"P[n,co,y,x] += X[n,ci,{stride}*y+kh-1,{stride}*x+kw-1] * W[co,ci,kh,kw]\n"
    if residual:
        r = b.input("r", (1, k, out, out))
        ins["R"] = r
        src += "O[n,co,y,x] = relu(P[n,co,y,x] + B[co] + R[n,co,y,x])"
    else:
        src += "O[n,co,y,x] = relu(P[n,co,y,x] + B[co])"
    y = b.compute1(src, ins, "conv", extents={"y": out, "x": out}, padding={"X": 0.0}, outputs=["O"])
    g = b.build([y])
    return g, cancel_all(block_node_in(materialize_padding(g, ("conv",)), "conv", block))


@pytest.mark.parametrize("scheme", [F4, F2], ids=["F4", "F2"])
def test_transform_matrices_are_winograds_identity(scheme):
    # A^T [(G g G^T) . (B^T d B)] A equals the 3x3 correlation of d with g, for any patch d and 3x3 g
    rng = np.random.default_rng(0)
    m, p = scheme.tile, scheme.patch
    d, g = rng.standard_normal((p, p)), rng.standard_normal((3, 3))
    bt, gm, at = np.array(scheme.bt, float), np.array(scheme.g, float), np.array(scheme.at, float)
    y = at @ ((gm @ g @ gm.T) * (bt @ d @ bt.T)) @ at.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_select_rows_states_each_row():
    assert select_rows("a", ((1, 0, -1), (0, 2, 1)), ["x0", "x1", "x2"]) == "where(a == 0, x0 - x2, (2*x1 + x2))"


@pytest.mark.parametrize("residual,hw,patch", [(False, 24, 6), (True, 24, 6), (False, 14, 4), (True, 27, 6), (True, 13, 4)],
                         ids=["F4", "F4_residual", "F2", "F4_cut_residual", "F2_cut_residual"])
def test_rewritten_conv_matches_the_reference(residual, hw, patch):
    plain, blocked = _conv_graph(residual=residual, hw=hw)
    new = winograd_all(blocked)
    mm = [n for n in new.nodes if n.name.endswith("_wino_mm")]
    assert len(mm) == 1 and new.type_of[mm[0].inputs[0]].shape[0] == patch * patch
    feed = random_inputs(plain, seed=1)
    want = evaluate(plain, feed, np.float64)
    got = evaluate(new, feed, np.float64)
    for o in plain.outputs:
        np.testing.assert_allclose(got[o], want[o], rtol=0, atol=2e-6 * np.abs(want[o]).max())


@pytest.mark.parametrize("case", [dict(stride=2, hw=48), dict(hw=10), dict(hw=7)],
                         ids=["stride2", "too_few_tiles_10x10", "too_few_tiles_7x7"])
def test_rule_leaves_convs_it_does_not_fit(case):
    _, blocked = _conv_graph(**case)
    assert WINOGRAD.sites(blocked) == []


def test_optimize_runs_winograd_and_verifies():
    # (28 pixels: 32 makes an input transform whose unrolled 8-lane form takes gcc two minutes on AVX2)
    plain, _ = _conv_graph(c=16, k=16, hw=28, residual=True)
    feed = random_inputs(plain, seed=2)
    want = evaluate(plain, feed, np.float64)
    progs = {w: optimize(plain, OptimizeConfig(threads=2, winograd=w, layout="nchw8c")) for w in (True, False)}
    assert any(n.name.endswith("_wino_mm") for n in progs[True].graph.nodes)
    assert not any("_wino" in n.name for n in progs[False].graph.nodes)
    for prog in progs.values():
        got = prog.executor(feed)
        for o in plain.outputs:
            np.testing.assert_allclose(got[o], want[o], rtol=0, atol=1e-5 * np.abs(want[o]).max())


def _kernel_cases():
    x = input_transform((1, 2, 8, 12, 8))
    mm = batched_matmul(6, 2, 3, 8)
    return {"input_transform": x, "batched_matmul": mm}


def _check(compute, trace, seed=0, target=None):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(compute.type_of[i].shape).astype(np.float32) for i in compute.inputs]
    got = build_kernel(compute, trace, threads=2, target=target)(*arrays)
    want = evaluate_compute(compute, arrays, np.float64)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, np.abs(w).max()))


def test_transform_kernel_takes_the_tile_transform_sketch():
    target = host_target()
    c = _kernel_cases()["input_transform"]
    assert sketch_names(c, target)[0] == TILE_TRANSFORM
    trace = default_schedule(c, target)
    kinds = {type(p).__name__ for p in trace}
    assert {"ComputeAt", "Unroll", "Vectorize", "Parallel"} <= kinds
    _check(c, trace)


@pytest.mark.parametrize("target,block", [(avx512_target(2), 16), (AVX2, 8), (AVX2, 16)],
                         ids=["avx512_16", "avx2_8", "avx2_16"])
def test_transform_loops_of_whole_vectors_print_as_vector_statements(target, block):
    # the transform's vector loops (one or two vectors of the target's lanes, padded reads checked outside the
    # vector) are vector statements, not omp simd loops for GCC to vectorize; never wider than the target's vectors
    c = input_transform((1, 2, 8, 13, block))
    trace = default_schedule(c, target)
    code = emit_c(lower(c, trace, target)).code
    lanes = target.lanes()
    assert "omp simd" not in code and f"so_st{lanes}(&V[" in code and f"so_st{lanes}(&T1[" in code
    assert "so_v16" not in code if lanes == 8 else "so_v8" not in code
    if lanes > host_target().lanes():
        pytest.skip("this machine has no vectors of the target's width")
    _check(c, trace, seed=5, target=target)


def test_batched_matmul_takes_the_blocked_conv_tile():
    target = host_target()
    c = _kernel_cases()["batched_matmul"]
    trace = default_schedule(c, target, frozenset({"U"}))
    assert any(type(p).__name__ == "CacheWrite" for p in trace)
    assert next(p for p in trace if type(p).__name__ == "Parallel").loop == "ab"  # one matmul per batch index
    _check(c, trace)


@pytest.mark.parametrize("name", ["input_transform", "batched_matmul"])
def test_random_points_are_illegal_or_correct(name):
    target = host_target()
    c = _kernel_cases()[name]
    space = ScheduleSpace(c, target)
    rng = random.Random(0)
    for _ in range(4):
        point = space.sample(rng)
        try:
            trace = space.trace(point)
        except ScheduleError:
            continue
        _check(c, trace)


def test_transformed_weights_shape_and_values():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 3, 3, 3, 8, 8)).astype(np.float32)
    u = transformed_weights(w)
    assert u.shape == (36, 2, 3, 8, 8) and u.dtype == np.float32
    g = np.array(F4.g)
    np.testing.assert_allclose(u[7, 1, 2, 3, 4], (g @ w[1, 2, :, :, 3, 4].astype(float) @ g.T)[1, 1], rtol=1e-6)


def test_a_saved_winograd_program_loads_and_runs(tmp_path):
    from superopt.api import load

    plain, _ = _conv_graph(c=16, k=16, hw=24)
    prog = optimize(plain, OptimizeConfig(threads=2, layout="nchw16c"))
    assert any(n.name.endswith("_wino_mm") for n in prog.graph.nodes)
    feed = random_inputs(plain, seed=4)
    want = prog.executor(feed)
    again = load(prog.save(tmp_path / "art"))
    got = again.executor(feed)
    for o in plain.outputs:
        np.testing.assert_array_equal(got[o], want[o])


def test_tile_transform_applies_only_to_short_selected_dims():
    from superopt.lang.parser import compile_op
    from superopt.schedule.tile_transform import applies

    def op(src, shape=(5, 4, 16)):
        return compile_op(src, {"X": shape})

    assert applies(op("Y[i,a,l] = where(a == 0, X[i,a,l], 2 * X[i,a,l])"))
    assert not applies(op("Y[i,a,l] = where(l == 0, X[i,a,l], 2 * X[i,a,l])"))  # only the vector dim
    assert not applies(op("Y[i,a,l] = where(a == 0, X[i,a,l], 2 * X[i,a,l])", (5, 40, 16)))  # extent 40 > 8
    assert not applies(op("Y[i,a,l] = X[i,a,l] * 2"))
