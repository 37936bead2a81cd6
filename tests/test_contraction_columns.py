"""The contraction default's columns chosen by contiguity and lane use (either operand's own dims, one or two
of them fused, the column operand packed into the tile's order, the output written back lane by lane where it is
strided along them), and reductions over non-innermost axes as column blocks of accumulators. Every schedule is
compiled and checked against the float64 reference."""

import random

import numpy as np
import pytest

from benchmarks.contraction_cases import random_contractions
from superopt.interp import evaluate_compute
from superopt.ir.expr import product_accesses
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernels
from superopt.schedule.contraction_columns import (
    best_width,
    choose_columns,
    lane_score,
    pick,
    row_dim,
    row_use,
    tile_rows,
    tile_use,
)
from superopt.schedule.default import STAGES_EPILOGUE, build_sketch, default_schedule, sketch_names
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import CacheWrite, Fuse, Pack, PackAt, Parallel, Reorder, Split, Vectorize
from superopt.target import host_target
from superopt.testing.targets import xeon_avx512

LANES = 16  # float32 lanes of the AVX-512 target the expectations below are stated for


def _target():
    """The machine the schedules below are expected for (the kernels compile and run for the host)."""
    return xeon_avx512(2)


def _run(c, traces, kernel_cache, seed=0):
    args = [np.random.default_rng(seed).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, 2, host_target(2))):
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def _einsum_op(eq: str, extents: dict[str, int]):
    lhs, out = eq.split("->")
    ops = lhs.split(",")
    names = "AB"[:len(ops)]
    rhs = " * ".join(f"{n}[{','.join(op)}]" for n, op in zip(names, ops))
    text = f"C[{','.join(out)}] += {rhs}"
    return compile_op(text, {n: tuple(extents[i] for i in op) for n, op in zip(names, ops)})


def _vector_width(trace, stage="C"):
    """(the vector loop, its extent as the trace splits it)."""
    vec = next(p.loop for p in trace if isinstance(p, Vectorize) and p.stage == stage)
    split = next((p for p in trace if isinstance(p, Split) and p.stage == stage and f"{p.loop}_i" == vec), None)
    return vec, split.factor if split else None


# --- scores -------------------------------------------------------------------------------------------------

def test_a_fused_pair_splits_by_a_multiple_of_its_inner_extent_and_of_the_vector():
    # 28 x 6 columns (C[..., j, i] with i of 6): 48 = 8 x 6 is whole vectors; 60 = 10 x 6 is not (a scalar tile)
    assert best_width(168, 6, LANES, rows=[52])[0] in (48, 96)
    assert lane_score(168, 60, 6, LANES) < lane_score(168, 48, 6, LANES)
    assert lane_score(168, 64, 6, LANES) == 0.0  # a fused loop cannot split by 64 (not a multiple of 6)
    # 2 x 40 = 5 vectors where no width of at most 4 vectors is a multiple of 40
    assert best_width(400, 40, LANES, rows=[30])[0] == 80


def test_a_single_dim_is_split_by_whole_vectors_its_last_tile_padded():
    assert best_width(1000, 1, LANES, rows=[1000])[0] in (48, 64)
    # tiles of whole vectors, the last padded, rather than a scalar tile of 40
    assert best_width(40, 1, LANES, rows=[64])[0] in (16, 32)
    assert lane_score(92, 48, 1, LANES) == pytest.approx(92 / 96)
    assert tile_use(8, 1) < 0.5 < tile_use(8, 2) < tile_use(8, 3) < tile_use(6, 4) == 1.0


def test_rows_fill_the_tile():
    assert row_use(52) > 0.9 > 0.8 > row_use(9)  # 52 rows: 7 blocks of 8; 9 rows: blocks of 5 and 4
    assert row_dim(["l", "k"], {"l": 52, "k": 9}) == "l"
    assert row_dim(["l", "k"], {"l": 52, "k": 8}) == "k"  # a full block of 8: better than 52's 7 blocks
    assert row_dim(["l", "k"], {"l": 16, "k": 8}) == "k"  # equals: the innermost
    assert tile_rows(4, 32) == 6 and tile_rows(5, 32) == 5 and tile_rows(2, 16) == 8
    for n in range(1, 40):  # every extent against every row limit, the 2 rows of a tile 8 vectors wide included
        for rows in (2, 3, 5, 6, 8):
            assert 0 < row_use(n, rows, 4) <= 1


def test_the_candidates_cover_both_operands_and_pairs_of_their_own_dims():
    c = _einsum_op("oijkn,lomn->lijmk", dict(o=3, i=2, j=5, k=11, n=7, l=20, m=6))
    st = c.statements[-1]
    scores = choose_columns(st, product_accesses(st.expr), LANES, 32)
    assert {dims for _, dims in scores} >= {("j",), ("k",), ("j", "k"), ("l",), ("m",), ("l", "m")}
    best = pick(scores, (0, ("j", "k")))
    # j, k fused (inner 11) has no width of whole vectors; l, m fused (inner 6) has 48
    assert best.dims == ("l", "m") and best.width % LANES == 0


def test_windows_and_reshapes_keep_the_position_based_choice():
    c = compile_op("O[n,o,y] += X[n,c,y+k] * W[o,c,k]", {"X": (2, 4, 12), "W": (8, 4, 3)})
    st = c.statements[-1]
    assert choose_columns(st, product_accesses(st.expr), LANES, 32) is None


# --- the default picks the packed, strided-output schedule ----------------------------------------------------

def test_the_default_vectorizes_the_operand_whose_dims_fill_vectors_and_packs_it(kernel_cache):
    """C[l,i,j,m,k] += A[o,i,j,k,n] * B[l,o,m,n]: the output's innermost dims (j, k) fused have inner extent 11,
    so no tile of them is whole vectors; the default vectorizes B's l, m (48 = 8 x 6) instead. Unpacked, that
    loop reads B with the stride of a whole l row (o * m * n elements) and writes C strided: B is packed with
    its column axes last, and C is written back lane by lane."""
    ext = dict(o=3, i=2, j=5, k=11, n=40, l=20, m=6)  # (1.6M multiply-adds: enough to repay a pack)
    c = _einsum_op("oijkn,lomn->lijmk", ext)
    trace = default_schedule(c, _target(), frozenset())
    assert Fuse("C", "l", "m") in trace
    vec, width = _vector_width(trace)
    assert vec == "l_m_i" and width == 48
    pack = next(p for p in trace if isinstance(p, Pack))
    assert pack.stage == "B" and pack.perm[-2:] == (0, 2)  # B[l,o,m,n] packed as [l_o][o][n][l_i][m]
    _run(c, [trace, [p for p in trace if not isinstance(p, (Pack, PackAt))]], kernel_cache)


def test_a_pair_whose_inner_extent_divides_no_vector_width_gets_a_wide_tile(kernel_cache):
    c = _einsum_op("imkn,jnlm->ijkl", dict(i=7, j=6, k=9, l=40, m=25, n=3))
    trace = default_schedule(c, _target(), frozenset())
    vec, width = _vector_width(trace)
    assert vec == "j_l_i" and width == 80
    assert any(isinstance(p, Pack) and p.stage == "B" for p in trace)
    _run(c, [trace], kernel_cache)


def test_a_fused_loop_split_off_its_inner_extent_is_rejected_with_a_reason():
    c = _einsum_op("oijkn,lomn->lijmk", dict(o=3, i=2, j=5, k=11, n=7, l=20, m=6))
    trace = [Reorder("C", ("l", "i", "m", "o", "n", "j", "k")), Fuse("C", "j", "k"), Split("C", "j_k", 16)]
    with pytest.raises(ScheduleError, match="multiple of"):
        lower(c, trace, _target())


def test_a_linear_fused_column_loop_packs_neither_operand_and_keeps_the_register_tile(kernel_cache):
    """Columns fused across an inner extent the tile width does not divide (k x j of 12 x 28 in tiles of 48) are
    walked linearly over every tensor's own layout: packing the strided row operand too made the trace illegal,
    and the default fell back to a sketch without register tiles (10-300x slower at the benchmark's sizes)."""
    c = compile_op("C[i,k,j] += A[l,i] * B[l,k,j]", {"A": (64, 200), "B": (64, 12, 28)})
    assert sketch_names(c, _target())[0] == STAGES_EPILOGUE
    trace = build_sketch(c, _target(), frozenset(), STAGES_EPILOGUE)
    lower(c, trace, _target())  # legal as the heuristic built it
    assert default_schedule(c, _target(), frozenset()) == trace
    assert any(isinstance(p, CacheWrite) for p in trace) and not any(isinstance(p, Pack) for p in trace)
    _run(c, [trace], kernel_cache)


@pytest.mark.parametrize("seed", [7, 11])
def test_the_first_sketch_is_legal_on_random_contractions(seed):
    """The contraction sketch's own knob values give a legal trace on the benchmark generator's contractions, so
    the default never falls back to a slower sketch for them."""
    target = _target()
    for case in random_contractions(300, seed, max_bytes=16 << 20):
        c = compile_op(case.text, dict(zip("AB", case.shapes)))
        sketch = sketch_names(c, target)[0]
        lower(c, build_sketch(c, target, frozenset(), sketch), target)


def test_gemm_keeps_its_position_chosen_columns():
    c = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (200, 300), "B": (300, 256)})
    trace = default_schedule(c, _target(), frozenset())
    vec, width = _vector_width(trace)
    assert vec == "j_i" and width is not None and width % _target().lanes("float32") == 0


PERMUTATIONS = ["mij,lmk->lkji", "olminj,noklm->kij", "koinj,onml->jimkl", "ljmi,klm->kij", "nji,lkmn->mljki",
                "jiml,kml->kji", "mi,kjml->lijk", "inj,mkln->kijlm"]


def test_permuted_contractions_of_odd_extents_compile_and_match_the_reference(kernel_cache):
    """The benchmark's worst shapes, small: odd extents (tails in every tile direction), both operands packed."""
    rng = random.Random(5)
    cases = []
    for eq in PERMUTATIONS:
        ext = {i: rng.choice([3, 5, 6, 7, 11, 13, 17, 19, 23]) for i in eq if i.isalpha()}
        c = _einsum_op(eq, ext)
        cases.append((c, default_schedule(c, _target(), frozenset())))
    for c, trace in cases:
        assert trace, c
        _run(c, [trace], kernel_cache)


def test_random_contractions_compile_and_match_the_reference(kernel_cache):
    rng = random.Random(11)
    for _ in range(6):
        idx = list("ijklmn")
        rng.shuffle(idx)
        n_a, n_b = rng.randint(2, 4), rng.randint(2, 4)
        shared = idx[:rng.randint(1, 2)]
        a = shared + idx[2:2 + n_a - 1]
        b = shared + idx[2 + n_a - 1:2 + n_a - 1 + n_b - 1]
        rng.shuffle(a)
        rng.shuffle(b)
        out = [i for i in dict.fromkeys(a + b) if i not in shared]
        rng.shuffle(out)
        ext = {i: rng.randint(2, 37) for i in idx}
        c = _einsum_op(f"{''.join(a)},{''.join(b)}->{''.join(out)}", ext)
        _run(c, [default_schedule(c, _target(), frozenset())], kernel_cache, seed=rng.randint(0, 99))


# --- reductions over non-innermost axes -----------------------------------------------------------------------

@pytest.mark.parametrize("text,shape", [
    ("B[j] += A[i,j]", (300, 1000)),
    ("B[j] += A[i,j]", (17, 37)),
    ("B[i,k] += A[i,j,k]", (6, 20, 150)),
    ("B[j,l] += A[i,j,k,l]", (3, 5, 4, 70)),
    ("B[j] max= A[i,j]", (40, 100)),
])
def test_a_reduction_over_leading_axes_accumulates_rows_in_column_blocks(text, shape, kernel_cache):
    c = compile_op(text, {"A": shape})
    st = c.statements[-1]
    trace = default_schedule(c, _target(), frozenset())
    last = st.out_dims[-1]
    vec = next(p.loop for p in trace if isinstance(p, Vectorize))
    assert vec.split("_")[0] == last  # the kept contiguous axis is vectorized, not the reduction
    assert any(isinstance(p, CacheWrite) and p.at == st.reduce_dims[0] for p in trace)
    par = next(p.loop for p in trace if isinstance(p, Parallel))
    assert not set(par.split("_")) & set(st.reduce_dims)
    _run(c, [trace], kernel_cache)


@pytest.mark.parametrize("shape,block", [((3000, 1000), 500), ((600, 512), 256), ((300, 90), 45), ((300, 95), 19)])
def test_columns_that_share_out_evenly_take_one_block_per_thread(shape, block, kernel_cache):
    """Only the columns are kept: where they divide by the threads, each thread streams one contiguous part of
    every row (2 blocks of 500, not 4 of 250); 95 columns do not divide by 2 and keep blocks that divide them, as
    many as twice the threads or more (5 of 19). Exact against the reference."""
    c = compile_op("B[j] += A[i,j]", {"A": shape})
    trace = default_schedule(c, _target(), frozenset())
    assert [p.factor for p in trace if isinstance(p, Split)] == [block]
    assert next(p.loop for p in trace if isinstance(p, Parallel)) == "j_o"
    _run(c, [trace], kernel_cache)


def test_small_kernels_and_constant_weights_keep_the_position_chosen_columns():
    """A move may pack the other operand on every call: not for a kernel of a few thousand multiply-adds, and
    never away from a constant weight (packed once, for free, as the column operand)."""
    small = compile_op("Y[i,j] += X[i,k] * W[k,j]", {"X": (32, 16), "W": (16, 16)})
    for consts in (frozenset(), frozenset({"W"})):
        trace = default_schedule(small, _target(), consts)
        assert _vector_width(trace, "Y")[0] == "j" and not any(isinstance(p, Pack) for p in trace)
    # (j of 100 columns: a tail in 64-column tiles; vectorizing X's 4096 rows would fill the lanes better)
    weight = compile_op("Y[i,j] += X[i,k] * W[k,j]", {"X": (4096, 64), "W": (64, 100)})
    trace = default_schedule(weight, _target(), frozenset({"W"}))
    assert _vector_width(trace, "Y")[0].startswith("j") and not any(p.stage == "X" for p in trace
                                                                     if isinstance(p, Pack))
