"""The loop order of a pack routine: where the source's contiguous run is short and the packed order would read
its lines again only after half the L2 has been filled since, the loops continuing that run move inside, and the
pack still writes exactly the packed layout (checked through the kernels that read it, against the reference)."""

from dataclasses import replace

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest import PackStep, build_loopnest
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import lower
from superopt.target import host_target
from superopt.testing.targets import xeon_avx512

# A's innermost axis (o, 10) is split 5 x 2 around the packed innermost axis (i, 40): a block of the transposed
# copy reads 2 source elements of each of 16 rows
SPLIT_RUN = ("C[k,l,j,i] += A[m,n,i,p,o,j] * B[n,l,p,o,m,k]", {"A": (2, 7, 40, 5, 6, 10), "B": (7, 9, 5, 6, 2, 10)})
# B's innermost axis (j, 137) is split into column panels of 32: the packed order reads each source row in 5 passes
SPLIT_PANELS = ("C[j,i] += A[n,i,o,m,k,l] * B[o,n,k,l,m,j]", {"A": (3, 21, 12, 7, 4, 3), "B": (12, 3, 4, 3, 7, 137)})


def _packs(text, shapes, l2_bytes):
    c = compile_op(text, shapes)
    target = replace(xeon_avx512(2), l2_bytes=l2_bytes)  # (the packs expected are this machine's)
    trace = default_schedule(c, target, frozenset())
    return c, trace, target, build_loopnest(lower(c, trace, target)).packs


def _matches_reference(c, trace, target, kernel_cache, atol=1e-4):
    args = [np.random.default_rng(0).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, trace)], kernel_cache, 2, replace(host_target(2), l2_bytes=target.l2_bytes))
    np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=atol)


def test_a_short_source_run_is_walked_whole_inside_each_block_of_the_packed_innermost_axis(kernel_cache):
    c, trace, target, packs = _packs(*SPLIT_RUN, l2_bytes=64 << 10)
    (pack,) = [p for p in packs if p.tensor == "A"]
    p, q = pack.transpose[:2]
    assert pack.order[-1] == PackStep(q, "blocks")
    inside = [st.var for st in pack.order[pack.order.index(PackStep(p, "blocks")) + 1:-1]]
    # the other part of the split axis (stride 2) and the axis next to it (stride 10) continue the run
    assert inside[-1] == "a0" and len(inside) >= 2, pack.order
    _matches_reference(c, trace, target, kernel_cache)


def test_a_short_source_run_keeps_the_packed_order_where_l2_holds_its_lines_between_uses(kernel_cache):
    c, trace, target, packs = _packs(*SPLIT_RUN, l2_bytes=1 << 30)
    (pack,) = [p for p in packs if p.tensor == "A"]
    p, q = pack.transpose[:2]
    assert pack.order[-2:] == (PackStep(q, "blocks"), PackStep(p, "blocks")), pack.order
    assert pack.order[0] == PackStep("a0")
    _matches_reference(c, trace, target, kernel_cache)


@pytest.mark.parametrize("l2_bytes, moved", [(64 << 10, True), (1 << 30, False)])
def test_column_panels_of_a_source_row_are_copied_in_one_pass_where_passes_would_reread_it(l2_bytes, moved,
                                                                                           kernel_cache):
    """The panels' loop (a0) goes next to the panel's columns (a6): each source row is read once, its five
    panels written in turn; with an L2 that holds the rows between passes the packed order stays."""
    c, trace, target, packs = _packs(*SPLIT_PANELS, l2_bytes=l2_bytes)
    (pack,) = [p for p in packs if p.tensor == "B"]
    assert pack.transpose is None and pack.layout.split_axis >= 0
    order = [st.var for st in pack.order]
    assert order == ([*(f"a{i}" for i in range(1, 6)), "a0", "a6"] if moved else [f"a{i}" for i in range(7)])
    _matches_reference(c, trace, target, kernel_cache)


def test_axes_next_to_each_other_in_both_layouts_are_packed_as_one_axis(kernel_cache, monkeypatch):
    """B[n,o,k,l,m] packed as [k/48][o][l][m][n][48]: l and m lie next to each other, in that order, in both, so
    the pack walks them as one axis of 43 x 3 and transposes it against the panel's columns in whole blocks of
    16 (m's 3 alone made every block a sliver copied element by element); without the merge, one loop each."""
    import superopt.loopnest.build_packs as build_packs

    text = "C[k,i,j] += A[o,l,m,i,n,j] * B[n,o,k,l,m]"
    shapes = {"A": (5, 43, 3, 3, 9, 27), "B": (9, 5, 92, 43, 3)}
    c, trace, target, packs = _packs(text, shapes, l2_bytes=2 << 20)
    (pack,) = [p for p in packs if p.tensor == "B"]
    assert pack.loops == (("a0", 2), ("a1", 5), ("a2", 129), ("a4", 9), ("a5", 48))
    assert pack.src_shape == (9, 5, 92, 129) and pack.transpose[:3] == ("a5", "a2", 16)
    _matches_reference(c, trace, target, kernel_cache, atol=1e-3)  # (sums of 5805 products, about 76 in size)
    monkeypatch.setattr(build_packs, "merge_shared_runs", lambda loops, src, shape: (loops, src, shape))
    (pack,) = [p for p in _packs(text, shapes, l2_bytes=2 << 20)[3] if p.tensor == "B"]
    assert len(pack.loops) == 6 and pack.transpose[1] == "a3"
