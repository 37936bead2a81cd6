"""Register tiles printed as GCC vectors (superopt.codegen.c_vector_tile): which tiles take the spelling,
and that every one computes what the reference does (contiguous and scattered write-backs, epilogues with
ReLU and NaN, padded reads, 8- and 16-lane targets); what the spelling does not cover keeps the array."""

from __future__ import annotations

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernel
from superopt.schedule import CacheWrite, Pack, Parallel, Reorder, Split, Unroll, Vectorize
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import lower
from superopt.target import avx512_target, host_target
from superopt.testing.targets import avx2

MATMUL = "C[i,j] += A[i,k] * B[k,j]"
MATMUL_BIAS_RELU = "C[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(C[i,j] + bias[j])"
CONV_BIAS_RELU = ("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\nT[n,co,y,x] = P[n,co,y,x] + B[co]\n"
                  "O[n,co,y,x] = relu(T[n,co,y,x])")
CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
AVX2 = avx2(2)


def _run(c, trace, target, kernel_cache, args):
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=target)(*args)
    want = evaluate_compute(c, args, np.float64)[0]
    return got, want


def _code(c, trace, target) -> str:
    return emit_c(lower(c, trace, target)).code


def test_a_matmul_tile_is_held_as_vectors_and_written_straight_to_the_output(kernel_cache):
    """6 x 4 vectors on AVX-512: the tile is an array of so_v16, the write-back one vector store a register;
    the partial tile of the last rows (96..99: 4 of 6) is the only rest, with constant trip counts, so it is
    held as vectors too."""
    c = compile_op(MATMUL, {"A": (100, 96), "B": (96, 128)})
    target = avx512_target(2)
    trace = default_schedule(c, target)
    code = _code(c, trace, target)
    assert "so_v16 acc_vec[24];" in code and "so_st16(&C[" in code and "so_ld16(&B[" in code
    assert code.count("so_v16 acc_vec[24];") == 2 and "float acc[384]" not in code and "SO_MIN" not in code
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_epilogue_with_relu_keeps_nan_and_zeroes_negatives(kernel_cache):
    c = compile_op(MATMUL_BIAS_RELU, {"A": (24, 32), "B": (32, 64), "bias": (64,)}, outputs=["O"])
    target = avx512_target(2)
    trace = default_schedule(c, target)
    code = _code(c, trace, target)
    assert "so_relu16(" in code and "float acc[" not in code
    rng = np.random.default_rng(1)
    A, B, bias = (rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs)
    A[3, 5] = np.nan  # row 3 of the product is NaN: ReLU keeps it (as numpy's maximum(x, 0))
    got, want = _run(c, trace, host_target(2), kernel_cache, [A, B, bias])
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    assert (got[~np.isnan(got)] >= 0).all() and (got == 0).sum() > 100
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_write_back_across_the_vector_dim_stores_lane_by_lane(kernel_cache):
    """An NCHW conv vectorized over output channels writes each vector across 16 planes (and reads its
    padded input as bounds-checked scalars): one store a lane, still right."""
    c = compile_op(CONV_BIAS_RELU, {"X": (1, 16, 10, 10), "W": (32, 16, 3, 3), "B": (32,)},
                   extents={"y": 10, "x": 10}, padding={"X": 0.0}, outputs=["O"])
    target = avx512_target(2)
    trace = default_schedule(c, target)
    code = _code(c, trace, target)
    assert "so_v16 acc_vec[" in code and "so_w[so_l]" in code and "so_relu16(" in code
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_capsule_votes_write_their_columns_through_div_mod(kernel_cache):
    c = compile_op(CAPSULE, {"P": (2, 9, 9, 8, 4, 4), "W": (3, 3, 8, 8, 4, 4)})
    target = avx512_target(2)
    trace = default_schedule(c, target)
    assert "so_v16 acc_vec[" in _code(c, trace, target)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_avx2_target_holds_its_tile_as_8_lane_vectors(kernel_cache):
    c = compile_op(MATMUL, {"A": (48, 40), "B": (40, 64)})
    trace = default_schedule(c, AVX2)
    code = _code(c, trace, AVX2)
    assert "so_v8 acc_vec[" in code and "so_v16" not in code.split("so_v8 acc_vec[")[1]
    rng = np.random.default_rng(4)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, AVX2, kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width", [24, 40, 12, 6])
def test_a_vector_loop_that_is_no_whole_number_of_vectors_overlaps_its_last_vector(width, kernel_cache):
    """Columns of 24 or 40 (1.5 and 2.5 vectors): whole vectors, the last starting at ``width - 16`` so that it
    overlaps the one before (its columns computed twice, stored twice with the same values) instead of reaching
    past the row; 12 columns (less than a vector): two half vectors, the second from column 4. Columns of 6
    (less than half a vector) keep the float array GCC vectorizes."""
    c = compile_op(MATMUL, {"A": (8, 16), "B": (16, width)})
    trace = [Split("C", "i", 4), Reorder("C", ("i_o", "k", "i_i", "j")), CacheWrite("C", "k"), Unroll("C", "i_i"),
             Vectorize("C", "j"), Parallel("C", "i_o"), Pack("B", (0, 1))]
    target = avx512_target(2)
    code = _code(c, trace, target)
    if width > 16:
        assert f"so_v16 acc_vec[{4 * -(-width // 16)}]" in code and f"SO_MIN(16 * j_vec, {width - 16})" in code
    elif width > 8:
        assert "so_v8 acc_vec[8]" in code and f"SO_MIN(8 * j_vec, {width - 8})" in code
    else:
        assert "acc_vec" not in code and f"float acc[{4 * width}]" in code
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("out_stride", [False, True])
def test_a_tile_written_back_once_per_reduction_block_adds_its_overlapped_lanes_once(out_stride, kernel_cache):
    """25 columns, the reduction in blocks of 4 outside the rows: the tile is added to the output once per block.
    Held as 2 vectors a row, the second from column 9, that vector adds only its lanes past the first vector's
    (its first 7 zeroed), so the 7 shared columns are added once. Written to a transposed output (one store a
    lane), the shared lanes are skipped the same way."""
    eq = "C[j,i] += A[i,k] * B[k,j]" if out_stride else MATMUL
    c = compile_op(eq, {"A": (8, 16), "B": (16, 25)})
    trace = [Split("C", "k", 4), Split("C", "i", 4), Reorder("C", ("k_o", "i_o", "k_i", "i_i", "j")),
             CacheWrite("C", "k_i"), Unroll("C", "i_i"), Vectorize("C", "j")]
    code = _code(c, trace, avx512_target(2))
    assert "float acc[" not in code and "so_v16 acc_vec[8]" in code and "SO_MIN(16 * j_vec, 9)" in code
    assert "so_from16(acc_vec[" in code and "16 * j_vec - j" in code
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_last_panel_of_a_wide_tile_overlaps_its_last_vector_in_rows_of_the_full_tiles_pitch(kernel_cache):
    """57 columns in tiles of 32: the last panel is 25 columns, its rows 32 apart in the tile; held as two vectors a
    row, the second from column 9, where it was a float array."""
    c = compile_op(MATMUL, {"A": (8, 16), "B": (16, 57)})
    trace = [Split("C", "j", 32), Split("C", "i", 4), Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i"), Parallel("C", "i_o")]
    code = _code(c, trace, avx512_target(2))
    assert "float acc[" not in code and "so_v16 acc_vec[8]" in code and "SO_MIN(16 * j_i_vec, 9)" in code
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_read_through_a_div_mod_of_the_vector_loop_keeps_the_array(kernel_cache):
    """A 1-tap conv over [2,4,8] vectorizes the fused (batch, position) loop of 16: its input index is
    ``(d0_d3 % 8) + 32*(d0_d3 / 8)``, neither contiguous nor constant along the vector (ONNX's
    causal_conv_with_state_kernel_size_one, which a broadcast of that read got wrong)."""
    c = compile_op("out0[d0,d1,d2,d3] += in0[d0,d1+d4,d3+d5] * in1[d1+d2,d4,d5]", {"in0": (2, 4, 8), "in1": (4, 1, 1)},
                   extents={"d2": 1, "d3": 8})
    target = avx512_target(2)
    trace = default_schedule(c, target)
    code = _code(c, trace, target)
    assert "% 8" in code and "acc_vec" not in code
    rng = np.random.default_rng(6)
    args = [rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs]
    got, want = _run(c, trace, host_target(2), kernel_cache, args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sums_folded_into_the_write_back_are_vector_updates(kernel_cache):
    """The one-pass weighted variance over capsule votes: both shifted sums folded into V's write-back are
    vector read-modify-writes of their outputs, the weight R read through ``(o_p / 16)`` (constant along a
    16-lane vector) a broadcast, so the contraction keeps its tile in registers."""
    from rewrite_rules.moments import EM, SHIFTED_MOMENTS
    from superopt.api import define_op
    from superopt.schedule.graph_defaults import default_schedules

    shapes = {"P": (2, 8, 8, 4, 4), "W": (3, 3, 4, 4, 4, 16), "R": (2, 4, 6, 6, 4)}
    merged = SHIFTED_MOMENTS.first(define_op(EM, shapes))
    (node,) = merged.nodes
    target = avx512_target(2)
    trace = default_schedules(merged, target)[node.name]
    code = _code(node.op, trace, target)
    assert "so_v16 acc_vec[" in code and "so_st16(&D_s1[" in code and "so_st16(&D_s2[" in code
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(node.op.type_of[n].shape).astype(np.float32) for n in node.op.inputs]
    args[2] = np.abs(args[2])  # routing weights: positive
    host = host_target(2)
    (got,) = build_kernel(node.op, default_schedules(merged, host)[node.name], kernel_cache, threads=2,
                          target=host)(*args)
    (want,) = evaluate_compute(node.op, args, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
