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
from superopt.testing.targets import xeon_avx512

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


def _match_the_reference(c, traces, kernel_cache, seed: int) -> None:
    from superopt.interp import evaluate_compute
    from superopt.runtime.kernel import build_kernels

    args = [np.random.default_rng(seed).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, 2)):
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def _parallel_position(trace) -> int:
    order = [p for p in trace if isinstance(p, Reorder)][-1].order
    (par,) = [p for p in trace if isinstance(p, Parallel)]
    return order.index(par.loop)


def test_uneven_panels_run_in_turn_with_the_threads_sharing_their_rows(kernel_cache):
    """300 columns in 5 panels of 64 (the last of 44: the two threads would share them 3 to 2, and a partial
    panel cannot fuse with the rows): the default runs the panels in turn and the threads share each one's 23 row
    blocks; ``par_pos`` 0 puts the panels back in parallel. Both match the reference."""

    c = compile_op("C[j,i] += A[k,i] * B[k,j]", {"A": (256, 300), "B": (256, 137)})
    target = xeon_avx512(2)
    space = ScheduleSpace(c, target, frozenset())
    default, used, domains = space.resolve(space.default_point())
    assert used["C.par_pos"] == 1 and set(domains["C.par_pos"]) == {0, 1} and _parallel_position(default) == 1
    outermost = space.trace(Point.of(space.default_point().sketch, {"C.par_pos": 0}))
    assert _parallel_position(outermost) == 0
    _match_the_reference(c, (default, outermost), kernel_cache, seed=2)


def test_panels_stay_parallel_where_the_threads_would_split_short_output_rows():
    """15 uneven panels of k, then j: j is the output's contiguous dim, 57 floats a row, so threads sharing j would
    write the same cache lines at their shares' edges in every row (1.1x on 2 threads over 1): the panels stay
    the parallel loop. (Over 1100 reduction steps the rows are i; over a short reduction they would run along j.)"""
    c = compile_op("C[i,k,j] += A[i,j,l] * B[k,l]", {"A": (54, 57, 1100), "B": (915, 1100)})
    space = ScheduleSpace(c, xeon_avx512(2), frozenset())
    trace, used, domains = space.resolve(space.default_point())
    order = [p for p in trace if isinstance(p, Reorder)][-1].order
    assert order[:2] == ("k_o", "j") and used["C.par_pos"] == 0 and 1 in domains["C.par_pos"]
    assert _parallel_position(trace) == 0


def test_a_peeled_parallel_loop_is_one_parallel_region_and_matches_the_reference(kernel_cache, monkeypatch):
    """Panels of 32 columns over 104 (3 full, the last of 8) in parallel, rows in whole tiles of 6: the panel loop is
    peeled into its full tiles and the rest. Printed as two loops, that is two parallel regions, 3 panels on 2
    threads and then 1, three panels' time where two would do; printed as one, each iteration runs its copy."""
    import superopt.loopnest.versioning as versioning
    from superopt.runtime.kernel import build_kernel

    c = compile_op(MATMUL, {"A": (60, 40), "B": (40, 104)})
    trace = _tiles("j_o")

    def code() -> str:
        return emit_c(lower(c, trace, host_target(2)), "k").code

    assert code().count("#pragma omp parallel for") == 1 and "if (j_o < 3)" in code(), code()
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((60, 40), np.float32), rng.standard_normal((40, 104), np.float32)
    (got,) = build_kernel(c, trace, kernel_cache, threads=2)(A, B)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(versioning, "one_parallel_region", lambda extent, split, threads: False)
    assert code().count("#pragma omp parallel for") == 2


def test_uneven_panels_put_outermost_stay_there_where_the_loops_inside_share_evenly(kernel_cache, monkeypatch):
    """A's 139 columns in 3 panels of 48 (the last of 43) over 95 blocks of j,k: A fills most of a 128 KB L2, and
    rows outermost would read all of it once per block, so the re-read rule puts its panels outermost. Three panels
    are too few for two threads to share evenly, but the 95 blocks inside them are not: the panels run in turn, the
    threads sharing each one's blocks, and B is read 3 times. Without that exemption
    (``rows_shared_under_panels``) the balance rule moves the rows outermost. Both match the reference."""
    from dataclasses import replace

    import superopt.schedule.contraction as contraction
    from superopt.schedule.default import default_schedule

    c = compile_op("C[j,i,k,l] += A[m,i,n] * B[k,l,j,m,n]", {"A": (6, 139, 20), "B": (19, 8, 5, 6, 20)})
    target = replace(xeon_avx512(2), l2_bytes=128 << 10)
    # (A's columns, the smaller pack, as over the benchmark case's 2670 reduction steps: over these 120, i's lanes
    # 152 floats apart in C would keep B's columns)
    monkeypatch.setattr(contraction, "scattering_pack", lambda *args: False)
    panels = default_schedule(c, target, frozenset())
    monkeypatch.setattr(contraction, "rows_shared_under_panels", lambda *args: False)
    rows = default_schedule(c, target, frozenset())
    order = [p for p in panels if isinstance(p, Reorder)][-1].order
    assert order[0] == "i_o" and [p for p in panels if isinstance(p, Parallel)] == [Parallel("C", "j_k")], panels
    assert [p for p in rows if isinstance(p, Reorder)][-1].order[:3] == ("j", "k", "i_o"), rows
    _match_the_reference(c, (panels, rows), kernel_cache, seed=3)


def test_few_uneven_panels_count_columns_and_the_loops_inside_share_evenly():
    from superopt.schedule.contraction import few_uneven_panels, rows_shared_under_panels

    assert few_uneven_panels(3, 48, 139, 2)  # (96 columns and 43)
    assert few_uneven_panels(2, 48, 90, 2)  # (as many as the threads, but 48 columns and 42)
    assert not few_uneven_panels(2, 48, 95, 2)  # (48 and 47: within 5%)
    assert not few_uneven_panels(3, 48, 144, 2) and not few_uneven_panels(5, 48, 209, 2)  # (no partial; 2 a thread)
    assert rows_shared_under_panels([95], 2)  # (95 blocks: 48 and 47)
    assert rows_shared_under_panels([5, 19], 2)  # (5 alone is uneven, 5 x 19 is not)
    assert not rows_shared_under_panels([3], 2) and not rows_shared_under_panels([], 2)
