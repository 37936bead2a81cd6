"""Reduction blocks outside the row loops for a column panel read in place (superopt.schedule.reduction_blocks):
the default moves the leading reduction loop outside the rows where the panel outgrows the L1 and what is left of
it fits, splits a row loop over the threads, and the program matches the reference (an uneven split, a last panel
of 25 columns, the tile added to the output once per block); where the panel fits, or a block would be too short,
nothing moves."""

from dataclasses import replace

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import default_schedule
from superopt.schedule.primitives import CacheWrite, Parallel, Reorder, Split
from superopt.schedule.reduction_blocks import MIN_BLOCK_STEPS, PANEL_L1_SHARE, reduction_block
from superopt.target import host_target

# B's (m, l) columns fused, 153 in tiles of 64 (split across l: read where they lie, no pack); 19 x 135 reduction
# steps; the rows' (i, k) loops 3 x 7
TEXT = "C[j,i,m,k,l] += A[k,o,i,n,j] * B[o,n,m,l]"
SHAPES = {"A": (7, 19, 3, 135, 5), "B": (19, 135, 9, 17)}
TARGET = replace(host_target(2), l1_bytes=48 << 10)


def test_the_default_blocks_the_reduction_outside_the_rows_and_matches_the_reference(kernel_cache):
    c = compile_op(TEXT, SHAPES)
    trace = default_schedule(c, TARGET, frozenset())
    stage = next(p.stage for p in trace if isinstance(p, CacheWrite))
    order = [p for p in trace if isinstance(p, Reorder) and p.stage == stage][-1].order
    # the 64 x 135-step slice under one o fits 3/4 of the L1 where the whole panel (x 19) does not: o goes outside the
    # row loops (i, k), inside the panel loop; k (7) splits in 2 parts of 4 (3 in the last), one a thread
    assert order[:5] == ("k_o", "m_l_o", "o", "i", "k_i"), order
    assert CacheWrite(stage, "n") in trace and Split(stage, "k", 4) in trace and Parallel(stage, "k_o") in trace
    args = [np.random.default_rng(0).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, tuple(trace))], kernel_cache, 2, TARGET)
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4 + 1e-5 * np.abs(ref).max())


def test_no_block_where_the_panel_fits_the_l1():
    c = compile_op(TEXT, SHAPES)
    roomy = replace(TARGET, l1_bytes=4 << 20)
    trace = default_schedule(c, roomy, frozenset())
    assert not any(isinstance(p, Split) and p.loop == "k" for p in trace)
    assert CacheWrite(next(p.stage for p in trace if isinstance(p, CacheWrite)), "o") in trace


@pytest.mark.parametrize("reduce_extents, want", [
    ((19, 135), (1, 135)),  # 64 x 135 steps x 4 B = 34.6 KB fits 3/4 of 48 KB: o outside, n whole
    ((4, 5, 100), (2, 100)),  # 64 x 500 steps does not: two loops outside, 100 steps left
    ((5, 180), (1, 90)),  # 180 steps do not fit either: in blocks of 90
    ((4, 30), None),  # the whole panel (30 KB) fits already
    ((401, 20), None),  # blocks of 20 steps: the tile's write-back would cost too much
])
def test_the_block_is_the_longest_that_fits(reduce_extents, want):
    dims = [f"r{k}" for k in range(len(reduce_extents))]
    extents = dict(zip(dims, reduce_extents)) | {"i": 7, "k": 19}
    block = reduction_block(dims, extents, 64, ["i", "k"], 7 * 19, 2, 48 << 10)
    if want is None:
        assert block is None
        return
    assert (block.at, block.block) == want
    steps = block.block * np.prod(reduce_extents[block.at + 1:])
    assert 64 * 4 * steps <= PANEL_L1_SHARE * (48 << 10) and steps >= MIN_BLOCK_STEPS
    # the row loop the threads share: 19 rows as 10 + 9 keep both busier than 7 as 4 + 3
    assert (block.split, block.part) == ("k", 10)


def test_no_block_without_a_row_loop_the_threads_share_evenly_or_enough_rows():
    extents = {"o": 19, "n": 135, "i": 3, "k": 1}
    assert reduction_block(["o", "n"], extents, 64, ["i"], 3, 2, 48 << 10) is None  # 3 rows as 2 + 1
    assert reduction_block(["o", "n"], extents | {"i": 4}, 64, ["i"], 4, 2, 48 << 10) is None  # 2 tiles a thread
