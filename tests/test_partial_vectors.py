"""Register tiles of a partial last panel of columns: the column operand is packed into panels zero-filled to
whole tiles, so the tile accumulates over the whole panel and only its stores stop at the output's edge. Such
tiles keep the vector spelling (accumulators in vector registers, the last vector stored lane by lane up to the
bound) instead of falling back to a float array updated by scalar loops; checked against the reference, on a
last panel walked by the outer (parallel) loop and on one that is the last tile of an inner loop."""

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernels
from superopt.schedule.plan import lower
from superopt.schedule.primitives import CacheWrite, Pack, Parallel, Reorder, Split, Unroll, Vectorize
from superopt.target import host_target

PERMUTED = "C[i,j] += A[k,i,l] * B[l,k,j]"


def _trace(width: int, panels_outer: bool) -> list:
    order = ("j_o", "i_o", "k", "l", "i_i", "j_i") if panels_outer else ("i_o", "j_o", "k", "l", "i_i", "j_i")
    return [Split("C", "j", width), Split("C", "i", 6), Reorder("C", order), CacheWrite("C", "k"),
            Unroll("C", "i_i"), Vectorize("C", "j_i"), Parallel("C", order[0]), Pack("B", (1, 0, 2), 2, width)]


@pytest.mark.parametrize("cols, rows, panels_outer", [(50, 27, True), (50, 24, False), (64, 27, True)])
def test_a_partial_last_panel_keeps_vector_tiles(cols, rows, panels_outer, kernel_cache):
    target = host_target(2)
    lanes = target.lanes("float32")
    width = 2 * lanes
    cols = cols * lanes // 16  # (the same share of a panel on 8 lanes)
    c = compile_op(PERMUTED, {"A": (8, rows, 12), "B": (12, 8, cols)})
    trace = _trace(width, panels_outer)
    code = emit_c(lower(c, trace, target), "k").code
    partial = cols % width != 0
    # the tiles of the last panel: vectors with bounded stores, its last tile of rows too (its rows get a
    # constant count of their own: no float array updated by scalar loops)
    assert ("j_i_n = " in code) == partial, code
    if panels_outer and partial:
        assert "bounded stores" in code and "float acc[" not in code, code
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(c.type_of[t].shape).astype(np.float32) for t in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, trace)], kernel_cache, threads=2, target=target)
    (got,) = kernel(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
