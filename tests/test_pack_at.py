"""Packing an operand a box at a time inside the kernel (``PackAt``): each thread copies the panel its loops read
into a buffer of its own, from the input as the caller passes it. Checked against the reference with boxes
outside, at and inside the parallel loop, with partial panels and reduction blocks, through a transposed copy, and
on more threads than the kernel was built for; the records it refuses name their cause; the default packs a
run-time column operand this way where its panel fits the L2, and a constant one ahead of time."""

from dataclasses import replace

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest import build_loopnest, outline
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import default_schedule
from superopt.schedule.kernel_plan import ScheduleError
from superopt.schedule.plan import lower
from superopt.schedule.primitives import (
    CacheWrite,
    Fuse,
    Pack,
    PackAt,
    Parallel,
    Reorder,
    Split,
    Unroll,
    Vectorize,
    trace_from_json,
    trace_to_json,
)
from superopt.target import host_target

# 70 columns in panels of 32 (the last one 6 wide), 29 reduction steps, 37 rows in tiles of 4
GEMM = ("C[i,j] += A[i,k] * B[k,j]", {"A": (37, 29), "B": (29, 70)})
# B read [j,k]: its packed panels [j_o][k][j_i] are a transposed copy (the source's innermost axis is k)
GEMM_BT = ("C[i,j] += A[i,k] * B[j,k]", {"A": (37, 29), "B": (70, 29)})


def _tiled(order, parallel, k_block=None):
    trace = [Split("C", "j", 32), Split("C", "i", 4)]
    if k_block:
        trace.append(Split("C", "k", k_block))
    return trace + [Reorder("C", order), CacheWrite("C", order[order.index("i_i") - 1]), Unroll("C", "i_i"),
                    Vectorize("C", "j_i"), Parallel("C", parallel)]


def _run(text, shapes, trace, target=None, threads=None, kernel_cache=None):
    c = compile_op(text, shapes)
    target = target or host_target(2)
    args = [np.random.default_rng(0).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, tuple(trace))], kernel_cache, 2, target)
    if threads:
        kernel.set_threads(threads)
    # (float32 sums of thousands of products: an absolute error in proportion to the largest sum)
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4 + 1e-5 * np.abs(ref).max())
    return kernel


PANEL = Pack("B", (0, 1), 1, 32)
PANEL_BT = Pack("B", (1, 0), 1, 32)
CASES = {
    # every thread packs each panel (the panel loop is outside the parallel rows)
    "panel outside the parallel loop": (GEMM, _tiled(("j_o", "i_o", "k", "i_i", "j_i"), "i_o"), PANEL, "j_o"),
    # each thread packs the panels of its own iterations
    "panel at the parallel loop": (GEMM, _tiled(("j_o", "i_o", "k", "i_i", "j_i"), "j_o"), PANEL, "j_o"),
    # a block of 8 reduction steps of a panel (the last block 5 steps: the rest of its box is zeros)
    "reduction block inside the parallel loop": (
        GEMM, _tiled(("j_o", "k_o", "i_o", "k_i", "i_i", "j_i"), "j_o", k_block=8), PANEL, "k_o"),
    "transposed panel": (GEMM_BT, _tiled(("j_o", "i_o", "k", "i_i", "j_i"), "i_o"), PANEL_BT, "j_o"),
    "transposed reduction block": (
        GEMM_BT, _tiled(("j_o", "k_o", "i_o", "k_i", "i_i", "j_i"), "j_o", k_block=8), PANEL_BT, "k_o"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_box_packed_inside_the_kernel_matches_the_reference(name, kernel_cache):
    (text, shapes), trace, pack, at = CASES[name]
    trace = [*trace, pack, PackAt("C", "B", at)]
    kernel = _run(text, shapes, trace, kernel_cache=kernel_cache)
    # the caller passes B as it is: nothing packs it before the call, and the kernel's workspace holds the boxes
    assert "B" not in kernel.source.packs and kernel.source.workspace
    assert "_packbox_B" in kernel.source.code


@pytest.mark.parametrize("parallel", ["l_k_o", "i_o"])
def test_a_panel_of_fused_columns_is_packed_inside_the_kernel(parallel, kernel_cache):
    """Columns l,k fused and split into panels of 32 (4 l x 8 k; the last of 2 l): the panel's packed axes are
    read through div/mod of the fused loop inside it, and its box spans them whole."""
    text, shapes = "C[i,l,k] += A[i,n] * B[l,n,k]", {"A": (37, 29), "B": (10, 29, 8)}
    order = ("l_k_o", "i_o", "n", "i_i", "l_k_i")
    trace = [Fuse("C", "l", "k"), Split("C", "l_k", 32), Split("C", "i", 4), Reorder("C", order),
             CacheWrite("C", "n"), Unroll("C", "i_i"), Vectorize("C", "l_k_i"), Parallel("C", parallel),
             Pack("B", (1, 0, 2), 1, 4), PackAt("C", "B", "l_k_o")]
    kernel = _run(text, shapes, trace, kernel_cache=kernel_cache)
    assert "B" not in kernel.source.packs and "_packbox_B" in kernel.source.code


def test_more_threads_than_the_kernel_was_built_for_share_its_boxes_safely(kernel_cache):
    """A box slot per thread the kernel was built for: started on more, its parallel loops run on that many."""
    (text, shapes), trace, pack, at = CASES["panel outside the parallel loop"]
    _run(text, shapes, [*trace, pack, PackAt("C", "B", at)], threads=4, kernel_cache=kernel_cache)


def test_the_box_pack_is_a_trace_record():
    (text, shapes), trace, pack, at = CASES["panel at the parallel loop"]
    trace = (*trace, pack, PackAt("C", "B", at))
    assert trace_from_json(trace_to_json(trace)) == trace


@pytest.mark.parametrize("record, target, why", [
    (PackAt("C", "A", "j_o"), None, "is not a packed kernel input"),
    (PackAt("C", "B", "j_i"), None, "vectorized or unrolled"),
    (PackAt("C", "B", "x"), None, "no loop 'x'"),
    (PackAt("C", "B", "j_o"), replace(host_target(2), kind="cuda"), "CPU thread"),
])
def test_a_box_that_cannot_be_packed_is_refused_with_its_reason(record, target, why):
    (text, shapes), trace, pack, _ = CASES["panel at the parallel loop"]
    c = compile_op(text, shapes)
    with pytest.raises(ScheduleError, match=why):
        lower(c, [*trace, pack, record], target or host_target(2))


def test_a_box_across_panels_is_refused():
    """Rows outside the panels: the box under the rows' loop spans every panel of the split axis."""
    (text, shapes) = GEMM
    c = compile_op(text, shapes)
    trace = [*_tiled(("i_o", "j_o", "k", "i_i", "j_i"), "i_o"), PANEL, PackAt("C", "B", "i_o")]
    with pytest.raises(ScheduleError, match="spans 3 panels"):
        lower(c, trace, host_target(2))


def test_a_box_of_an_input_another_stage_reads_is_refused():
    c = compile_op("T[i,j] += A[i,k] * B[k,j]; C[i,j] = T[i,j] + B[i,j]", {"A": (40, 40), "B": (40, 40)})
    trace = [Split("T", "j", 16), Reorder("T", ("j_o", "i", "k", "j_i")), Vectorize("T", "j_i"),
             Pack("B", (0, 1), 1, 16), PackAt("T", "B", "j_o")]
    with pytest.raises(ScheduleError, match="another stage reads 'B'"):
        lower(c, trace, host_target(2))


# a column operand of 8 reduction axes' worth of panels: 256 columns in panels of 64 over 130 x 64 steps
KIL = ("C[i,j] += A[k,i,l] * B[l,k,j]", {"A": (64, 250, 130), "B": (130, 64, 250)})


def test_the_default_packs_a_run_time_column_operand_a_panel_at_a_time_where_it_fits_the_l2(kernel_cache):
    text, shapes = KIL
    c = compile_op(text, shapes)
    target = host_target(2)
    trace = default_schedule(c, target, frozenset())
    (record,) = [p for p in trace if isinstance(p, PackAt)]
    plan = lower(c, trace, target)
    nest = build_loopnest(plan)
    (box,) = nest.box_packs
    assert box.tensor == record.tensor and record.tensor not in nest.layouts
    size = np.prod([n for _, n in box.loops]) * 4
    assert size <= target.l2_bytes / 2
    _run(text, shapes, trace, kernel_cache=kernel_cache)
    # a constant operand is packed once, ahead of time; a box that no loop keeps within half the L2 is not packed
    assert not any(isinstance(p, PackAt) for p in default_schedule(c, target, frozenset(c.inputs)))
    small = replace(target, l2_bytes=size // 2)
    assert not any(isinstance(p, PackAt) for p in default_schedule(c, small, frozenset()))


def test_the_default_packs_no_boxes_that_take_part_of_each_source_line_the_l2_cannot_keep():
    """B's innermost axis (l, 25) is a loop outside the tiles: a box under it holds one l of each source line of
    16, over more lines than the L2 keeps, and the 25 boxes would read every line again from memory. The whole
    operand is packed before the call instead."""
    c = compile_op("C[i,l,k,j] += A[i,j,m] * B[k,m,l]", {"A": (49, 5, 3210), "B": (93, 3210, 25)})
    trace = default_schedule(c, host_target(2), frozenset())
    assert any(isinstance(p, Pack) and p.stage == "B" for p in trace)
    assert not any(isinstance(p, PackAt) for p in trace), trace


def test_panels_of_fused_columns_are_the_searchs_to_pack_inside_not_the_defaults():
    """Columns l,k fused, their panels packed inside the kernel where the panel loop is alone outermost: the knob
    offers it, the default packs the whole operand before the call (as often slower as faster on random
    contractions), and the search's pick is a PackAt record at the panel loop."""
    from superopt.schedule.space import Point, ScheduleSpace

    c = compile_op("C[l,i,j,k] += A[j,n,m,i] * B[l,n,k,m]", {"A": (10, 66, 38, 18), "B": (88, 66, 8, 38)})
    space = ScheduleSpace(c, host_target(2), frozenset())
    p0 = space.default_point()
    outer = Point.of(p0.sketch, {**p0.knob_map, "C.par_pos": 1})
    trace, used, domains = space.resolve(outer)
    assert domains["C.pack_at"] == (False, True) and used["C.pack_at"] is False
    assert not any(isinstance(p, PackAt) for p in trace)
    trace = space.trace(Point.of(p0.sketch, {**outer.knob_map, "C.pack_at": True}))
    (record,) = [p for p in trace if isinstance(p, PackAt)]
    assert record.tensor == "B" and "_" in record.at and lower(c, trace, host_target(2)).stages["C"].pack_at


def test_the_outline_shows_where_each_thread_packs_its_box():
    (text, shapes), trace, pack, at = CASES["panel outside the parallel loop"]
    c = compile_op(text, shapes)
    text = outline(build_loopnest(lower(c, [*trace, pack, PackAt("C", "B", at)], host_target(2))))
    assert "every thread packs box of B" in text and "box pack B -> [1, 29, 32]" in text, text
    assert "let so_box_B = this thread's 928 elements of so_boxes_B" in text
