"""Transpositions copied by register shuffles (the TransposeBlock record): what the default picks, that every
order of the block loops, partial blocks (extents that are not multiples of the lanes) and streamed stores give
the reference's result, the prelude's partial-block copy on its own (with and without AVX-512), and the reasons
``check()`` gives for the blocks it refuses."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.lang import compile_op
from superopt.runtime.compiler import DEFAULT_FLAGS, CompilerConfig, compile_library
from superopt.runtime.kernel import build_kernel
from superopt.schedule.default import default_schedule
from superopt.schedule.elementwise import TRANSPOSE_ORDERS, transpose_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Fuse, Parallel, Reorder, Split, TransposeBlock, trace_from_json, trace_to_json
from superopt.target import avx512_target, h200_target, host_target
from superopt.testing.targets import avx2

# (index notation, input shape, the numpy axes of the input the output's axes are): 2-D to 4-D, odd extents
PERMUTATIONS = [
    ("O[j,i] = X[i,j]", (37, 53), (1, 0)),
    ("O[j,i] = X[i,j]", (64, 48), (1, 0)),
    ("O[k,j,i] = X[i,j,k]", (19, 5, 35), (2, 1, 0)),
    ("O[a,k,i] = X[a,i,k]", (3, 17, 40), (0, 2, 1)),
    ("O[l,j,i,k] = X[i,j,k,l]", (3, 4, 21, 18), (3, 1, 0, 2)),
    ("O[j,l,k,i] = X[i,j,k,l]", (20, 3, 2, 33), (1, 3, 2, 0)),
]


def _avx2_target():
    """Eight float lanes (so_transpose8 and its partial blocks), on this host's compiler flags."""
    return avx2(2)


def _host_has_avx512() -> bool:
    return "avx512f" in host_target(2).isa_flags


@pytest.mark.parametrize("text, shape, axes", PERMUTATIONS)
def test_the_default_copies_a_permutation_by_register_blocks_and_matches_numpy(text, shape, axes, kernel_cache):
    target = host_target(2)
    c = compile_op(text, {"X": shape})
    trace = default_schedule(c, target)
    blocks = [p for p in trace if isinstance(p, TransposeBlock)]
    assert len(blocks) == 1 and not blocks[0].stream, trace
    lanes = target.lanes("float32")
    assert f"so_transpose{lanes}" in emit_c(lower(c, trace, target)).code
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, x.transpose(axes))


@pytest.mark.parametrize("order", TRANSPOSE_ORDERS)
@pytest.mark.parametrize("stream", [False, True])
def test_every_block_order_and_streamed_stores_match_numpy(order, stream, kernel_cache):
    c = compile_op("O[l,j,i,k] = X[i,j,k,l]", {"X": (5, 3, 37, 21)})
    trace = transpose_schedule(c.statements[-1], host_target(2), KnobRecorder({"O.order": order, "O.stream": stream}),
                               c.type_of)
    assert TransposeBlock("O", "l_i", stream) in trace
    x = np.random.default_rng(1).standard_normal((5, 3, 37, 21)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, x.transpose(3, 1, 0, 2))


def test_extents_of_half_a_vector_keep_whole_shuffled_blocks_where_half_is_no_register_block(kernel_cache):
    """On AVX2 half a vector is 4 lanes, which no register transpose copies: extents that divide by 4 and not by 8
    keep blocks of 8 (the last partial) copied by shuffles, not 4 x 4 blocks copied element by element. On
    AVX-512 the half (8 lanes) is itself a register block and is kept."""
    c = compile_op("O[j,i] = X[i,j]", {"X": (20, 12)})
    trace = default_schedule(c, _avx2_target())
    assert Split("O", "i", 8) in trace and Split("O", "j", 8) in trace and TransposeBlock("O", "j_i", False) in trace
    x = np.random.default_rng(3).standard_normal((20, 12)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=_avx2_target())(x)
    np.testing.assert_array_equal(got, x.T)
    wide = default_schedule(compile_op("O[j,i] = X[i,j]", {"X": (24, 40)}), avx512_target(2))
    assert Split("O", "i", 8) in wide and TransposeBlock("O", "j_i", False) in wide


def test_eight_lane_blocks_with_partial_blocks_match_numpy(kernel_cache):
    target = _avx2_target()
    c = compile_op("O[k,j,i] = X[i,j,k]", {"X": (13, 4, 27)})
    trace = default_schedule(c, target)
    assert TransposeBlock("O", "k_i", False) in trace and Split("O", "k", 8) in trace
    assert "so_transpose8p(" in emit_c(lower(c, trace, target)).code
    x = np.random.default_rng(2).standard_normal((13, 4, 27)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=target)(x)
    np.testing.assert_array_equal(got, x.transpose(2, 1, 0))


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("avx512", [True, False])
@pytest.mark.parametrize("kind", ["p", "s"])
def test_the_prelude_partial_block_copy_writes_the_block_and_nothing_else(lanes, avx512, kind, tmp_path):
    """so_transposeLp / so_transposeLs on blocks of every shape up to L x L inside a larger strided array: row k
    of the output holds column k of the input's first ``rows`` rows; nothing around the block is written (the
    masked stores), whether the compiler has AVX-512 (masked loads and stores) or not (element-wise copies)."""
    if avx512 and not _host_has_avx512():
        pytest.skip("the host has no AVX-512")
    flags = DEFAULT_FLAGS if avx512 else (*DEFAULT_FLAGS, "-mno-avx512f")
    ss, ds = lanes + 3, lanes + 5
    code = (f"void tr(const float *s, float *d, int rows, int cols) {{ "
            f"so_transpose{lanes}{kind}(s, {ss}, d, {ds}, rows, cols); }}\n")
    lib = ctypes.CDLL(str(compile_library([code], CompilerConfig(flags=flags, cache_dir=tmp_path))))
    src = np.arange(lanes * ss, dtype=np.float32) + 1
    for rows, cols in [(lanes, lanes), (1, 1), (lanes, 3), (5, lanes), (lanes - 1, lanes - 2)]:
        dst = np.full(lanes * ds + 64, -1.0, np.float32)  # 64 floats past the last row: an overrun would show
        lib.tr(src.ctypes.data_as(ctypes.c_void_p), dst.ctypes.data_as(ctypes.c_void_p), rows, cols)
        want = np.full_like(dst, -1.0)
        want[:lanes * ds].reshape(lanes, ds)[:cols, :rows] = src.reshape(lanes, ss)[:rows, :cols].T
        np.testing.assert_array_equal(dst, want, err_msg=f"{rows} x {cols}")


def test_a_transpose_block_round_trips_through_json():
    trace = (TransposeBlock("O", "j_i", True), TransposeBlock("O", "j_i"), TransposeBlock("O", "j_i", False, "i_o"))
    assert trace_from_json(trace_to_json(trace)) == trace


def _blocked(stage: str = "O", a: str = "j", b: str = "i", block: int = 16) -> list:
    return [Split(stage, a, block), Split(stage, b, block), Reorder(stage, (f"{b}_o", f"{a}_o", f"{a}_i", f"{b}_i")),
            Parallel(stage, f"{b}_o")]


@pytest.mark.parametrize("text, trace, reason", [
    ("O[j,i] = X[i,j] * 2.0", _blocked() + [TransposeBlock("O", "j_i")], "not a plain copy"),
    ("O[j,i] = X[i,j]", _blocked() + [TransposeBlock("O", "i_o")], "not the second innermost"),
    ("O[j,i] = X[i,j]", _blocked(block=32) + [TransposeBlock("O", "j_i")], "not a block of"),
    ("O[j,i] = X[i,j]", _blocked(a="i", b="j") + [TransposeBlock("O", "i_i")], "does not read contiguously"),
    ("O[j,i] = X[i,j]", _blocked() + [TransposeBlock("O", "j_i"), TransposeBlock("O", "j_i")], "already copies"),
    ("O[j,i] = X[i,j]", _blocked() + [TransposeBlock("O", "j_i", 1)], "must be bool"),
    ("O[j,i] = X[i,j]", _blocked() + [TransposeBlock("O", "j_i", False, True)], "must be str"),
    ("O[j,i] = X[i,j]", _blocked() + [TransposeBlock("O", "j_i", False, "j_i")], "not a loop around the block"),
    # a fused loop moves the source by div/mod of its index: no constant stride to the next block
    ("O[j,i] = X[i,j]", [Split("O", "j", 16), Split("O", "i", 16), Reorder("O", ("j_o", "i_o", "j_i", "i_i")),
                         Fuse("O", "j_o", "i_o"), TransposeBlock("O", "j_i", False, "j_o_i_o")], "constant stride"),
    ("O[j,i] = X[i,j]", [Split("O", "j", 16), Split("O", "i", 16), Reorder("O", ("j_o", "i_o", "j_i", "i_i")),
                         Fuse("O", "j_o", "i_o"), Split("O", "j_o_i_o", 12),
                         TransposeBlock("O", "j_i", False, "j_o_i_o_i")], "constant stride"),
])
def test_check_refuses_a_block_it_cannot_copy_with_the_reason(text, trace, reason):
    c = compile_op(text, {"X": (64, 48)})
    with pytest.raises(ScheduleError, match=reason):
        lower(c, trace, avx512_target(2))


def test_check_refuses_register_transposes_on_a_gpu():
    c = compile_op("O[j,i] = X[i,j]", {"X": (64, 48)})
    with pytest.raises(ScheduleError, match="CPU targets"):
        lower(c, [Split("O", "j", 16), Split("O", "i", 16), Reorder("O", ("i_o", "j_o", "j_i", "i_i")),
                  TransposeBlock("O", "j_i")], h200_target())


def test_the_cost_model_sees_both_sides_of_a_register_block_move_in_vectors():
    """The features of a transposition copied by blocks in registers: a vector loop, and unit inner and vector
    strides on both buffers; the same blocks copied element by element leave one buffer strided."""
    from costmodel.features import FEATURE_NAMES, nest_features
    from superopt.loopnest import build_loopnest

    target = avx512_target(2)
    c = compile_op("O[j,i] = X[i,j]", {"X": (200, 150)})
    feats = {}
    for shuffle in (True, False):
        trace = transpose_schedule(c.statements[-1], target, KnobRecorder({"O.shuffle": shuffle}), c.type_of)
        plan = lower(c, trace, target)
        feats[shuffle] = dict(zip(FEATURE_NAMES, nest_features(plan, build_loopnest(plan), target, frozenset())))
    blocks, scalar = feats[True], feats[False]
    assert blocks["loop.vectorized.count"] > 0 and scalar["loop.vectorized.count"] == 0
    for b in ("buf0", "buf1"):
        assert blocks[f"{b}.inner_stride"] == blocks[f"{b}.vector_stride"] == 1.0  # log2(1 + 1)
    assert max(scalar["buf0.inner_stride"], scalar["buf1.inner_stride"]) > 1.0


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_a_transposition_of_another_type_keeps_its_blocks_without_register_shuffles(dtype, kernel_cache):
    from superopt.schedule.primitives import Parallel as Par

    c = compile_op("O[k,j,i] = X[i,j,k]", {"X": (19, 5, 35)}, dtype=dtype)
    trace = default_schedule(c, host_target(2))
    assert not any(isinstance(p, TransposeBlock) for p in trace) and any(isinstance(p, Par) for p in trace), trace
    x = (np.random.default_rng(4).standard_normal((19, 5, 35)) * 100).astype(dtype)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, x.transpose(2, 1, 0))


def test_a_transposition_of_an_inlined_temporary_falls_back_to_the_simple_blocks(kernel_cache):
    """``O[j,i] = T[i,j]`` with ``T = 2 X`` inlined is no plain copy: check() refuses the register block, and the
    default falls back to a sketch without it (still parallel), not to the naive loops."""
    c = compile_op("T[i,j] = X[i,j] * 2.0\nO[j,i] = T[i,j]", {"X": (37, 53)})
    trace = default_schedule(c, host_target(2))
    assert trace and not any(isinstance(p, TransposeBlock) for p in trace), trace
    x = np.random.default_rng(5).standard_normal((37, 53)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, (2 * x).T)


def _random_permutations(seed: int, count: int) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Seeded 3-D and 4-D permutations that move the innermost axis, with extents of 16 to 45 (mostly not multiples
    of 16: partial blocks on both sides) and small outer extents: (index notation, input shape, numpy axes)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        nd = int(rng.integers(3, 5))
        axes = tuple(int(a) for a in rng.permutation(nd))
        if axes[-1] == nd - 1:
            continue  # the innermost axis stays: no transposition of blocks
        names = "ijkl"[:nd]
        shape = tuple(int(rng.integers(16, 46)) if d in (nd - 1, axes[-1]) else int(rng.integers(2, 6))
                      for d in range(nd))
        out.append((f"O[{','.join(names[a] for a in axes)}] = X[{','.join(names)}]", shape, axes))
    return out


@pytest.mark.parametrize("seed", [3, 11])
def test_random_permutations_in_every_order_with_streamed_stores_match_numpy(seed, kernel_cache):
    """Random permutations (partial blocks, 3-D and 4-D), each order of the block loops, streamed or not,
    prefetching or not, 8 or 16 lanes, in one library: every kernel copies its input exactly."""
    from superopt.runtime.kernel import build_kernels

    rng = np.random.default_rng(seed)
    target = host_target(2)
    lanes = (8, 16) if target.lanes("float32") == 16 else (8,)
    items, cases = [], []
    for text, shape, axes in _random_permutations(seed, 5):
        c = compile_op(text, {"X": shape})
        for order in TRANSPOSE_ORDERS:
            knobs = {"O.order": order, "O.stream": bool(rng.integers(2)), "O.block": int(rng.choice(lanes)),
                     "O.prefetch": bool(rng.integers(2))}
            trace = transpose_schedule(c.statements[-1], target, KnobRecorder(knobs), c.type_of)
            assert any(isinstance(p, TransposeBlock) for p in trace), (text, knobs)
            items.append((c, trace))
            cases.append((text, shape, axes, knobs))
    for k, (text, shape, axes, knobs) in zip(build_kernels(items, kernel_cache, threads=2), cases, strict=True):
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = k(x)
        np.testing.assert_array_equal(got, x.transpose(axes), err_msg=f"{text} {shape} {knobs}")


@pytest.mark.parametrize("text, shape, first", [
    # mid would leave 150 x 100 input rows open between two blocks of k (1.9 MB, past half the L2)
    ("O[k,j,i] = X[i,j,k]", (100, 150, 170), ("j", "i_o", "k_o")),
    # 30 x 50 rows open (192 KB): mid, the blocks of l inside j
    ("O[l,j,i,k] = X[i,j,k,l]", (30, 40, 50, 60), ("j", "l_o", "i", "k_o")),
    # 1990 rows open (255 KB): mid (output rows of 1990 floats: not streamed)
    ("O[j,i] = X[i,j]", (1990, 1500), ("j_o", "i_o")),
])
def test_the_default_order_reads_input_rows_end_to_end_where_mid_would_outgrow_the_l2(text, shape, first):
    c = compile_op(text, {"X": shape})
    trace = transpose_schedule(c.statements[-1], avx512_target(2), KnobRecorder(), c.type_of)
    (reorder,) = [p for p in trace if isinstance(p, Reorder)]
    assert reorder.order[:len(first)] == first, reorder


def test_streamed_blocks_fence_once_per_outer_iteration_not_per_block(kernel_cache):
    """The streamed copy's C: no fence in the block copy itself, one at the end of each iteration of the parallel
    loop (a fence per block waits on every block's stores); and the result is the transposition."""
    from superopt.codegen.c_prelude import transpose_stream_source

    assert "sfence" not in transpose_stream_source(16) and "sfence" not in transpose_stream_source(8)
    c = compile_op("O[k,j,i] = X[i,j,k]", {"X": (37, 6, 50)})
    target = host_target(2)
    trace = transpose_schedule(c.statements[-1], target, KnobRecorder({"O.stream": True}), c.type_of)
    code = emit_c(lower(c, trace, target)).code
    body = code[code.index("void kernel("):]
    assert body.count("so_stream_fence();") == 1
    lines = body.splitlines()
    fence = next(i for i, ln in enumerate(lines) if "so_stream_fence();" in ln)
    parallel = next(i for i, ln in enumerate(lines) if "omp parallel for" in ln)
    # inside the parallel loop's body, at its own depth (after the block loops close)
    indent = len(lines[parallel + 1]) - len(lines[parallel + 1].lstrip())
    assert parallel < fence and len(lines[fence]) - len(lines[fence].lstrip()) == indent + 4
    x = np.random.default_rng(6).standard_normal((37, 6, 50)).astype(np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, x.transpose(2, 1, 0))


@pytest.mark.parametrize("text, shape, streamed", [
    ("O[j,i] = X[i,j]", (2000, 1500), True),  # 12 MB of output rows of 2000 floats: whole lines
    ("O[j,i] = X[i,j]", (64, 48), False),  # whole lines, but the output is a sliver of the last-level cache
    ("O[k,j,i] = X[i,j,k]", (100, 150, 170), False),  # rows of 100 floats: half-written lines
    ("O[l,j,i,k] = X[i,j,k,l]", (30, 40, 48, 64), True),  # rows of 48 floats, each output stride a multiple of 16
    ("O[l,j,i,k] = X[i,j,k,l]", (30, 40, 50, 60), False),
])
def test_the_default_streams_stores_only_where_blocks_write_whole_lines_of_a_large_output(text, shape, streamed):
    c = compile_op(text, {"X": shape})
    kn = KnobRecorder()
    trace = transpose_schedule(c.statements[-1], avx512_target(2), kn, c.type_of)
    (block,) = [p for p in trace if isinstance(p, TransposeBlock)]
    assert block.stream == streamed, trace
    if streamed:  # long input rows (1500 floats) read end to end; rows of 64 keep mid's whole output rows
        assert kn.used["O.order"] == ("outer+in" if shape[-1] >= 128 else "mid"), kn.used


def test_check_refuses_a_prefetch_along_a_loop_the_stage_lacks():
    c = compile_op("O[j,i] = X[i,j]", {"X": (16, 16)})
    with pytest.raises(ScheduleError, match="no loop 'k'"):
        lower(c, [Reorder("O", ("j", "i")), TransposeBlock("O", "j", False, "k")], avx512_target(2))


def test_a_large_copy_prefetches_the_next_blocks_rows_and_matches_numpy(kernel_cache):
    """ijkl->ljik with 50 x 60 planes: mid's blocks of k step to the next 16 input rows, so each block asks for
    them first; ijk->kji's outer+in reads strips of 16 rows end to end and asks for the next strip's (the default
    where the copy is a good part of the last-level cache; forced on a small copy here)."""
    c = compile_op("O[l,j,i,k] = X[i,j,k,l]", {"X": (30, 40, 50, 60)})
    trace = transpose_schedule(c.statements[-1], avx512_target(2), KnobRecorder(), c.type_of)
    assert TransposeBlock("O", "l_i", False, "k_o") in trace, trace
    c = compile_op("O[k,j,i] = X[i,j,k]", {"X": (100, 150, 170)})
    trace = transpose_schedule(c.statements[-1], avx512_target(2), KnobRecorder(), c.type_of)
    assert TransposeBlock("O", "k_i", False, "i_o") in trace, trace
    small = compile_op("O[l,j,i,k] = X[i,j,k,l]", {"X": (3, 4, 50, 60)})
    target = host_target(2)
    kn = KnobRecorder({"O.prefetch": True})
    trace = transpose_schedule(small.statements[-1], target, kn, small.type_of)
    assert kn.used["O.order"] == "mid" and TransposeBlock("O", "l_i", False, "k_o") in trace, trace
    code = emit_c(lower(small, trace, target)).code
    body = code[code.index("void kernel("):]
    # the next block's rows: a block of rows of 60 further on (the loop around the pair, k_o, moves a block of rows
    # of the plane: 16 on AVX-512, 8 on AVX2)
    lanes = target.lanes("float32")
    assert f"so_prefetch_rows{lanes}(" in body and f"+ {lanes * 60}, 60);" in body, body
    x = np.random.default_rng(8).standard_normal((3, 4, 50, 60)).astype(np.float32)
    (got,) = build_kernel(small, trace, kernel_cache, threads=2)(x)
    np.testing.assert_array_equal(got, x.transpose(3, 1, 0, 2))
