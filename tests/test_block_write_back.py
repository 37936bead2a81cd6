"""A partial reduction's write-back (reduction blocks outside the register tile: the first block stores the
tile, the middle ones add it to the buffer, the last adds the buffer and runs the epilogue) is one loop nest
per kind of block, run under its block test once per tile: the loop of the blocks is printed once (no copy
of the whole reduction per kind of block; a last block cut short gets a copy of its own, its steps a constant,
so that its tiles stay in registers), and every tile, whole or cut short by a tail, still computes what
the reference does."""

from __future__ import annotations

import re

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.lang import compile_op
from superopt.loopnest import Epilogue, Guard, Loop, build_loopnest
from superopt.loopnest.block_tests import block_share, hoisted_tests, without_tests
from superopt.loopnest.walk import accesses, walk
from superopt.runtime.kernel import build_kernel
from superopt.schedule import CacheWrite, Reorder, Split, Unroll, Vectorize
from superopt.schedule import Epilogue as EpilogueRecord
from superopt.schedule.plan import lower
from superopt.target import avx512_target, host_target

EPILOGUE_MM = "P[i,j] += A[i,k] * B[k,j]\nO[i,j] = relu(P[i,j] + C[j]) + R[i,j]"


def _case(i: int, k: int, j: int, block: int):
    c = compile_op(EPILOGUE_MM, {"A": (i, k), "B": (k, j), "C": (j,), "R": (i, j)}, outputs=["O"])
    trace = [Split("P", "k", block), Split("P", "i", 3), Split("P", "j", 16),
             Reorder("P", ("k_o", "i_o", "j_o", "k_i", "i_i", "j_i")), CacheWrite("P", "k_i"), Unroll("P", "i_i"),
             Vectorize("P", "j_i"), EpilogueRecord("O", "P")]
    return c, trace


def _loops(nest) -> list[Loop]:
    return [v.node for v in walk(nest) if isinstance(v.node, Loop)]


def _guards(n) -> list[Guard]:
    if isinstance(n, Guard):
        return [n]
    if isinstance(n, Epilogue):
        return _guards(n.body)
    if isinstance(n, Loop):
        return [g for c in n.body for g in _guards(c)]
    return []


# (rows 37: a tail of the 3-row tiles; columns 70: a partial last vector; k 50: a tail of the blocks of 8)
@pytest.mark.parametrize("i, k, j, block", [(37, 50, 64, 8), (37, 50, 70, 8), (12, 48, 32, 16), (9, 40, 16, 8)])
def test_block_write_backs_run_once_per_tile_under_their_test_and_match_the_reference(i, k, j, block, kernel_cache):
    c, trace = _case(i, k, j, block)
    code = emit_c(lower(c, trace, avx512_target(2)), "k").code
    # the blocks' loop: not split per kind of block (a last block cut short is peeled, its steps a constant)
    assert len(re.findall(r"for \(int k_o = ", code)) == 1 + (k % block != 0)
    last = -(-k // block) - 1
    for test in ("(k_o) < 1", "(-k_o) < 0", f"(-k_o) < {1 - last}"):
        assert re.search(r"if \([^\n]*" + re.escape(test) + r"[^\n]*\) \{\n\s*(#pragma GCC unroll \d+\n\s*)?for ",
                         code), test  # the test before the write-back's loops, not inside them
    assert not re.search(r"if \([^\n]*k_o[^\n]*\) [A-Za-z]", code)  # no statement tests its block itself
    if j % 16 == 0:
        assert "so_v16 acc_vec[" in code  # (a whole-vector tile keeps its vector spelling under the tests)
    rng = np.random.default_rng(i + k + j)
    A, B, C, R = (rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2, target=host_target(2))(A, B, C, R)
    want = np.maximum(A.astype(np.float64) @ B + C, 0) + R
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_each_kind_of_block_is_its_own_write_back_nest_with_one_test_to_hoist():
    c, trace = _case(37, 50, 64, 8)
    nest = build_loopnest(lower(c, trace, avx512_target(2)))
    nests = [lp for lp in _loops(nest) if hoisted_tests(lp)]
    kinds = {hoisted_tests(lp) for lp in nests}
    assert len(kinds) == 3  # first, middle, last
    for lp in nests:
        tests = hoisted_tests(lp)
        assert all(t.block and t.index.vars() == {"k_o"} for t in tests)
        guards = _guards(lp)
        assert guards and all(set(tests) <= set(g.conds) for g in guards)
        stripped = without_tests(lp, tests)
        assert hoisted_tests(stripped) == ()
        assert not any(t.block for g in _guards(stripped) for t in g.conds)
    # the loops around the write-backs (the tile's own, the reduction's) have no one test to hoist
    assert all(not hoisted_tests(lp) for lp in _loops(nest) if lp.var in ("k_o", "i_o", "j_o", "k_i"))


def test_a_block_write_back_counts_in_the_share_of_the_blocks_it_runs_in():
    """For the cost model's features: of 7 blocks, the first stores, 5 combine, the last runs the epilogue;
    the reduction's own accesses run in every block."""
    c, trace = _case(37, 50, 64, 8)
    nest = build_loopnest(lower(c, trace, avx512_target(2)))
    stores = [a for a in accesses(nest) if a.is_write and a.access.buffer == "O"]
    assert sorted({round(a.runs * 7, 9) for a in stores}) == [1.0, 5.0]
    assert {a.runs for a in accesses(nest) if a.access.buffer in ("A", "B")} == {1.0}
    assert block_share((), ()) == 1.0


def test_a_scalar_accumulator_splits_the_loop_of_the_blocks_instead(kernel_cache):
    """No tile loops to run a block's write-back under one test: a test at every element's write-back would
    cost a branch per element, so the blocks' loop is split into the first, the middle and the last blocks."""
    c = compile_op(EPILOGUE_MM, {"A": (37, 50), "B": (50, 70), "C": (70,), "R": (37, 70)}, outputs=["O"])
    trace = [Split("P", "k", 8), Reorder("P", ("k_o", "i", "j", "k_i")), CacheWrite("P", "k_i"),
             EpilogueRecord("O", "P")]
    code = emit_c(lower(c, trace), "k").code
    assert re.findall(r"for \(int k_o = 0; k_o < (\d+);", code) == ["1", "5", "1"]
    assert not re.search(r"if \([^\n]*k_o", code)
    rng = np.random.default_rng(5)
    A, B, C, R = (rng.standard_normal(c.type_of[n].shape).astype(np.float32) for n in c.inputs)
    (got,) = build_kernel(c, trace, kernel_cache)(A, B, C, R)
    np.testing.assert_allclose(got, np.maximum(A.astype(np.float64) @ B + C, 0) + R, rtol=1e-4, atol=1e-4)
