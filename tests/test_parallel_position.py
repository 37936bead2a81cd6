"""The parallel loop may sit inside serial loops: the search's ``par_pos`` knob puts it there (panels of the column
operand one after the other, the threads sharing each panel's rows), the plan check allows it only under serial
loops, and such kernels match the reference."""

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.lang import compile_op
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import CacheWrite, Parallel, Reorder, Split, Unroll, Vectorize
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import host_target

MATMUL = "C[i,j] += A[i,k] * B[k,j]"


def _tiles(inner_parallel: str, unroll_outer: bool = False) -> list:
    return ([Split("C", "i", 6), Split("C", "j", 32), Reorder("C", ("j_o", "i_o", "k", "i_i", "j_i")),
             CacheWrite("C", "k"), Unroll("C", "i_i"), Vectorize("C", "j_i")]
            + ([Unroll("C", "j_o")] if unroll_outer else []) + [Parallel("C", inner_parallel)])


def test_a_parallel_loop_inside_serial_loops_matches_the_reference(kernel_cache):
    """Panels of 32 columns in turn (the last of 8), the threads sharing each one's row tiles (the last of 1 row):
    the fork is inside the serial panel loop, and the kernel is exact for every remainder."""
    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (61, 40), "B": (40, 104)})
    trace = _tiles("i_o")
    code = emit_c(lower(c, trace, host_target(2)), "k").code
    assert code.index("for (int j_o") < code.index("#pragma omp parallel for"), code
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((61, 40), np.float32), rng.standard_normal((40, 104), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trace,why", [
    (_tiles("i_o", unroll_outer=True), "serial loops outside it"),
    (_tiles("i_o") + [Parallel("C", "j_o")], "serial loops outside it"),
    (_tiles("k"), "reduction loop cannot run in parallel"),
])
def test_a_parallel_loop_under_a_loop_that_is_not_serial_is_rejected(trace, why):
    c = compile_op(MATMUL, {"A": (61, 40), "B": (40, 104)})
    with pytest.raises(ScheduleError, match=why):
        lower(c, trace, host_target(2))


def test_the_search_space_moves_the_parallel_loop_inward_and_the_default_keeps_it_outermost():
    """``par_pos`` 1 parallelizes the loop inside the outermost one; the default's 0 keeps the outermost."""
    c = compile_op("C[j,i] += A[k,i] * B[k,j]", {"A": (256, 300), "B": (256, 137)})
    space = ScheduleSpace(c, host_target(2), frozenset())
    _, used, domains = space.resolve(space.default_point())
    assert used["C.par_pos"] == 0 and domains["C.par_pos"] == (0, 1)
    for pos in (0, 1):
        trace = space.trace(Point.of(space.default_point().sketch, {"C.par_pos": pos}))
        order = [p for p in trace if isinstance(p, Reorder)][-1].order
        assert [p.loop for p in trace if isinstance(p, Parallel)] == [order[pos]], trace
