"""Accumulators holding a partial reduction (reduction loops outside the ``CacheWrite``): the first
reduction block stores its tile and the later ones combine into it, so the output is never filled with
the reduction's identity first (no fill pass, no extra parallel region: on the shared 2-core machine each
parallel region can wait a scheduler tick for a descheduled thread; attention [1,12,256,64] with 2 threads
under load: 15.7 -> 8.0 ms). Checked against the reference, NaN propagation of max= across blocks included.
"""

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest.alloc import Fill
from superopt.loopnest.build import build_loopnest
from superopt.loopnest.walk import walk
from superopt.runtime.kernel import build_kernels
from superopt.schedule.plan import lower
from superopt.schedule.primitives import CacheWrite, Parallel, Reorder, Split, Vectorize
from superopt.target import host_target

MATMUL = "C[i,j] += A[i,k] * B[k,j]"
ROW_MAX = "M[i,u] max= X[i,k]"


def _fills(c, trace) -> list[str]:
    nest = build_loopnest(lower(c, trace, host_target(2)))
    return [v.node.buffer for v in walk(nest) if isinstance(v.node, Fill)]


def _check(c, trace, args, kernel_cache):
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, trace)], kernel_cache, threads=2)
    (got,) = kernel(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"trace {trace}")


@pytest.mark.parametrize("k_block", [8, 7])  # (7: the last block is shorter)
def test_reduction_blocks_outside_the_tile_store_then_combine(k_block, kernel_cache):
    c = compile_op(MATMUL, {"A": (10, 30), "B": (30, 48)})
    trace = [Split("C", "k", k_block), Split("C", "j", 16), Reorder("C", ("j_o", "k_o", "i", "k_i", "j_i")),
             CacheWrite("C", "k_i"), Vectorize("C", "j_i"), Parallel("C", "j_o")]
    assert "C" not in _fills(c, trace)
    rng = np.random.default_rng(0)
    _check(c, trace, [rng.standard_normal(c.type_of[t].shape).astype(np.float32) for t in c.inputs], kernel_cache)


def test_max_over_blocks_keeps_nan_of_a_later_block(kernel_cache):
    c = compile_op(ROW_MAX, {"X": (6, 40)}, extents={"u": 1})
    trace = [Split("M", "k", 16), Reorder("M", ("k_o", "i", "u", "k_i")), CacheWrite("M", "k_i")]
    assert "M" not in _fills(c, trace)
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    x[2, 35] = np.nan  # in the last block: the stored first block must not hide it
    x[4, 3] = np.nan  # in the first block
    _check(c, trace, [x], kernel_cache)


def test_a_reduction_outside_without_accumulator_still_fills(kernel_cache):
    """No accumulator (every step updates the output in memory): the output starts at the identity."""
    c = compile_op(MATMUL, {"A": (5, 9), "B": (9, 6)})
    trace = [Reorder("C", ("k", "i", "j"))]
    assert "C" in _fills(c, trace)
    rng = np.random.default_rng(2)
    _check(c, trace, [rng.standard_normal(c.type_of[t].shape).astype(np.float32) for t in c.inputs], kernel_cache)
