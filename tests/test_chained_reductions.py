"""Chained reductions over a contraction's result (EM routing's weighted mean, then the weighted variance
around it): materialize (store V once) or recompute (the Recompute record: V computed again, tile by tile,
for the second pass, which is folded into the copy's write-back). Each compiles and matches the float64
reference; the planner rejects a Recompute that does not fit with a one-line reason."""

import numpy as np
import pytest

from rewrite_rules.moments import EM
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.magnitude import graph_magnitudes
from superopt.interp.tolerance import check_output
from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.chained import chained_reductions, prefer_recompute
from superopt.schedule.default import FOLD_REDUCTIONS, build_sketch, default_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Recompute, ReduceEpilogue, trace_from_json, trace_to_json
from superopt.target import host_target


def em_shapes(b=2, x=5, k=3, i=6, o=4, r=4, p=8):
    return {"P": (b, x + k - 1, x + k - 1, i, r), "W": (k, k, i, o, r, p), "R": (b, o, x, x, i)}


def _run(shapes, trace_for):
    c = compile_op(EM, shapes, outputs=["MU", "VAR"])
    target = host_target(2)
    trace = trace_for(c, target)
    b = GraphBuilder("em")
    ins = [b.input(n, c.type_of[n].shape) for n in c.inputs]
    graph = b.build(b.add_compute(c, ins, "em", out_names=list(c.outputs)))
    (node,) = graph.nodes
    ex = GraphExecutor(graph, {node.name: trace}, ExecutorConfig(2, None, target))
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    feed[graph.inputs[2]] = np.abs(feed[graph.inputs[2]])  # routing weights are positive
    got, ref, mags = ex(feed), evaluate(graph, feed, np.float64), graph_magnitudes(graph, feed)
    for o in graph.outputs:
        check = check_output(o, got[o], ref[o], mags[o], 1e-4)
        assert check.ok, check.message
    return trace, ex, node.name


def _sketch(recompute: bool):
    def make(c, target):
        return build_sketch(c, target, frozenset(c.inputs), FOLD_REDUCTIONS, KnobRecorder({"D.recompute": recompute}))
    return make


def test_the_second_pass_is_a_chained_reduction():
    c = compile_op(EM, em_shapes(), outputs=["MU", "VAR"])
    assert chained_reductions(c) == {"D": "V"}  # N folds into V directly; D reads MU, computed after V


@pytest.mark.parametrize("shape", [em_shapes(), em_shapes(b=1, x=7, i=5, o=3, p=12)])
def test_recompute_folds_both_passes_and_matches_the_reference(shape):
    trace, ex, name = _run(shape, _sketch(True))
    assert Recompute("V", "D") in trace
    assert ReduceEpilogue("N", "V") in trace and ReduceEpilogue("D", "V_for_D") in trace
    assert not ex.memory.holding("V", name) and not ex.memory.holding("V_for_D", name)  # V never stored
    v_bytes = 4 * np.prod(shape["R"]) * shape["W"][5]
    assert all(buf.nbytes < v_bytes for buf in ex.memory.buffers)


@pytest.mark.parametrize("shape", [em_shapes(), em_shapes(b=1, x=7, i=5, o=3, p=12)])
def test_materialize_stores_v_once_and_matches_the_reference(shape):
    trace, ex, name = _run(shape, _sketch(False))
    assert not any(isinstance(p, Recompute) for p in trace)
    assert ReduceEpilogue("N", "V") in trace and not any(isinstance(p, ReduceEpilogue) and p.stage == "D"
                                                         for p in trace)
    assert [buf.tensors for buf in ex.memory.holding("V", name)] == [("V",)]  # one buffer the size of V


def test_the_default_picks_by_cost():
    c = compile_op(EM, em_shapes(), outputs=["MU", "VAR"])
    target = host_target(2)
    # 2 * kx*ky*r = 72 flops per element of V against 8 bytes written and read: recompute
    assert prefer_recompute(c, "V") and Recompute("V", "D") in default_schedule(c, target)
    assert not prefer_recompute(c, "V", flops_per_byte=4.0)  # a machine with 4 flops per byte stores V
    tr = build_sketch(c, target, frozenset(c.inputs), FOLD_REDUCTIONS)
    assert trace_from_json(trace_to_json(tr)) == tuple(tr)  # a record like every other


def test_an_illegal_recompute_is_rejected_with_a_reason():
    c = compile_op(EM, em_shapes(), outputs=["MU", "VAR"])
    target = host_target(2)
    with pytest.raises(ScheduleError, match="Rs is not a two-operand contraction"):
        lower(c, [Recompute("Rs", "VAR")], target)
    with pytest.raises(ScheduleError, match="MU does not read V"):
        lower(c, [Recompute("V", "MU")], target)
    with pytest.raises(ScheduleError, match="no stage"):
        lower(c, [Recompute("V", "Q")], target)


@pytest.mark.parametrize("shape", [em_shapes(), em_shapes(b=1, x=7, i=5, o=3, p=12)])
def test_merge_is_one_pass_and_matches_the_reference(shape):
    from rewrite_rules import RuleNotApplicable
    from rewrite_rules.moments import SHIFTED_MOMENTS
    from superopt.schedule.graph_defaults import default_schedules

    b = GraphBuilder("em")
    ins = {n: b.input(n.lower(), s) for n, s in shape.items()}
    graph = b.build(list(b.compute(EM, ins, "em", outputs=["MU", "VAR"])))
    merged = SHIFTED_MOMENTS.first(graph)
    (node,) = merged.nodes
    assert [s.out for s in node.op.statements if s.out.startswith("D")] == ["D_shift", "D_s1", "D_s2", "D"]
    target = host_target(2)
    schedules = default_schedules(merged, target)
    trace = schedules[node.name]
    assert ReduceEpilogue("D_s1", "V") in trace and ReduceEpilogue("D_s2", "V") in trace  # one pass over V
    ex = GraphExecutor(merged, schedules, ExecutorConfig(2, None, target))
    assert not ex.memory.holding("V", node.name)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    feed["r"] = np.abs(feed["r"])
    got, ref, mags = ex(feed), evaluate(graph, feed, np.float64), graph_magnitudes(graph, feed)
    for o in graph.outputs:
        check = check_output(o, got[o], ref[o], mags[o], 1e-4)
        assert check.ok, check.message
    with pytest.raises(RuleNotApplicable, match="no weighted variance"):
        SHIFTED_MOMENTS.apply(graph, ("em", "N"))


def test_the_graph_search_takes_the_one_pass_merge():
    """Under the graph cost a chained reduction costs its contraction twice (or its round trip), the merge
    neither: the pipeline's graph search rewrites EM routing to one pass, and the program matches."""
    from superopt.api import OptimizeConfig, define_op, optimize, random_inputs

    shapes = em_shapes()
    graph = define_op(EM, shapes)
    prog = optimize(graph, OptimizeConfig(threads=2))
    (node,) = prog.graph.nodes
    assert prog.report.rewrites >= 1 and not chained_reductions(node.op)  # nothing left for a second pass
    feed = random_inputs(graph, 0)
    feed["R"] = np.abs(feed["R"])
    got, ref, mags = prog.executor(feed), evaluate(graph, feed, np.float64), graph_magnitudes(graph, feed)
    check = check_output("VAR", got["VAR"], ref["VAR"], mags["VAR"], 1e-4)
    assert check.ok, check.message
