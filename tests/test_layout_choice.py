"""The global layout choice: NCHWc blocking as index notation, conversions that cancel, the
whole-graph pass, and the blocked conv compiled by the default schedule."""

from dataclasses import replace

import numpy as np
import pytest

from rewrite_rules import RULES, node_named
from rewrite_rules.layout_choice import _conv_graph, block_node_in, cancel_all, conversion_kind, conversions
from search.graph.layout import blocked_graph, choose_layouts, is_conv
from superopt.api import OptimizeConfig, load_graph, rewrite_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.inputs import random_inputs
from superopt.ir.graph import GraphError
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.blocked_conv import conv_efficiency
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.primitives import Epilogue, Reorder, Split, Unroll, Vectorize
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import host_target

TARGET = host_target(1)


def small_net(c: int = 16, hw: int = 8, seed: int = 0):
    """conv3x3+bias+relu -> maxpool -> conv1x1 + residual -> global average pool -> reshape -> gemm."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("small_net")
    x = b.input("x", (1, c, hw, hw))
    w1 = b.constant(rng.standard_normal((c, c, 3, 3)).astype(np.float32) / c, "w1")
    b1 = b.constant(rng.standard_normal(c).astype(np.float32), "b1")
    y = b.compute1("P[n,co,y,x] += X[n,ci,y+kh-1,x+kw-1] * W[co,ci,kh,kw]\nO[n,co,y,x] = relu(P[n,co,y,x] + B[co])",
                   {"X": x, "W": w1, "B": b1}, "conv1", extents={"y": hw, "x": hw}, padding={"X": 0.0}, outputs=["O"])
    p = b.compute1("O[n,c,y,x] max= X[n,c,2*y+k0,2*x+k1]", {"X": y}, "pool",
                   extents={"k0": 2, "k1": 2, "y": hw // 2, "x": hw // 2})
    w2 = b.constant(rng.standard_normal((c, c, 1, 1)).astype(np.float32) / c, "w2")
    z = b.compute1("P[n,co,y,x] += X[n,ci,y+kh,x+kw] * W[co,ci,kh,kw]\nO[n,co,y,x] = relu(P[n,co,y,x] + R[n,co,y,x])",
                   {"X": p, "W": w2, "R": p}, "conv2", outputs=["O"])
    m = b.compute1("O[n,c,i,j] += X[n,c,y+i,x+j] * 0.0625", {"X": z}, "avg", extents={"i": 1, "j": 1})
    flat = b.extern("reshape", [m], shape=(1, c))[0]
    w3 = b.constant(rng.standard_normal((c, 10)).astype(np.float32), "w3")
    out = b.compute1("O[n,k] += X[n,c] * W[c,k]", {"X": flat, "W": w3}, "gemm")
    return b.build([out])


def _max_rel_err(a: dict, b: dict, outputs) -> float:
    return max(float(np.abs(np.asarray(a[o], np.float64) - b[o]).max() / np.abs(b[o]).max()) for o in outputs)


def _blocked_tensors(graph) -> list[str]:
    return [n for n, t in graph.types if t.rank == 5 and t.shape[-1] in (8, 16)]


def _pairs_left(graph) -> int:
    """from_blocked conversions read back by a to_blocked conversion (a pair that should have cancelled)."""
    n = 0
    for node in graph.nodes:
        if conversion_kind(graph, node) == ("to", 16) or conversion_kind(graph, node) == ("to", 8):
            r = graph.producer.get(node.inputs[0])
            if r is not None and r.is_extern and conversion_kind(graph, graph.producer[r.inputs[0]]) is not None:
                n += 1
    return n


@pytest.mark.parametrize("block", [8, 16])
def test_the_blocked_graph_matches_the_reference_with_conversions_only_at_its_edges(block):
    g = small_net()
    new, done = blocked_graph(g, block)
    feed = random_inputs(g)
    assert _max_rel_err(evaluate(new, feed, np.float64), evaluate(g, feed, np.float64), g.outputs) < 1e-12
    assert sorted(done) == ["avg", "conv1", "conv2", "pool"]  # the gemm reads a reshape: it stays as it is
    kinds = sorted(conversion_kind(new, n)[0] for n in conversions(new))
    assert kinds == ["from", "to"]  # the input x, and avg -> reshape -> gemm
    assert _pairs_left(new) == 0
    blocked = {n.name: n for n in new.nodes}
    assert new.type_of[blocked["conv2"].inputs[0]].shape == (1, 16 // block, 4, 4, block)
    # the weight is pre-blocked, output-channel lanes innermost: W_c[cob, cib, kh, kw, ci_l, co_l]
    w = next(i for i in blocked["conv1"].inputs if i in new.constant)
    assert new.constant[w].array.shape == (16 // block, 16 // block, 3, 3, block, block)
    cob = 1 if block == 8 else 0
    assert new.constant[w].array[cob, 0, 2, 1, 3, 5] == g.constant["w1"].array[block * cob + 5, 3, 2, 1]


def test_a_conversion_followed_by_its_inverse_cancels_and_nothing_is_converted_between_two_convs():
    g = small_net()
    g1 = block_node_in(g, "conv1", 16)
    g2 = block_node_in(g1, "pool", 16)  # pool now reads a to_blocked of conv1's from_blocked output
    assert _pairs_left(g2) == 1
    g3 = cancel_all(g2)
    assert _pairs_left(g3) == 0 and len(conversions(g3)) == len(conversions(g2)) - 2
    feed = random_inputs(g)
    assert _max_rel_err(evaluate(g3, feed, np.float64), evaluate(g, feed, np.float64), g.outputs) < 1e-12
    # pool -> conv2 now: conv2 blocked too, its reads of pool's output (X and the residual) cancel
    g4 = cancel_all(block_node_in(g3, "conv2", 16))
    pool, conv2 = node_named(g4, "pool"), node_named(g4, "conv2")
    assert set(conv2.inputs) & set(pool.outputs)  # conv2 reads pool's blocked output directly
    assert _pairs_left(g4) == 0


def test_channels_no_multiple_of_the_block_stay_nchw():
    g = small_net(c=12)
    new, done = blocked_graph(g, 8)
    assert done == [] and not conversions(new) and new == g


def test_the_compiled_blocked_graph_matches_the_reference_and_vectorizes_over_channel_lanes():
    g = small_net(hw=6, seed=1)
    new, report = choose_layouts(g, TARGET, layout="nchw16c")
    assert report.chosen == "nchw16c" and report.conversions == 2
    schedules = default_schedules(new, TARGET)
    conv = node_named(new, "conv1")
    # the blocked-conv schedule: the vector loop is the output-channel lane dim
    p = next(st for st in conv.op.statements if st.reduce == "+=")
    assert Vectorize(p.out, p.out_dims[-1]) in schedules["conv1"]
    ex = GraphExecutor(new, schedules, ExecutorConfig(1, target=TARGET))
    feed = random_inputs(g)
    got = ex(feed)
    assert _max_rel_err(got, evaluate(g, feed, np.float64), g.outputs) < 1e-5


def test_auto_weighs_the_conversions_against_the_convs_and_keeps_nchw_without_convs():
    # an AVX2-class target (8 lanes: 16c blocks are two vectors), whatever the host: the choice depends on it
    avx2 = replace(TARGET, vector_bits=256, vector_registers=16)
    _, report = choose_layouts(small_net(c=64, hw=16), avx2)  # convs outweigh the two edge conversions
    assert report.chosen == "nchw16c" and dict(report.costs)["nchw16c"] < dict(report.costs)["nchw"]
    b, y = _conv_graph("one_conv", 16, 16, 4, 1, 0)  # one tiny conv: its two conversions cost more
    _, report = choose_layouts(b.build([y]), avx2)
    assert report.chosen == "nchw" and dict(report.costs)["nchw16c"] > dict(report.costs)["nchw"]
    b = GraphBuilder("no_conv")
    x = b.input("x", (1, 16, 4, 4))
    g2 = b.build([b.compute1("O[n,c,y,x] = relu(X[n,c,y,x])", {"X": x}, "relu")])
    new, report = choose_layouts(g2, avx2)
    assert report.chosen == "nchw" and new is g2


def test_with_32_registers_16_lane_blocks_cost_the_full_ceiling_and_auto_blocks_a_conv_net():
    avx512 = replace(TARGET, vector_bits=512, vector_registers=32)
    avx2 = replace(TARGET, vector_bits=256, vector_registers=16)
    assert conv_efficiency(avx512, 16, 4) == 1.0  # two blocks a tile: two vectors a row
    assert conv_efficiency(avx512, 16, 3) == 0.5  # an odd block count: one block a tile
    assert conv_efficiency(avx512, 8, 4) == 0.5  # two vectors a row, each half filled
    assert conv_efficiency(avx2, 16, 4) == 1.0 and conv_efficiency(avx2, 8, 4) == 0.5
    _, report = choose_layouts(small_net(c=64, hw=16), avx512)
    assert report.chosen == "nchw16c"


def test_auto_layout_runs_on_cpu_targets_only_and_a_forced_block_everywhere():
    from superopt.target import h200_target

    g = small_net(c=64, hw=16)
    assert _blocked_tensors(rewrite_graph(g, OptimizeConfig(target=replace(TARGET, vector_bits=512, vector_registers=32)))[0])
    assert not _blocked_tensors(rewrite_graph(g, OptimizeConfig(target=h200_target()))[0])  # GPU schedules are NCHW
    assert _blocked_tensors(rewrite_graph(g, OptimizeConfig(target=h200_target(), layout="nchw16c"))[0])


def _blocked_conv(target, c: int = 64, hw: int = 10, seed: int = 3):
    g = choose_layouts(small_net(c=c, hw=hw, seed=seed), target, layout="nchw16c")[0]
    conv = node_named(g, "conv1")
    consts = frozenset(local for local, gi in zip(conv.op.inputs, conv.inputs) if gi in g.constant)
    return g, conv, consts, next(st for st in conv.op.statements if st.reduce == "+=")


def test_the_blocked_conv_tile_takes_two_output_channel_blocks_with_32_registers_and_one_with_16():
    avx512 = replace(TARGET, vector_bits=512, vector_registers=32)
    avx2 = replace(TARGET, vector_bits=256, vector_registers=16)
    _, conv, consts, p = _blocked_conv(avx512, c=96)  # 6 blocks of 16: no wide tile of 4
    cob, col = p.out_dims[1], p.out_dims[3]
    wide = ScheduleSpace(conv.op, avx512, consts)
    trace, used, domains = wide.resolve(wide.default_point())
    assert used[f"{p.out}.cob_tile"] == 2 and Split(p.out, cob, 2) in trace and Unroll(p.out, f"{cob}_i") in trace
    # rows from the register budget: the 10 columns in one tile
    assert used[f"{p.out}.rows"] == 10 and Split(p.out, col, 10) not in trace
    assert set(domains[f"{p.out}.cob_tile"]) == {1, 2}
    narrow = ScheduleSpace(conv.op, avx2, consts)
    trace, used, _ = narrow.resolve(narrow.default_point())
    assert used[f"{p.out}.cob_tile"] == 1 and not any(isinstance(x, Split) and x.loop == cob for x in trace)


def test_the_blocked_conv_tile_walks_its_pixels_outside_its_vectors_with_32_registers():
    """Each pixel's broadcast feeds the tile's vectors and dies (rows_outer): (rows + 1) x vectors + 2
    registers, so a 2-vector tile takes 12 rows on AVX-512 where the other order took 10 (every row's
    broadcast kept live); AVX2 keeps the order measured there. Both orders match the reference."""
    avx512 = replace(TARGET, vector_bits=512, vector_registers=32)
    avx2 = replace(TARGET, vector_bits=256, vector_registers=16)
    g, conv, consts, p = _blocked_conv(avx512, c=96, hw=24)  # 6 blocks: the 2-block tile, 24 columns
    cob, col = p.out_dims[1], p.out_dims[3]
    space = ScheduleSpace(conv.op, avx512, consts)
    trace, used, domains = space.resolve(space.default_point())
    order = next(x.order for x in trace if isinstance(x, Reorder) and x.stage == p.out)
    assert used[f"{p.out}.rows_outer"] and order[-3:] == (f"{col}_i", f"{cob}_i", p.out_dims[-1])
    assert used[f"{p.out}.rows"] == 12 and set(domains[f"{p.out}.rows_outer"]) == {False, True}
    _, used_cols_outer, _ = space.resolve(Point.of(space.default_point().sketch, {f"{p.out}.rows_outer": False}))
    assert used_cols_outer[f"{p.out}.rows"] == 8  # 24 columns in 3 tiles of at most 10 rows
    narrow = ScheduleSpace(conv.op, avx2, consts)
    trace2, used2, _ = narrow.resolve(narrow.default_point())
    assert not used2[f"{p.out}.rows_outer"]
    feed = random_inputs(g)
    want = evaluate(g, feed, np.float64)
    for rows_outer in (False, True):
        point = Point.of(space.default_point().sketch, {f"{p.out}.rows_outer": rows_outer})
        ex = GraphExecutor(g, default_schedules(g, TARGET) | {"conv1": list(ScheduleSpace(conv.op, TARGET, consts)
                                                                           .trace(point))},
                           ExecutorConfig(1, target=TARGET))
        assert _max_rel_err(ex(feed), want, g.outputs) < 1e-5


def test_the_wide_tile_takes_four_blocks_by_six_rows_where_the_blocks_divide_by_four():
    """ONNX runtime's NCHWc tile (4 output-channel blocks x 6 columns: 10 loads per 24 FMAs): taken on any row
    of at least 6 columns, padded or not (14 and 7 columns too: the load ratio pays for the padding)."""
    from superopt.schedule.blocked_conv import wide_tile_rows

    avx512 = replace(TARGET, vector_bits=512, vector_registers=32)
    assert [wide_tile_rows(avx512, 16, 4, n) for n in (112, 56, 55, 28, 27, 14, 13, 7, 6)] == [6] * 9
    assert [wide_tile_rows(avx512, 16, 8, n) for n in (5, 3, 1)] == [0, 0, 0]  # fewer columns than rows
    assert wide_tile_rows(avx512, 16, 6, 56) == 0  # 6 blocks: no tile of 4
    assert wide_tile_rows(avx512, 8, 8, 56) == 0  # half-vector blocks
    assert wide_tile_rows(replace(TARGET, vector_bits=256, vector_registers=16), 8, 8, 56) == 0
    g, conv, consts, p = _blocked_conv(avx512, c=64, hw=28, seed=5)
    space = ScheduleSpace(conv.op, avx512, consts)
    trace, used, _ = space.resolve(space.default_point())
    assert (used[f"{p.out}.cob_tile"], used[f"{p.out}.rows"]) == (4, 6)
    assert Split(p.out, p.out_dims[1], 4) in trace and Split(p.out, p.out_dims[3], 6) in trace  # 28 = 4 x 6 + 4
    # the knob still reaches the two-block tile, with the rows that tile takes (7 x 4 = 28 columns)
    _, used2, _ = space.resolve(Point.of(space.default_point().sketch, {f"{p.out}.cob_tile": 2}))
    assert (used2[f"{p.out}.cob_tile"], used2[f"{p.out}.rows"]) == (2, 7)
    if TARGET.vector_registers >= 32:  # runs here only where the host has AVX-512's 32 registers
        ex = GraphExecutor(g, default_schedules(g, avx512) | {"conv1": trace}, ExecutorConfig(1, target=avx512))
        feed = random_inputs(g)
        assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


def test_the_blocked_conv_tile_keeps_enough_fma_chains_where_few_rows_divide_the_columns():
    # 33 output columns (3 x 11): the fewest padded rows alone took 3 rows (2 x 3 accumulators, each
    # FMA waiting on the one before it); the tile keeps at least fma_chains accumulators instead
    from superopt.schedule.blocked_conv import _row_block

    assert _row_block(33, 10) == 3 and _row_block(33, 10, 4) == 7 and _row_block(111, 10, 4) == 8
    assert _row_block(56, 10, 4) == 8 and _row_block(28, 10, 4) == 7 and _row_block(33, 3, 4) == 3
    g, conv, consts, p = _blocked_conv(TARGET, c=32, hw=33, seed=4)
    space = ScheduleSpace(conv.op, TARGET, consts)
    trace, used, _ = space.resolve(space.default_point())
    vectors = used[f"{p.out}.cob_tile"] * -(-16 // TARGET.lanes("float32"))
    assert used[f"{p.out}.rows"] * vectors >= TARGET.fma_chains, used
    ex = GraphExecutor(g, default_schedules(g, TARGET), ExecutorConfig(1, target=TARGET))
    feed = random_inputs(g)
    assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


@pytest.mark.parametrize("cob_tile", [1, 2, 4])
def test_every_output_channel_block_tile_compiles_and_matches_the_reference(cob_tile):
    g, conv, consts, p = _blocked_conv(TARGET)
    space = ScheduleSpace(conv.op, TARGET, consts)
    if cob_tile not in space.resolve(space.default_point())[2][f"{p.out}.cob_tile"]:
        pytest.skip(f"{cob_tile} output channel blocks make a tile past this host's register file")
    point = Point.of(space.default_point().sketch, {f"{p.out}.cob_tile": cob_tile})
    schedules = default_schedules(g, TARGET) | {"conv1": list(space.trace(point))}
    ex = GraphExecutor(g, schedules, ExecutorConfig(1, target=TARGET))
    feed = random_inputs(g)
    assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_the_blocked_conv_unrolls_its_channel_lanes_and_every_setting_matches_the_reference(unroll):
    """The reduction over the input block's 16 lanes (one broadcast each) runs in unrolled steps of
    ``unroll_lanes`` (4 by default): gcc does not unroll at -O3, and a rolled loop keeps its pointer updates
    and spills per step; all 16 gain nothing over 4 and multiply the compile time."""
    from superopt.schedule.blocked_conv import UNROLL_LANES

    g, conv, consts, p = _blocked_conv(TARGET)
    lanes = next(d for d in p.reduce_dims if p.extent[d] == 16)
    space = ScheduleSpace(conv.op, TARGET, consts)
    default = list(space.trace(space.default_point()))
    assert UNROLL_LANES == 4 and Split(p.out, lanes, 4) in default and Unroll(p.out, f"{lanes}_i") in default
    trace = list(space.trace(Point.of(space.default_point().sketch, {f"{p.out}.unroll_lanes": unroll})))
    unrolled = {1: None, 2: f"{lanes}_i", 4: f"{lanes}_i"}[unroll]
    assert [x.loop for x in trace if isinstance(x, Unroll) and x.loop.startswith(lanes)] == ([unrolled] if unrolled else [])
    ex = GraphExecutor(g, default_schedules(g, TARGET) | {"conv1": trace}, ExecutorConfig(1, target=TARGET))
    feed = random_inputs(g)
    assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


@pytest.mark.parametrize("red_block", [1, 2])
def test_reduction_blocks_outside_the_image_loops_compile_and_match_the_reference(red_block):
    """red_block input-channel blocks per step, outside the image loops: the epilogue (relu) runs once the
    last block is summed."""
    g, conv, consts, p = _blocked_conv(TARGET)
    space = ScheduleSpace(conv.op, TARGET, consts)
    default = space.default_point()
    cib = next(d for d in p.reduce_dims if p.extent[d] == 4)
    # 4 blocks of 3x3x16 weights for 16-lane output blocks: at least 18 KiB a block, more than half of a
    # 32 KiB L1: one block a step by default; with a large L1, the whole reduction in one step
    for l1, want in ((32 << 10, 1), (1 << 20, 4)):
        sized = ScheduleSpace(conv.op, replace(TARGET, l1_bytes=l1), consts)
        assert sized.resolve(sized.default_point())[1][f"{p.out}.red_block"] == want
    point = Point.of(default.sketch, {f"{p.out}.red_block": red_block})
    trace = list(space.trace(point))
    assert Split(p.out, cib, red_block) in trace and any(isinstance(x, Epilogue) for x in trace)
    ex = GraphExecutor(g, default_schedules(g, TARGET) | {"conv1": trace}, ExecutorConfig(1, target=TARGET))
    feed = random_inputs(g)
    assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


def _converted_then_copied(copy: str, extents: dict[str, int], block: int = 8):
    """x -> to_nchw{block}c -> a node whose one statement copies the blocked tensor as ``copy`` says."""
    b = GraphBuilder("conv_then_copy")
    x = b.input("x", (1, 2 * block, 3, 3))
    xc = b.compute1(f"O[n,cb,y,x,c] = X[n,{block}*cb+c,y,x]", {"X": x}, "to_blocked", extents={"cb": 2, "c": block})
    y = b.compute1(copy, {"X": xc}, "copy", extents=extents, padding={"X": 0.0})
    return b.build([y])


def test_a_padded_copy_converts_its_input_and_keeps_its_meaning_or_keeps_the_conversion():
    from rewrite_rules.layout_choice import absorb_all

    # spatial padding: the copy reads x itself, with the blocked channel index, and means the same
    g = _converted_then_copied("O[n,cb,p,q,c] = X[n,cb,p-1,q-1,c]", {"p": 5, "q": 5})
    new = absorb_all(g)
    assert conversions(g) and not conversions(new) and new.nodes[0].inputs == ("x",)
    feed = random_inputs(g, seed=0)
    np.testing.assert_array_equal(evaluate(new, feed)[new.outputs[0]], evaluate(g, feed)[g.outputs[0]])
    # a shifted lane (c-1 reads lane -1: zero, blocked; channel 8*cb-1, converted) is no conversion to absorb
    g = _converted_then_copied("O[n,cb,y,x,c] = X[n,cb,y,x,c-1]", {"c": 8})
    assert absorb_all(g) is g and conversions(g)
    # a refused site does not end the pass: the conversion after it is still absorbed
    b = GraphBuilder("two_copies")
    outs = []
    for k, (copy, ext) in enumerate((("O[n,cb,y,x,c] = X[n,cb,y,x,c-1]", {"c": 8}),
                                     ("O[n,cb,p,q,c] = X[n,cb,p-1,q-1,c]", {"p": 5, "q": 5}))):
        x = b.input(f"x{k}", (1, 16, 3, 3))
        xc = b.compute1("O[n,cb,y,x,c] = X[n,8*cb+c,y,x]", {"X": x}, f"to_blocked{k}", extents={"cb": 2, "c": 8})
        outs.append(b.compute1(copy, {"X": xc}, f"copy{k}", extents=ext, padding={"X": 0.0}))
    g = b.build(outs)
    new = absorb_all(g)
    assert [conversion_kind(new, n) for n in conversions(new)] == [("to", 8)] and len(conversions(g)) == 2
    assert next(n for n in new.nodes if n.name == "copy1").inputs == ("x1",)
    feed = random_inputs(g, seed=1)
    for o in g.outputs:
        np.testing.assert_array_equal(evaluate(new, feed)[o], evaluate(g, feed)[o])


def test_an_unknown_layout_is_refused_naming_it():
    with pytest.raises(ValueError, match="nhwc4"):
        choose_layouts(small_net(), TARGET, layout="nhwc4")


def test_the_layout_rules_are_registered_in_their_family():
    names = {r.name: r.family for r in RULES}
    for name in ("block_node_nchw8c", "block_node_nchw16c", "cancel_conversions", "sink_conversion_nchw16c"):
        assert names[name] == "layout_choice"


def test_light_resnet50_is_blocked_everywhere_but_the_classifier():
    from superopt.frontends.light_models import light_model_path

    g = rewrite_graph(load_graph(str(light_model_path("resnet50"))), OptimizeConfig(layout="nchw"))[0]
    new, report = choose_layouts(g, TARGET, layout="nchw16c")
    convs = [n.name for n in g.nodes if is_conv(g, n)]
    assert len(convs) >= 50 and set(convs) <= set(report.blocked_nodes)
    # the stem reads the 3-channel image in NCHW (no conversion); one conversion left: the pooled
    # features into the reshape and the final gemm
    assert report.conversions == 1 and _pairs_left(new) == 0
    (conv,) = conversions(new)
    assert conversion_kind(new, conv)[0] == "from"
    assert [c.op.kind for c in new.consumers[conv.outputs[0]]] == ["reshape"]


def test_optimize_takes_the_layout_from_its_config_and_verifies():
    from superopt.api import optimize

    g = small_net(hw=6, seed=2)
    prog = optimize(g, OptimizeConfig(threads=1, layout="nchw16c"))
    assert prog.report.max_error is not None and prog.report.max_error < 1e-4  # checked against the reference
    # one conversion back, the last; one on the way in unless conv1 copies its input into a pad stage, which then
    # converts it on the way (absorb_conversion; whether the padding is a stage of its own is the graph search's
    # choice, by this machine's measured ceilings)
    kinds = [conversion_kind(prog.graph, c)[0] for c in conversions(prog.graph)]
    absorbed = next(n for n in prog.graph.nodes if n.name == "conv1").inputs[0] == "x"
    assert kinds == (["from"] if absorbed else ["to", "from"]), kinds
    assert not _blocked_tensors(optimize(g, OptimizeConfig(threads=1, layout="nchw")).graph)
    # the default is "auto": the layout choice's pick for this target
    chosen = choose_layouts(rewrite_graph(g, OptimizeConfig(layout="nchw"))[0], host_target(1))[1].chosen
    assert bool(_blocked_tensors(optimize(g, OptimizeConfig(threads=1)).graph)) == (chosen != "nchw")


def test_blocked_kernels_keep_the_default_schedule_under_the_learned_model():
    from search.graph.layout import blocked_kernels
    from superopt.api import load_cost_model, schedule_graph
    from superopt.ir.canonical import canonicalize_kernels

    g = canonicalize_kernels(choose_layouts(small_net(hw=6), TARGET, layout="nchw16c")[0])
    blocked = blocked_kernels(g)
    assert {"conv1", "pool", "conv2", "avg"} <= set(blocked) and "gemm" not in blocked
    model = load_cost_model("pretrained")
    if model is None:
        pytest.skip("no pretrained cost model in this checkout")
    schedules, _, _ = schedule_graph(g, TARGET, None, model)
    default = default_schedules(g, TARGET)
    assert all(schedules[n] == default[n] for n in blocked)


def test_constants_are_private_read_only_copies_on_a_cache_line():
    """The layout pass re-lays out conv weights into new constants that kernels read in place with whole
    vector loads: each must start on a 64-byte boundary (numpy gives 16; a misaligned vector load straddles
    two cache lines), and stay so through a pickle round trip."""
    import pickle

    from superopt.ir.graph import Constant

    g = choose_layouts(small_net(c=32, hw=6, seed=5), TARGET, layout="nchw16c")[0]
    assert any(c.array.ndim == 6 for _, c in g.constants)  # the blocked weights W_c[cob, cib, kh, kw, ci, co]
    for _, c in g.constants:
        assert c.array.ctypes.data % 64 == 0 and not c.array.flags.writeable
    src = np.arange(1, 3 * 5 * 7 + 1, dtype=np.float32).reshape(3, 5, 7)[:, 1:]  # a strided view of a writable array
    c = Constant(src)
    assert c.array.ctypes.data % 64 == 0 and c.array.flags.c_contiguous and np.array_equal(c.array, src)
    src[...] = 0  # the constant is a copy, not a view
    assert c.array.min() > 0
    with pytest.raises(ValueError, match="read-only"):
        c.array.base[...] = 0  # not even through the buffer behind it
    assert Constant(c.array).array.ctypes.data == c.array.ctypes.data  # already private and aligned: no copy
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.array.ctypes.data % 64 == 0 and not back.array.flags.writeable
    for value in (np.float32(2.5), np.zeros((0, 4), np.int64), np.array([True, False])):
        k = Constant(np.asarray(value))
        assert np.array_equal(k.array, value) and k.array.dtype == np.asarray(value).dtype


@pytest.mark.parametrize("y_rows", [1, 2, 3])
def test_two_d_tiles_where_the_columns_alone_pad_and_every_setting_matches_the_reference(y_rows):
    """The 4 x 6 tile computes 18 columns of a 14-wide image; 2 image rows x 3 columns compute 15 with the
    same 24 accumulators. Not where the image rows would have a tail (7 x 7: 8 computed rows of 7) nor
    where the columns pad little (56: 60 -> 57 columns)."""
    from superopt.schedule.blocked_conv import two_d_tile_rows

    assert [two_d_tile_rows(h, h, 6) for h in (14, 7, 56, 28, 15)] == [2, 1, 1, 1, 3]
    assert two_d_tile_rows(14, 14, 6) == 2 and two_d_tile_rows(13, 13, 6) == 1  # 2 does not divide 13
    avx512 = replace(TARGET, vector_bits=512, vector_registers=32, threads=2)
    g, conv, consts, p = _blocked_conv(avx512, c=64, hw=14, seed=6)
    y, col = p.out_dims[2], p.out_dims[3]
    space = ScheduleSpace(conv.op, avx512, consts)
    default, used, domains = space.resolve(space.default_point())
    assert used[f"{p.out}.y_rows"] == 2 and set(domains[f"{p.out}.y_rows"]) == {1, 2, 3}
    assert Split(p.out, y, 2) in default and Unroll(p.out, f"{y}_i") in default and Split(p.out, col, 3) in default
    trace = list(space.trace(Point.of(space.default_point().sketch, {f"{p.out}.y_rows": y_rows})))
    assert any(isinstance(x, Split) and x.loop == y for x in trace) == (y_rows > 1)
    if TARGET.vector_registers >= 32:  # runs here only where the host has AVX-512's 32 registers
        ex = GraphExecutor(g, default_schedules(g, avx512) | {"conv1": trace}, ExecutorConfig(2, target=avx512))
        feed = random_inputs(g)
        assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


def test_a_one_row_tile_that_pads_much_takes_fewer_columns_and_matches_the_reference():
    """7 columns: 4 x 4 computes 8 where 4 x 6 computes 12 (a third fewer FMAs for the same loads); columns
    that pad little keep the full tile."""
    from superopt.schedule.blocked_conv import tile_columns

    assert [tile_columns(w, 6, 1) for w in (7, 13, 28, 56, 112, 6)] == [4, 5, 6, 6, 6, 6]
    assert tile_columns(14, 6, 2) == 3  # a 2-D tile splits the rows it is given
    avx512 = replace(TARGET, vector_bits=512, vector_registers=32, threads=2)
    g, conv, consts, p = _blocked_conv(avx512, c=64, hw=7, seed=7)
    col = p.out_dims[3]
    space = ScheduleSpace(conv.op, avx512, consts)
    trace, used, _ = space.resolve(space.default_point())
    assert used[f"{p.out}.y_rows"] == 1 and Split(p.out, col, 4) in trace  # 7 = 4 + 3: one tail tile
    if TARGET.vector_registers >= 32:  # runs here only where the host has AVX-512's 32 registers
        ex = GraphExecutor(g, default_schedules(g, avx512) | {"conv1": trace}, ExecutorConfig(2, target=avx512))
        feed = random_inputs(g)
        assert _max_rel_err(ex(feed), evaluate(g, feed, np.float64), g.outputs) < 1e-5


def test_a_reused_conversion_placed_after_an_earlier_reader_moves_up_to_it():
    """x feeds two convs; blocking the later one first puts x's conversion after the earlier one, and
    blocking the earlier one then reuses that conversion: it must move up, or the graph reads a tensor before
    it is defined."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("two_readers")
    x = b.input("x", (1, 16, 4, 4))
    outs = []
    for name in ("conv_a", "conv_b"):
        w = b.constant(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) / 4, f"w_{name}")
        outs.append(b.compute1("O[n,co,y,x] += X[n,ci,y+kh,x+kw] * W[co,ci,kh,kw]", {"X": x, "W": w}, name))
    s = b.compute1("O[n,c,y,x] = A[n,c,y,x] + B[n,c,y,x]", {"A": outs[0], "B": outs[1]}, "sum")
    g = b.build([s])
    g2 = block_node_in(block_node_in(g, "conv_b", 8), "conv_a", 8)
    to_x = [n for n in g2.nodes if conversion_kind(g2, n) == ("to", 8) and n.inputs == ("x",)]
    assert len(to_x) == 1  # one conversion of x, shared
    order = [n.name for n in g2.nodes]
    assert order.index(to_x[0].name) < order.index("conv_a") < order.index("conv_b")
    feed = random_inputs(g)
    assert _max_rel_err(evaluate(g2, feed, np.float64), evaluate(g, feed, np.float64), g.outputs) < 1e-12


def _dense_block(layers: int = 3, c: int = 16, growth: int = 16, hw: int = 4, seed: int = 5):
    """A DenseNet block: each layer batch-norm + relu + conv1x1 + relu + conv3x3 of the concatenation of all
    before it, the concatenations nested, then a transition (bn, relu, conv1x1, average pool)."""
    from superopt import ops

    rng = np.random.default_rng(seed)
    b = GraphBuilder("dense_block")
    x = b.input("x", (1, c, hw, hw))
    feats, k = x, c

    def const(shape, name):
        return b.constant((rng.standard_normal(shape) / max(shape[0], 4)).astype(np.float32), name)

    def bn_relu(t, ch, name):
        var = b.constant(rng.uniform(0.5, 1.5, ch).astype(np.float32), f"{name}_var")
        return ops.relu(b, ops.batch_norm(b, t, const((ch,), f"{name}_s"), const((ch,), f"{name}_b"),
                                          const((ch,), f"{name}_m"), var))

    for i in range(layers):
        y = ops.conv2d(b, bn_relu(feats, k, f"bn{i}a"), const((4 * growth, k, 1, 1), f"w{i}a"))
        y = ops.conv2d(b, bn_relu(y, 4 * growth, f"bn{i}b"), const((growth, 4 * growth, 3, 3), f"w{i}b"),
                       pads=(1, 1, 1, 1))
        feats, k = ops.concat(b, [feats, y], 1), k + growth
    t = ops.conv2d(b, bn_relu(feats, k, "bnt"), const((k // 2, k, 1, 1), "wt"))
    return b.build([ops.avg_pool2d(b, t, (2, 2), (2, 2))])


def _blocked_graph_checked(graph, block):
    """:func:`blocked_graph` as it was written first: every step a validated graph, every cancellation a
    whole-graph scan and dead-code pass."""
    from rewrite_rules import RuleNotApplicable
    from rewrite_rules.grouped_conv import split_where
    from rewrite_rules.layout_choice import absorb_all, blockable
    from search.graph.layout import _reads_only_conversions

    graph = split_where(graph, block)
    done = []
    for name in [n.name for n in graph.nodes if is_conv(graph, n)]:
        if blockable(graph, node_named(graph, name), block):
            graph = block_node_in(graph, name, block)
            done.append(name)
    graph = cancel_all(graph)
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node.name in done or node.name not in {n.name for n in graph.nodes} or node.is_extern \
                    or conversion_kind(graph, node) is not None:
                continue
            node = node_named(graph, node.name)
            if _reads_only_conversions(graph, node, block) and blockable(graph, node, block):
                try:
                    graph = cancel_all(block_node_in(graph, node.name, block))
                except RuleNotApplicable:
                    continue
                done.append(node.name)
                changed = True
    return absorb_all(graph), done


@pytest.mark.parametrize("block", [8, 16])
def test_the_layout_pass_with_unchecked_steps_builds_the_graph_the_checked_steps_build(block):
    """The pass validates only its result and cancels conversions only around the node it blocked: the same
    graph (nodes, wiring, types, constants) as validating and scanning the whole graph at every step, and it
    matches the reference."""
    g = _dense_block()
    new, done = blocked_graph(g, block)
    ref, ref_done = _blocked_graph_checked(g, block)
    assert sorted(done) == sorted(ref_done) and len(done) >= 8  # the convs, the batch norms, the concatenations
    assert [(n.name, n.inputs, n.outputs, n.op) for n in new.nodes] == \
        [(n.name, n.inputs, n.outputs, n.op) for n in ref.nodes]
    assert new.types == ref.types and new.outputs == ref.outputs
    assert [n for n, _ in new.constants] == [n for n, _ in ref.constants]
    assert _pairs_left(new) == 0
    feed = random_inputs(g)
    assert _max_rel_err(evaluate(new, feed, np.float64), evaluate(g, feed, np.float64), g.outputs) < 1e-12


def test_an_unchecked_graph_skips_validation_until_asked():
    g = small_net()
    broken = g.unchecked(nodes=g.nodes[1:])  # conv1's output is read but no longer defined
    with pytest.raises(GraphError, match="conv1|defined|read"):
        broken.validate()
    with pytest.raises(GraphError):
        replace(g, nodes=g.nodes[1:])
    with pytest.raises(TypeError, match="no field 'edges'"):
        g.unchecked(edges=())
