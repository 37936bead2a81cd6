"""Layout moves of the contraction schedule: the column operand packed into the order the micro-kernel reads
it (a reshape folded into its read included), the reductions ordered by the row operand's contiguity, and
the capsule votes model with its weight as a run-time input keeping that schedule end to end."""

import math
import random

import numpy as np
import pytest

from superopt.interp import evaluate_compute
from superopt.ir.expr import product_accesses
from superopt.lang import compile_op
from superopt.runtime.kernel import build_kernels
from superopt.schedule.contraction import pack_roles, reduction_walk
from superopt.schedule.default import default_schedule
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Pack, Reorder, Split, Vectorize
from superopt.schedule.space import ScheduleSpace, check
from superopt.target import host_target
from superopt.testing.targets import avx2, xeon_avx512

# capsule votes' conv as the ONNX import leaves it: a channels-last image under a stride-2 window, the OHWI
# weight's output channel read as 16*ob+ol (the blocked output's two dims): the vector loop (ob, ol fused)
# reads the unpacked weight 9*C apart
BLOCKED = "out0[n,ob,y,x,ol] += in0[n,2*y+kh,2*x+kw,c] * in1[4*ob+ol,kh,kw,c]"
BLOCKED_SHAPES = {"in0": (2, 9, 9, 16), "in1": (32, 3, 3, 16)}
BLOCKED_EXTENTS = {"ob": 8, "ol": 4, "y": 4, "x": 4}
# indices permuted between the operands (chemistry-style einsum)
PERMUTED = "C[i,j] += A[k,i,l] * B[l,k,j]"
CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
TARGET = xeon_avx512(2)  # the schedules expected here are this machine's; the kernels run on the host


def _blocked():
    return compile_op(BLOCKED, BLOCKED_SHAPES, extents=BLOCKED_EXTENTS)


def _check_against_reference(c, traces, kernel_cache, seed=0, target=None):
    """Each trace compiled for ``target`` (None: the host) against the float64 reference."""
    target = target or host_target(2)
    if any(type(p).__name__ == "TransposeBlock" for t in traces for p in t) \
            and target.lanes("float32") < TARGET.lanes("float32"):
        pytest.skip("the schedule's register transposes are of 16 lanes, which this host's vectors do not hold")
    args = [np.random.default_rng(seed).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, 2, target)):
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def _rows_as_planned(monkeypatch):
    """Keep the planned tile's rows: the tests of rules written for rows l of ``B[l,m,k]`` (k, B's unit stride, an
    outer loop), which ``whole_row_tile`` would run along k's 9 rows instead."""
    import superopt.schedule.contraction as contraction

    monkeypatch.setattr(contraction, "whole_row_tile", lambda *args: 0)


def _contraction_loops(trace, stage):
    """The loop order of the last Reorder of ``stage`` (the tile's final order) and its vector loop."""
    order = [p for p in trace if isinstance(p, Reorder) and p.stage == stage][-1].order
    vec = next(p.loop for p in trace if isinstance(p, Vectorize) and p.stage == stage)
    return list(order), vec


def test_a_run_time_weight_read_through_a_reshape_is_packed_in_the_order_the_tile_reads_it(kernel_cache):
    """The default packs the run-time weight (no constant to prepack): its column axis last, split by the tile
    width, the reductions in the loop order; the innermost reduction is the image's contiguous channel axis.
    Without the pack the vector loop reads the weight with a stride of a whole row (9 * C)."""
    c = _blocked()
    trace = default_schedule(c, TARGET, frozenset())
    pack = next(p for p in trace if isinstance(p, Pack))
    assert pack.stage == "in1" and pack.perm[-1] == 0  # the output-channel axis innermost in the panel
    order, vec = _contraction_loops(trace, "out0")
    red = [lp for lp in order if lp.split("_")[0] in ("kh", "kw", "c")]
    assert red[-1] == "c" and vec.startswith("ob_ol")
    assert pack.perm[:-1] == tuple(1 + ["kh", "kw", "c"].index(r) for r in red)  # panel rows in loop order
    no_pack = [p for p in trace if not isinstance(p, Pack)]
    lower(c, no_pack, TARGET)  # (legal unpacked too: the pack is a layout choice, not a requirement)
    _check_against_reference(c, [trace, no_pack], kernel_cache)


def test_pack_roles_group_each_axis_and_refuse_a_mixed_one():
    c = _blocked()
    st = c.statements[0]
    a, b = product_accesses(st.expr)
    assert pack_roles(b, ["ob", "ol"], ["kh", "kw", "c"], st) == ([], [1, 2, 3], [0])
    assert pack_roles(b, ["ob", "ol"], ["c", "kh", "kw"], st) == ([], [3, 1, 2], [0])
    assert pack_roles(a, ["x"], ["kh", "kw", "c"], st) is None  # 2*x+kw mixes a column and a reduction
    # a column axis that is not the flattening of the column loop (ol outer) cannot be one contiguous run
    assert pack_roles(b, ["ol", "ob"], ["kh", "kw", "c"], st) is None
    assert reduction_walk(a, ["c", "kh", "kw"], c.type_of) == ["kh", "kw", "c"]


def test_permuted_indices_vectorize_the_contiguous_output_dim_and_pack_in_loop_order(kernel_cache):
    """C[i,j] += A[k,i,l] * B[l,k,j]: the vector loop is j (contiguous in C and in B); the reductions walk A
    with l innermost (its stride 1), and B's panel is packed [k, l, j] to match, where its own order is [l, k]."""
    c = compile_op(PERMUTED, {"A": (24, 40, 40), "B": (40, 24, 96)})
    trace = default_schedule(c, TARGET, frozenset())
    order, vec = _contraction_loops(trace, "C")
    assert vec.startswith("j")
    red = [lp for lp in order if lp.split("_")[0] in ("k", "l")]
    assert red[-1].startswith("l")
    pack = next(p for p in trace if isinstance(p, Pack))
    assert pack.stage == "B" and pack.perm == (1, 0, 2)
    _check_against_reference(c, [trace], kernel_cache, seed=1)


def test_a_pack_that_is_not_a_layout_of_the_input_is_rejected_with_a_reason():
    c = _blocked()
    base = default_schedule(c, TARGET, frozenset())
    unpacked = [p for p in base if not isinstance(p, Pack)]
    for bad, why in [(Pack("in1", (0, 1, 2)), "not a permutation"), (Pack("out0", (0, 1, 2, 3, 4)), "kernel inputs"),
                     (Pack("in1", (1, 2, 3, 0), 7, 4), "split axis")]:
        with pytest.raises(ScheduleError, match=why):
            check(c, [*unpacked, bad], TARGET)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_points_of_the_blocked_conv_match_the_reference(seed, kernel_cache):
    """Points of the space (pack on or off, any reduction order, tile sizes) are rejected with ScheduleError or
    compute what the reference computes."""
    c = _blocked()
    space = ScheduleSpace(c, TARGET, frozenset())
    rng = random.Random(seed)
    traces = []
    for _ in range(50):
        if len(traces) == 4:
            break
        try:
            traces.append(space.trace(space.sample(rng)))
        except ScheduleError:
            continue
    assert len(traces) == 4
    _check_against_reference(c, traces, kernel_cache, seed=seed)


def test_capsule_votes_from_onnx_with_the_weight_as_input_keep_the_packed_schedule():
    """The exported model (weight a graph input, not an initializer) at a small size: the reshapes and
    transposes around the conv fold into its index maps and its write-back, so the program is one contraction
    kernel writing the model's output; it packs the run-time weight, vectorizes the output's contiguous dim and
    streams the image's channels innermost; the program matches onnxruntime."""
    import onnx
    import onnxruntime as ort
    import torch

    from benchmarks.workloads import _conv_weight, capsule_weight_input_onnx
    from superopt.api import OptimizeConfig, optimize

    g = torch.Generator().manual_seed(0)
    P = torch.randn(2, 9, 9, 8, 4, 4, generator=g)
    W = torch.randn(3, 3, 8, 8, 4, 4, generator=g) * 0.1
    data = capsule_weight_input_onnx(P, W)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert len(names) == 2 and not any(i.name in names for i in onnx.load_from_string(data).graph.initializer)
    Wo = _conv_weight(W).permute(0, 2, 3, 1).contiguous().numpy()  # OHWI, as the model takes it
    feed = {names[0]: P.numpy(), names[1]: Wo}
    prog = optimize(data, OptimizeConfig(threads=2, cost_model=None))
    got = prog(P.numpy(), Wo)[0]
    want = sess.run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    kernels = [n for n in prog.graph.nodes if not n.is_extern]
    assert len(kernels) == 1 and len(prog.graph.nodes) == 1, prog.graph.text()  # no copy kernel, no reshape
    conv = kernels[0]
    assert conv.outputs == tuple(prog.graph.outputs) and set(conv.inputs) == set(prog.graph.inputs)
    trace = prog.executor.traces[conv.name]
    weight = next(local for local, gname in zip(conv.op.inputs, conv.inputs) if gname == prog.graph.inputs[1])
    packs = [p for p in trace if isinstance(p, Pack)]
    assert [p.stage for p in packs] == [weight], trace
    st = conv.op.statements[-1]
    image = next(a for a in product_accesses(st.expr) if a.tensor != weight)
    order, vec = _contraction_loops(trace, st.out)
    assert st.out_dims[-1] in vec.split("_"), (vec, st)  # the output's stride-1 dim is in the vector loop
    red = [lp for lp in order if lp in st.reduce_dims or lp.rsplit("_", 1)[0] in st.reduce_dims]
    assert red[-1] == reduction_walk(image, list(st.reduce_dims), conv.op.type_of)[-1]


def test_several_column_axes_are_packed_as_contiguous_panels_where_a_tile_reads_a_small_share(kernel_cache):
    """C[i,j,k,l] += A[i,m,k,n] * B[j,n,l,m]: the vector columns are j and l fused; B is packed with the outer
    column axis split by the tile so each tile's columns are one contiguous panel over (m, n). Capsule votes'
    128 columns in 48-wide tiles keep one row of all columns per step (a third of it per tile)."""
    c = compile_op("C[i,j,k,l] += A[i,m,k,n] * B[j,n,l,m]", {"A": (6, 8, 5, 16), "B": (16, 16, 16, 8)})
    target = TARGET
    trace = default_schedule(c, target, frozenset())
    _, vec = _contraction_loops(trace, "C")
    pack = next(p for p in trace if isinstance(p, Pack))
    width = next(p.factor for p in trace if isinstance(p, Split) and p.loop == vec.removesuffix("_i"))
    assert vec == "j_l_i" and pack.perm == (3, 1, 0, 2)  # [m, n, j, l]: reductions in loop order, then j, l
    assert pack.split_axis == 2 and pack.factor * 16 == width  # j split: [j_o][m][n][j_i][l]
    unsplit = [Pack("B", pack.perm) if p is pack else p for p in trace]
    _check_against_reference(c, [trace, unsplit], kernel_cache, seed=2)
    caps = compile_op(CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)})
    caps_pack = next(p for p in default_schedule(caps, target) if isinstance(p, Pack))
    assert caps_pack.split_axis == -1


def test_a_short_row_loop_is_one_tile_of_two_vectors_on_a_32_register_target(kernel_cache):
    """7 output columns under the 4-vector tile (at most 6 rows) would leave a 3-row tail: the default takes
    all 7 rows x 2 vectors instead (on 32 vector registers); 8 rows divide into 4s and keep the wide tile."""
    from superopt.target import avx512_target

    for x, whole in [(7, True), (8, False)]:
        shapes = {"in0": (2, 15, 2 * x + 1, 16), "in1": (128, 3, 3, 16)}
        c = compile_op(BLOCKED, shapes, extents={"ob": 32, "ol": 4, "y": 7, "x": x})
        trace = default_schedule(c, avx512_target(2), frozenset())
        splits = {p.loop: p.factor for p in trace if isinstance(p, Split)}
        if whole:
            assert "x" not in splits and splits["ob_ol"] == 32, trace
        else:
            assert splits["x"] == 4 and splits["ob_ol"] == 64, trace
    c7 = compile_op(BLOCKED, {"in0": (2, 15, 15, 16), "in1": (128, 3, 3, 16)}, extents={"ob": 32, "ol": 4, "y": 7, "x": 7})
    _check_against_reference(c7, [default_schedule(c7, TARGET, frozenset())], kernel_cache)


@pytest.mark.parametrize("steps", [24 * 48, 4 * 48])
def test_both_operands_transposed_the_smaller_one_is_the_packed_column_operand(steps, kernel_cache):
    """C[i,j] += A[k,i,l] * B[j,k,l]: neither operand holds its own output dim innermost, so the column operand
    is packed by a transpose on every call. j (192 columns, from B) fills the vectors a little better than i
    (90, from A), but A is under half B's size: over 1152 reduction steps its columns, and its cheaper pack, are
    the default's. Over 192 steps the tile is written back often enough that i's lanes, 192 floats apart in C,
    would scatter it: j's (C's unit stride) are kept, and B is packed."""
    k = steps // 48
    c = compile_op("C[i,j] += A[k,i,l] * B[j,k,l]", {"A": (k, 90, 48), "B": (192, k, 48)})
    trace = default_schedule(c, TARGET, frozenset())
    packs = [p for p in trace if isinstance(p, Pack)]
    kept = steps <= 1024
    assert [p.stage for p in packs] == (["B"] if kept else ["A"]), trace
    assert any(isinstance(p, Vectorize) and p.loop.startswith("j" if kept else "i") for p in trace), trace
    _check_against_reference(c, [trace], kernel_cache)


def test_a_scattering_pack_is_judged_by_the_lanes_in_the_output():
    from superopt.schedule.contraction import scattering_pack

    assert scattering_pack(4, 768, 192) and scattering_pack(64, 96, 1024)
    assert not scattering_pack(4, 768, 1152)  # (a long reduction: the write-back is rare)
    assert not scattering_pack(4, 64, 192)  # (the smaller operand's lanes within a line)
    assert not scattering_pack(96, 768, 192)  # (the chosen columns scatter too)


def test_a_pair_of_columns_that_is_a_strided_run_keeps_the_packed_tile(kernel_cache):
    """A[j,i,m,l]'s (j, i) is one run of the fused loop's flat offsets but 7*12 apart per column: the columns are
    not read with unit stride, so they are no linear loop split by any width (that would rule the pack out and
    fail to lower, leaving the default without a register tile); the default keeps a packed register tile."""
    from superopt.schedule.primitives import CacheWrite

    c = compile_op("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", {"A": (7, 146, 12, 7), "B": (200, 12, 7)})
    trace = default_schedule(c, TARGET, frozenset())
    assert any(isinstance(p, CacheWrite) for p in trace) and any(isinstance(p, Pack) for p in trace), trace
    _check_against_reference(c, [trace], kernel_cache)


def test_a_row_operand_read_a_line_per_reduction_step_is_packed_in_the_order_the_tile_reads_it(kernel_cache,
                                                                                              monkeypatch):
    """A[j,n,m,i]: rows j, reductions n, m read at stride 18 (a cache line per step), re-read by five column
    panels: the default packs it [i][j][n][m]; the knob turns that off, and both match the reference. (Rows j
    pinned: the long row repick takes i, A's unit stride, on this shape.)"""
    import superopt.schedule.contraction as contraction
    from superopt.schedule.default import build_sketch, sketch_names
    from superopt.schedule.knobs import KnobRecorder

    monkeypatch.setattr(contraction, "LONG_ROWS_REPICKED", False)
    c = compile_op("C[l,i,j,k] += A[j,n,m,i] * B[l,n,k,m]", {"A": (10, 20, 12, 18), "B": (40, 20, 8, 12)})
    target = TARGET
    trace = default_schedule(c, target, frozenset())
    row_packs = [p for p in trace if isinstance(p, Pack) and p.stage == "A"]
    assert row_packs == [Pack("A", (3, 0, 1, 2))], trace
    sketch = next(s for s in sketch_names(c, target) if s.startswith("stages"))
    off = build_sketch(c, target, frozenset(), sketch, KnobRecorder({"C.pack_rows": False}))
    assert not any(isinstance(p, Pack) and p.stage == "A" for p in off), off
    _check_against_reference(c, [trace, off], kernel_cache)


def test_a_row_operand_read_along_its_rows_or_through_a_window_is_not_packed():
    from superopt.schedule.contraction import row_pack_perm

    gemm = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (64, 96), "B": (96, 80)})
    st = gemm.statements[-1]
    a = next(x for x in product_accesses(st.expr) if x.tensor == "A")
    assert row_pack_perm(a, "i", ["k"], ["j"], st) is None  # (already [rows][reduction])
    conv = _blocked()
    st = conv.statements[-1]
    image = next(x for x in product_accesses(st.expr) if x.tensor == "in0")
    assert row_pack_perm(image, "x", list(st.reduce_dims), ["n", "y"], st) is None


def test_the_parallel_loop_fuses_another_where_the_threads_would_share_it_unevenly(kernel_cache, monkeypatch):
    """C[l,k,j,i] += A[m,i,j] * B[l,m,k]: the outermost loop (k, 9 iterations) alone gives 2 threads 5 and 4;
    fused with the row blocks of l (9 x 52) they share it within 1%. (l is long enough that the rows are the
    bigger operand under each k, which keeps the column panels inside the row loop.)"""
    from superopt.schedule.primitives import Fuse, Parallel

    _rows_as_planned(monkeypatch)
    c = compile_op("C[l,k,j,i] += A[m,i,j] * B[l,m,k]", {"A": (300, 6, 28), "B": (208, 300, 9)})
    trace = default_schedule(c, TARGET, frozenset())
    par = next(p.loop for p in trace if isinstance(p, Parallel))
    fused = {f"{p.outer}_{p.inner}": (p.outer, p.inner) for p in trace if isinstance(p, Fuse)}
    assert par in fused and fused[par][0] == "k", trace
    _check_against_reference(c, [trace], kernel_cache)


def test_a_parallel_loop_shared_unevenly_goes_inside_the_panel_loop_that_blocked_its_fusion(kernel_cache,
                                                                                             monkeypatch):
    """rand2024_2's shape, smaller: C[l,k,j,i] += A[m,i,j] * B[l,m,k], k (9 iterations) outermost gives 2 threads 5
    and 4, and the column panels after it (168 columns as 96 + 72, a tail) cannot fuse with it. The panel loop goes
    outside, and k fuses with the row blocks of l (9 x 13, shared within 1%); the search can keep it outermost."""
    from superopt.schedule.primitives import Fuse, Parallel, Reorder
    from superopt.schedule.space import Point, ScheduleSpace

    _rows_as_planned(monkeypatch)
    c = compile_op("C[l,k,j,i] += A[m,i,j] * B[l,m,k]", {"A": (300, 6, 28), "B": (52, 300, 9)})
    trace = default_schedule(c, TARGET, frozenset())
    order = [p for p in trace if isinstance(p, Reorder)][-1].order
    assert order[:3] == ("j_i_o", "k", "l_o"), order
    assert Fuse("C", "k", "l_o") in trace and Parallel("C", "k_l_o") in trace
    space = ScheduleSpace(c, TARGET, frozenset())
    default = space.default_point()
    outermost = space.trace(Point.of(default.sketch, {**default.knob_map, "C.par_inside": False}))
    assert [p for p in outermost if isinstance(p, Reorder)][-1].order[:2] == ("k", "j_i_o")
    assert Parallel("C", "k") in outermost
    _check_against_reference(c, [trace, outermost], kernel_cache)


def test_the_column_tile_width_fills_the_last_panels_lanes(kernel_cache):
    """329 columns: 7 tiles of 48 use 98% of the lanes, 6 of 64 only 86% (the last panel is zero-filled to a
    whole tile); 320 columns keep the 4-vector tile (5 x 64, all full)."""
    from superopt.schedule.contraction_columns import lane_score

    assert lane_score(329, 48, 1, 16) == pytest.approx(329 / 336) and lane_score(329, 64, 1, 16) == pytest.approx(329 / 384)
    widths = {}
    for j in (329, 320):
        c = compile_op("C[i,j] += A[l,i,k] * B[l,k,j]", {"A": (6, 120, 40), "B": (6, 40, j)})
        trace = default_schedule(c, TARGET, frozenset())
        widths[j] = next(p.factor for p in trace if isinstance(p, Split) and p.loop == "j")
        if j == 329:
            _check_against_reference(c, [trace], kernel_cache)
    assert widths == {329: 48, 320: 64}


def test_fused_columns_take_the_tile_width_that_fills_their_lanes(kernel_cache):
    """The benchmark case rand2024_1. k, l fused (132 x 4 = 528 columns): 11 tiles of 48 fill every lane (48 is
    a multiple of l's 4), 9 of 64 only 92% of them."""
    c = compile_op("C[m,i,j,k,l] += A[j,n,i] * B[k,n,l,m]", {"A": (3, 217, 705), "B": (132, 217, 4, 5)})
    trace = default_schedule(c, TARGET, frozenset())
    assert any(isinstance(p, Split) and p.loop == "k_l" and p.factor == 48 for p in trace), trace
    _check_against_reference(c, [trace], kernel_cache)


def test_the_column_panels_go_outside_the_row_blocks_where_they_are_the_bigger_operand_of_each_batch(kernel_cache):
    """A weight under a batch loop of row blocks (a linear layer over 16 sequences, as a transformer's feed-forward
    block): the rows are the bigger operand overall, so the panels are not outermost, but under each batch the
    weight is the bigger one and panels innermost would read all of it again for every block of rows. The
    panels go just outside the row loop; where each batch's rows are the bigger operand, they stay innermost."""
    orders = {}
    for name, shapes in {"weight bigger": {"A": (16, 24, 512), "W": (512, 192)},
                         "rows bigger": {"A": (16, 192, 512), "W": (512, 24)}}.items():
        c = compile_op("C[b,m,n] += A[b,m,k] * W[k,n]", shapes)
        trace = default_schedule(c, TARGET, frozenset())
        order, _ = _contraction_loops(trace, "C")
        orders[name] = [x for x in order if x in ("b", "m_o", "n_o")]
        if name == "weight bigger":
            _check_against_reference(c, [trace], kernel_cache)
    assert orders["weight bigger"] == ["b", "n_o", "m_o"], orders
    assert orders["rows bigger"][-1] == "n_o", orders


def test_the_column_panels_go_outermost_where_rows_outermost_would_reread_far_more(kernel_cache):
    """The column operand B is the smaller one, but past the L2 cache: rows outermost read all of it once per
    block of rows (67 blocks), panels outermost read A once per panel (5). The panels go outermost where
    that re-reads far less; where B fits the cache its re-reads are hits and the rows stay outermost."""
    from dataclasses import replace

    c = compile_op("C[i,j] += A[l,i,k] * B[l,k,j]", {"A": (4, 400, 64), "B": (4, 64, 300)})  # A 400 KB, B 300 KB
    orders = {}
    for name, l2 in {"B past the cache": 64 << 10, "B in the cache": 1 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        order, _ = _contraction_loops(trace, "C")
        orders[name] = [x for x in order if x in ("i_o", "j_o")]
        _check_against_reference(c, [trace], kernel_cache)
    assert orders == {"B past the cache": ["j_o", "i_o"], "B in the cache": ["i_o", "j_o"]}, orders


def test_a_column_panel_past_half_of_l2_is_cut_along_the_reduction_with_its_loop_outside_the_row_blocks(kernel_cache):
    """A panel of 64 columns over 64 x 20 reduction steps (320 KB): past half of a 256 KB L2 it is read from the
    next cache again for every block of rows, so the default blocks the first reduction (16 of k's 64 steps, an
    80 KB slice) and puts that loop between the panels and the rows; in a 1 MB L2 the panel stays whole."""
    from dataclasses import replace

    c = compile_op(PERMUTED, {"A": (64, 60, 20), "B": (20, 64, 200)})
    loops = {}
    for name, l2 in {"small L2": 256 << 10, "large L2": 1 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        order, _ = _contraction_loops(trace, "C")
        loops[name] = [x for x in order if x in ("j_o", "k_o", "i_o")]
        _check_against_reference(c, [trace], kernel_cache)
    assert loops == {"small L2": ["j_o", "k_o", "i_o"], "large L2": ["j_o", "i_o"]}, loops


@pytest.mark.parametrize("columns, panels_outermost", [(95, True), (56, False)])
def test_two_panels_stay_outermost_only_where_the_threads_share_their_columns_evenly(kernel_cache, columns,
                                                                                     panels_outermost):
    """The column operand is the bigger one, so its panels go outermost and the threads split them: 95 columns as
    48 + 47 share evenly between two threads; 56 as 48 + 8 would leave one thread most of the work, so there the
    rows go outermost."""
    c = compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (16, 512), "B": (512, columns)})
    trace = default_schedule(c, TARGET, frozenset())
    order, _ = _contraction_loops(trace, "C")
    loops = [x for x in order if x in ("i_o", "j_o")]
    assert loops == (["j_o", "i_o"] if panels_outermost else ["i_o", "j_o"]), (columns, trace)
    _check_against_reference(c, [trace], kernel_cache)



def test_uneven_panels_share_the_next_loops_fused_where_those_even_the_threads_out(kernel_cache):
    """209 columns in panels of 48: 5 panels, 3 and 2 on two threads, and the last one a tail that cannot fuse with
    the loops inside it. The next loop, k, has 9 iterations (5 and 4); fused with m's 19 they share within 1%. So the
    panels run one after the other, the threads sharing each one's k x m; with the parallel loop kept at the panels
    (knob ``par_pos`` 0) they stay the parallel loop."""
    from superopt.schedule.default import build_sketch
    from superopt.schedule.knobs import KnobRecorder
    from superopt.schedule.primitives import Fuse, Parallel

    c = compile_op("C[i,k,m,j,l] += A[j,k,n,o,i] * B[l,o,n,m]", {"A": (2, 9, 6, 6, 7), "B": (209, 6, 6, 19)})
    target = TARGET
    sketch = "stages+epilogue"
    trace = build_sketch(c, target, frozenset(), sketch, KnobRecorder({"C.out_layout": False}))
    order, vec = _contraction_loops(trace, "C")
    assert vec == "l_i" and order[:3] == ["l_o", "k", "m"], trace
    assert Fuse("C", "k", "m") in trace and Parallel("C", "k_m") in trace, trace
    kept = build_sketch(c, target, frozenset(), sketch, KnobRecorder({"C.out_layout": False, "C.par_pos": 0}))
    assert [p for p in kept if isinstance(p, Parallel)] == [Parallel("C", "l_o")], kept
    _check_against_reference(c, [trace, kept], kernel_cache)

def test_a_column_operand_past_half_of_l2_takes_the_panels_outermost_constant_or_not(kernel_cache):
    """B between half of L2 and all of it: the streaming rows' operand evicts it, so the re-read rule counts it as
    past the cache, a constant weight (packed once) at the usual gain and a run-time operand where its re-reads are
    ``FAR_REREAD_GAIN`` times the other's (50 row blocks over B against 7 panels over A). In an L2 over twice B's
    size the rows stay outermost."""
    from dataclasses import replace

    c = compile_op("C[i,j] += A[l,i,k] * B[l,k,j]", {"A": (4, 400, 64), "B": (4, 64, 300)})  # A 400 KB, B 300 KB
    orders = {}
    for l2 in (512 << 10, 1 << 20):
        for name, consts in {"constant B": frozenset({"B"}), "run-time B": frozenset()}.items():
            trace = default_schedule(c, replace(TARGET, l2_bytes=l2), consts)
            order, _ = _contraction_loops(trace, "C")
            orders[name, l2 >> 10] = [x for x in order if x in ("i_o", "j_o")]
            _check_against_reference(c, [trace], kernel_cache)
    assert orders == {("constant B", 512): ["j_o", "i_o"], ("run-time B", 512): ["j_o", "i_o"],
                      ("constant B", 1024): ["i_o", "j_o"], ("run-time B", 1024): ["i_o", "j_o"]}, orders


def test_a_column_operand_filling_most_of_l2_goes_outermost_where_rows_outermost_reread_it_far_more(kernel_cache):
    """B (90 KB) fits a 128 KB L2 but fills more than half of it, and rows outermost would read it once per each
    of 146 row blocks against A (458 KB) once per each of 5 panels: the rows streaming past evict it, so its
    panels go outermost. In a 256 KB L2, where B fills less than half, the rows stay outermost."""
    from dataclasses import replace

    c = compile_op("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", {"A": (7, 146, 16, 7), "B": (200, 16, 7)})
    orders = {}
    for name, l2 in {"B most of L2": 128 << 10, "B under half of L2": 256 << 10}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        order, _ = _contraction_loops(trace, "C")
        orders[name] = [x for x in order if x in ("j", "k_o")]  # (rows i, the output's unit stride: j the outer)
        _check_against_reference(c, [trace], kernel_cache)
    assert orders == {"B most of L2": ["k_o", "j"], "B under half of L2": ["j", "k_o"]}, orders


def test_a_row_operand_past_l2_whose_unit_stride_dim_is_an_outer_loop_is_packed(kernel_cache, monkeypatch):
    """B[l,m,k] as the rows' operand (rows l, reduction m) with k, its unit-stride dim, an outer loop: each k
    reads one element of every 9 in a line, so past a 256 KB L2 each line of B (345 KB) comes from memory once
    per k and per column panel. The default packs B into [k][l][m] (read once, written once); where B fits a
    1 MB L2 its lines stay cached between the k and it is read in place."""
    from dataclasses import replace

    _rows_as_planned(monkeypatch)
    c = compile_op("C[l,k,j,i] += A[m,i,j] * B[l,m,k]", {"A": (600, 6, 28), "B": (16, 600, 9)})
    packed = {}
    for name, l2 in {"B past L2": 256 << 10, "B in L2": 1 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        packed[name] = [p.perm for p in trace if isinstance(p, Pack) and p.stage == "B"]
        _check_against_reference(c, [trace], kernel_cache)
    assert packed == {"B past L2": [(2, 0, 1)], "B in L2": []}, packed


def test_a_row_operand_read_again_per_outer_loop_counts_the_whole_column_panel_read_between(monkeypatch):
    """The benchmark case rand31_20: C[l,i,j,k] += A[o,n,i,m] * B[l,j,m,o,n,k], rows l from the 4 MB B, columns
    i from A in panels of 48, and k, B's unit-stride dim, an outer loop. Between two k the tile reads B's slice
    for one j (850 KB) and one panel of A (48 columns x 3364 steps, 650 KB): past half of a 2 MB L2, so B's lines
    are gone by the next k and come from memory 9 times; the default packs B. Counted as one column of A (13 KB),
    the slice seemed to stay cached and B stayed unpacked (1.23x slower on 2 cores of an Intel Xeon)."""
    from dataclasses import replace

    import superopt.schedule.contraction as contraction

    _rows_as_planned(monkeypatch)
    c = compile_op("C[l,i,j,k] += A[o,n,i,m] * B[l,j,m,o,n,k]", {"A": (29, 29, 364, 4), "B": (7, 19, 4, 29, 29, 9)})
    target = replace(TARGET, l2_bytes=2 << 20)

    def b_packs():
        trace = default_schedule(c, target, frozenset())
        assert Split("C", "i", 48) in trace and Vectorize("C", "i_i") in trace, trace
        return [p.perm for p in trace if isinstance(p, Pack) and p.stage == "B"]

    assert b_packs() == [(1, 5, 0, 2, 3, 4)]
    monkeypatch.setattr(contraction, "refetch_blocks", lambda n_dims, panels, row, row_blocks: {})
    assert b_packs() == []


@pytest.mark.parametrize("text,shapes,rows", [
    # the column operand A reads the innermost row dim i: rows l of B instead (each column vector feeds 6 FMAs)
    ("C[l,i,k,j] += A[i,m,n,k,j] * B[n,m,l]", {"A": (11, 9, 11, 13, 32), "B": (11, 9, 3201)}, ("l", "i")),
    # j's 5 rows, short, where i runs along A's unit stride and the lanes (l, 5 floats apart) share lines
    ("C[i,k,l,j] += A[m,j,k,i] * B[l,m]", {"A": (600, 5, 3, 65), "B": (856, 600)}, ("i", "j")),
    # k's 7 rows kept: the lanes (i, 49 floats apart) would each write a line of their own under rows j
    ("C[j,i,l,k] += A[m,i] * B[m,k,l,j]", {"A": (975, 672), "B": (975, 7, 7, 39)}, ("k", "k")),
])
def test_the_rows_are_chosen_again_where_the_innermost_row_dim_is_read_by_the_columns_or_short(text, shapes, rows,
                                                                                              monkeypatch):
    import superopt.schedule.contraction as contraction

    c = compile_op(text, shapes)

    def row():
        trace = default_schedule(c, TARGET, frozenset())
        unrolled = [p.loop for p in trace if type(p).__name__ == "Unroll"]
        return unrolled[0].removesuffix("_i")

    assert row() == rows[0]
    monkeypatch.setattr(contraction, "rows_to_repick", lambda *a, **k: False)
    assert row() == rows[1]


@pytest.mark.parametrize("shapes", [{"A": (10, 66, 38, 18), "B": (88, 66, 8, 38)},
                                    {"A": (10, 2, 16, 18), "B": (24, 2, 8, 16)}])
def test_a_long_innermost_row_dim_is_chosen_again_where_another_runs_along_the_row_operands_unit_stride(
        shapes, kernel_cache, monkeypatch):
    """j's 10 rows fill tiles of 5, but each step's broadcasts of them lie a row of A apart; i's 18 run along A's
    unit stride and fill tiles of 6. Only the small shape is compiled: both schedules match the reference."""
    import superopt.schedule.contraction as contraction

    c = compile_op("C[l,i,j,k] += A[j,n,m,i] * B[l,n,k,m]", shapes)

    def rows():
        trace = default_schedule(c, TARGET, frozenset())
        return trace, [p.loop for p in trace if type(p).__name__ == "Unroll"]

    chosen, unrolled = rows()
    assert unrolled == ["i_i"], chosen
    monkeypatch.setattr(contraction, "LONG_ROWS_REPICKED", False)
    kept, unrolled = rows()
    assert unrolled == ["j_i"], kept
    if math.prod(shapes["A"]) < 10_000:
        _check_against_reference(c, [chosen, kept], kernel_cache)


def test_a_tile_of_few_rows_on_sixteen_registers_takes_a_second_row_dim_and_fits_the_registers(kernel_cache,
                                                                                                  monkeypatch):
    """j's 3 rows on AVX2 (16 registers): the 32-register file's widening to 8 vectors (64 columns) leaves a tile of
    one row there, each FMA loading its own column vector. The fitted tile is 3 rows of j x 2 of a second row dim x 2
    vectors (12 accumulators); a shape too small for 8 vectors (48 columns) went to 3 vectors of one row dim. Both
    the fitted and the unfitted schedules of the small shape match the reference."""
    import superopt.schedule.contraction as contraction

    target = avx2(2)
    text = "C[m,i,j,k,l] += A[j,n,i] * B[k,n,l,m]"

    def tile(shapes):
        trace = default_schedule(compile_op(text, shapes), target, frozenset())
        return trace, [p.factor for p in trace if isinstance(p, Split) and p.loop == "k_l"], \
            sorted(p.loop for p in trace if type(p).__name__ == "Unroll")

    big = {"A": (3, 217, 705), "B": (132, 217, 4, 5)}
    small = {"A": (3, 5, 6), "B": (12, 5, 4, 2)}
    fitted, width, unrolled = tile(big)
    assert width == [16] and unrolled == ["i_i", "j"], fitted
    fitted_small, width, unrolled = tile(small)
    assert width == [16] and unrolled == ["j", "m_i"], fitted_small
    monkeypatch.setattr(contraction, "FEW_ROWS_FIT_16", False)
    one_row, width, unrolled = tile(big)
    assert width == [64] and unrolled == ["j_i"], one_row
    unfitted_small, width, unrolled = tile(small)
    assert width == [24] and unrolled == ["j"], unfitted_small
    _check_against_reference(compile_op(text, small), [fitted_small, unfitted_small], kernel_cache, 4, target)


def test_rows_of_a_dim_the_column_operand_does_not_read_match_the_reference(kernel_cache):
    c = compile_op("C[l,i,k,j] += A[i,m,n,k,j] * B[n,m,l]", {"A": (5, 3, 4, 6, 32), "B": (4, 3, 200)})
    trace = default_schedule(c, TARGET, frozenset())
    assert "l" in [p.loop.removesuffix("_i") for p in trace if type(p).__name__ == "Unroll"], trace
    _check_against_reference(c, [trace], kernel_cache)


def test_a_tile_of_few_rows_over_fused_columns_is_whole_vectors_wide(kernel_cache, monkeypatch):
    """The benchmark case rand37_12's shape, smaller: C[i,l,m,j,k] += A[n,p,j,i,o] * B[m,p,n,k,l,o], columns i, j
    fused (j's 7 inner) over k's 3 rows. The tile of few rows took a second row dim and 4 vectors, cut to the
    multiples of 7 the fused loop splits by: 63 columns, no whole number of vectors, a tile printed as scalars (0.34x
    on the case). It is 112 wide instead, 7 vectors and 16 j-rows of 7, with no second row dim."""
    import superopt.schedule.contraction as contraction

    c = compile_op("C[i,l,m,j,k] += A[n,p,j,i,o] * B[m,p,n,k,l,o]", {"A": (10, 3, 7, 40, 2), "B": (4, 3, 10, 3, 5, 2)})

    def width():
        trace = default_schedule(c, TARGET, frozenset())
        return trace, [p.factor for p in trace if isinstance(p, Split) and p.loop == "i_j"]

    trace, got = width()
    assert got == [112], trace
    _check_against_reference(c, [trace], kernel_cache)
    monkeypatch.setattr(contraction, "fused_vector_step", lambda n_dims, ext, lanes, linear: lanes)
    assert width()[1] == [63]


def test_a_column_operand_past_l2_in_too_few_panels_takes_narrower_panels_and_keeps_them_outermost(kernel_cache):
    """137 columns of a B past a 128 KB L2: 3 panels of 48 are too few for two threads to share (the last one
    partial), which would put the panels inside the row loops, each block of rows reading all of B from memory
    again. The default takes 5 panels of 32 and keeps them outermost; where B fits a 1 MB L2, 3 of 48 with the
    rows outermost."""
    from dataclasses import replace

    c = compile_op("C[i,j] += A[l,i,k] * B[l,k,j]", {"A": (4, 200, 64), "B": (4, 64, 137)})  # B 140 KB
    got = {}
    for name, l2 in {"B past L2": 128 << 10, "B in L2": 1 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        order, _ = _contraction_loops(trace, "C")
        got[name] = ([p.factor for p in trace if isinstance(p, Split) and p.loop == "j"],
                     [x for x in order if x in ("i_o", "j_o")])
        _check_against_reference(c, [trace], kernel_cache)
    assert got == {"B past L2": ([32], ["j_o", "i_o"]), "B in L2": ([48], ["i_o", "j_o"])}, got


def test_the_row_dim_is_chosen_for_the_tile_as_wide_as_its_narrowed_panels(kernel_cache, monkeypatch):
    """The benchmark case rand31_10's shape, smaller: C[k,m,i,l,j] += A[n,j,i,p,o] * B[l,m,k,p,n,o], computed with
    i innermost (the output-layout move), columns i from A. Where A fits L2 the tile is 64 columns (4 vectors) by
    the 5 rows of k, which fill a 6 x 4 tile. Past L2, 100 columns make too few panels of 64 for two threads, so
    they narrow to 32 (2 vectors), and the rows are chosen for that tile: 27 of m in blocks of 7 (5 rows of k fill
    a tile of 8 x 2 worse); the rows chosen for the unnarrowed tile stay 5 of k."""
    from dataclasses import replace

    import superopt.schedule.contraction as contraction

    c = compile_op("C[k,m,i,l,j] += A[n,j,i,p,o] * B[l,m,k,p,n,o]", {"A": (3, 21, 100, 7, 1), "B": (2, 27, 5, 7, 3, 1)})

    def tile(l2):
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        splits = {p.loop: p.factor for p in trace if isinstance(p, Split) and p.stage == "C_laid"}
        unrolled = [p.loop for p in trace if type(p).__name__ == "Unroll" and p.stage == "C_laid"]
        return trace, splits, unrolled

    past, splits, unrolled = tile(128 << 10)
    assert splits == {"i": 32, "m": 7} and unrolled == ["m_i"], past
    _check_against_reference(c, [past], kernel_cache)
    _, splits, unrolled = tile(1 << 20)
    assert splits == {"i": 64} and unrolled == ["k"]
    monkeypatch.setattr(contraction, "row_tile_width", lambda width, *rest: width)
    _, splits, unrolled = tile(128 << 10)
    assert splits == {"i": 32} and unrolled == ["k"]


def test_a_row_operand_past_l2_read_in_short_runs_is_packed(kernel_cache):
    """A[o,i,m,n,j,p] as the rows' operand (rows i, the output's unit stride, reductions o, m, n, p): each reduction
    step reads 7 rows x 6 p, several cache lines, then jumps, a walk the prefetchers follow poorly, and each of 6
    column panels reads it so. Past a 1 MB L2 (A is 1.5 MB) the default packs A so each row's reductions are one run;
    where it fits a 4 MB L2 it is read in place."""
    from dataclasses import replace

    c = compile_op("C[j,k,l,i] += A[o,i,m,n,j,p] * B[k,o,n,l,p,m]",
                   {"A": (2, 21, 3, 6, 86, 6), "B": (67, 2, 6, 4, 6, 3)})
    packed = {}
    for name, l2 in {"A past L2": 1 << 20, "A in L2": 4 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        packed[name] = [p.perm for p in trace if isinstance(p, Pack) and p.stage == "A"]
        _check_against_reference(c, [trace], kernel_cache)
    assert packed == {"A past L2": [(4, 1, 0, 2, 3, 5)], "A in L2": []}, packed


def test_the_column_operands_own_dims_go_outside_the_row_operands_where_its_panel_would_be_reread(kernel_cache):
    """C[m,l,j,k,i] += A[n,j,i] * B[l,k,m,n], columns m,l and rows i: in output order j (A's) is outside k (B's),
    so every j reads the panel's slices of B for all five k (192 KB) again. Past half of a 128 KB L2 that is
    7 x 192 KB from the next cache, against 5 x 129 KB of A with k outside: k goes outside j. In a 1 MB L2 the
    slices stay cached across j and the output order stays."""
    from dataclasses import replace

    c = compile_op("C[m,l,j,k,i] += A[n,j,i] * B[l,k,m,n]", {"A": (200, 7, 23), "B": (8, 5, 6, 200)})
    orders = {}
    for name, l2 in {"B re-read": 128 << 10, "B cached": 1 << 20}.items():
        trace = default_schedule(c, replace(TARGET, l2_bytes=l2), frozenset())
        order, vec = _contraction_loops(trace, "C")
        assert vec == "m_l"
        orders[name] = [x for x in order if x in ("j", "k")]
        _check_against_reference(c, [trace], kernel_cache)
    assert orders == {"B re-read": ["k", "j"], "B cached": ["j", "k"]}, orders


def test_the_column_operands_dims_stay_inside_where_one_would_scatter_the_output_write_back():
    """C[k,l,m,n,j,i] += A[k,o,i,j] * B[m,l,o,n], columns k,j of A (the column operand), rows n of B: moving A's i
    outside B's l, m would re-read less of A, but i is the output's unit-stride dim, so every write-back of a tile
    would touch each of its lines once per i and leave them before the next. The order then stays; a dim the
    output walks a line or more apart moves."""
    from superopt.schedule.contraction import column_dims_first

    c = compile_op("C[k,l,m,n,j,i] += A[k,o,i,j] * B[m,l,o,n]", {"A": (3, 342, 66, 16), "B": (7, 18, 342, 13)})
    st = c.statements[0]
    a_acc, b_acc = product_accesses(st.expr)
    rows, cols = (b_acc, a_acc) if b_acc.tensor == "B" else (a_acc, b_acc)  # (A holds the columns)
    panel = 4 * 48 * 342
    assert column_dims_first(["l", "m", "i"], rows, cols, st, panel, 2 << 20, 16) == ["l", "m", "i"]
    assert column_dims_first(["l", "m", "i"], rows, cols, st, panel, 2 << 20, 1) == ["i", "l", "m"]
    assert column_dims_first(["l", "m", "i"], rows, cols, st, panel, 64 << 20, 1) == ["l", "m", "i"]  # (cached)


@pytest.mark.parametrize("o,rows", [(64, ("i", "j")), (2048, ("j", "j"))])
def test_rows_follow_the_outputs_unit_stride_where_the_lanes_lie_lines_apart_and_the_reduction_is_short(
        o, rows, monkeypatch):
    """The benchmark case rand43_19's shape, a shorter reduction: C[m,n,l,k,j,i] += A[i,k,j,o] * B[n,l,o,m], columns
    l of B (1632 floats apart in C), rows among A's i, k, j. Rows j fill the tile best, but each write-back then puts every
    accumulator lane on a line of its own; rows i, the output's unit stride, write each lane's rows as one run (1.37x
    on the case). Over a long reduction the write-back is too rare to choose the rows by."""
    import superopt.schedule.contraction as contraction

    c = compile_op("C[m,n,l,k,j,i] += A[i,k,j,o] * B[n,l,o,m]", {"A": (68, 3, 8, o), "B": (3, 163, o, 3)})

    def row():
        trace = default_schedule(c, TARGET, frozenset())
        return [p.loop for p in trace if type(p).__name__ == "Unroll"][0].removesuffix("_i")

    assert row() == rows[0]
    monkeypatch.setattr(contraction, "output_run_rows", lambda *a, **k: ())
    assert row() == rows[1]


def test_rows_along_the_outputs_unit_stride_match_the_reference(kernel_cache, monkeypatch):
    """B, under half A's size, would take the columns (l, 640 floats apart in C) and the rows run along C's unit
    stride i; over 64 reduction steps the default keeps A's columns j, i instead (``scattering_pack``), C's unit
    stride in the vectors. Both match the reference."""
    import superopt.schedule.contraction as contraction

    c = compile_op("C[m,n,l,k,j,i] += A[i,k,j,o] * B[n,l,o,m]", {"A": (20, 4, 8, 64), "B": (2, 48, 64, 3)})
    runs = default_schedule(c, TARGET, frozenset())
    assert any(isinstance(p, Vectorize) and p.loop.startswith("j_i") for p in runs), runs
    monkeypatch.setattr(contraction, "scattering_pack", lambda *args: False)
    trace = default_schedule(c, TARGET, frozenset())
    assert "i" in [p.loop.removesuffix("_i") for p in trace if type(p).__name__ == "Unroll"], trace
    _check_against_reference(c, [runs, trace], kernel_cache)


def test_a_short_row_dim_along_the_row_operands_unit_stride_takes_one_tile_of_three_vectors(kernel_cache,
                                                                                              monkeypatch):
    """B[l,m,k] as the rows' operand: k, its unit stride, has 9 rows, more than a 4-row tile of 96 columns holds
    and as many as a tile of 48 columns (3 vectors) fits in the registers. The default takes all 9 rows of k in
    one tile of 48 columns (each step's 9 broadcasts from one cache line, no row tail); with ``whole_row_tile``
    off, the 4-row tile of 96 columns runs over l. Where B's reduction steps lie a line or more apart
    (B[m,l,k] with m outermost), k is not taken whole. All match the reference."""
    import superopt.schedule.contraction as contraction
    from superopt.schedule.primitives import Unroll

    c = compile_op("C[l,k,j,i] += A[m,i,j] * B[l,m,k]", {"A": (300, 6, 28), "B": (52, 300, 9)})
    target = TARGET
    whole = default_schedule(c, target, frozenset())
    assert Split("C", "j_i", 48) in whole and Unroll("C", "k") in whole, whole
    assert not any(isinstance(p, Split) and p.loop in ("k", "l") for p in whole), whole
    far = compile_op("C[l,k,j,i] += A[m,i,j] * B[m,l,k]", {"A": (300, 6, 28), "B": (300, 52, 9)})
    assert Unroll("C", "k") not in default_schedule(far, target, frozenset())
    monkeypatch.setattr(contraction, "whole_row_tile", lambda *args: 0)
    planned = default_schedule(c, target, frozenset())
    assert Split("C", "j_i", 96) in planned and Split("C", "l", 4) in planned, planned
    _check_against_reference(c, [whole, planned], kernel_cache)
