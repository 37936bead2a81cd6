"""The in-graph confirmation (search/graph/confirm.py): picks timed against their defaults inside the graph."""

from __future__ import annotations

import numpy as np

from search.graph.confirm import InGraphConfig, confirm_in_graph
from search.schedule.database import TuningDatabase, TuningRecord, schedules_from_database
from superopt.builder import GraphBuilder
from superopt.ir.canonical import canonicalize_kernels, workload_key
from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.graph_defaults import constant_inputs, default_schedules
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import host_target

# the suite's thread count: building a library sets the process's OpenMP thread count, which torch shares
# (a test on 1 thread made a later torch.compile test in the same worker fail dynamo's global-state check)
TARGET = host_target(2)
# small enough that every kernel runs on one thread (ExecutorConfig.serial_below): with 2-thread parallel
# regions, a loaded CI machine (the suite runs on 2 workers) made the default wait for its second thread
# longer than the scalar loops took
N = 80


def _graph():
    """A matmul against a constant weight, then tanh: two kernels."""
    b = GraphBuilder("two")
    x = b.input("X", (N, N))
    w = b.constant(np.random.default_rng(0).standard_normal((N, N)).astype(np.float32), "W")
    (h,) = b.add_compute(compile_op("C[i,j] += A[i,k] * B[k,j]", {"A": (N, N), "B": (N, N)}), [x, w], "mm")
    y = b.compute1("Y[i,j] = tanh(H[i,j])", {"H": h}, "act")
    return canonicalize_kernels(b.build([y]))


def _mm(graph):
    node = next(n for n in graph.nodes if n.name == "mm")
    consts = constant_inputs(graph, node)
    return node, consts, workload_key(node.op, consts)


def test_a_pick_slower_inside_the_graph_goes_back_to_its_default(tmp_path):
    """The database holds a kernel-alone reading that makes the unscheduled matmul (scalar loops) the best;
    inside the graph it is several times slower than the default, so after the in-graph confirmation the
    database's best is the default again and the graph runs the default's code."""
    g = _graph()
    node, consts, key = _mm(g)
    default = tuple(default_schedules(g, TARGET)["mm"])
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([TuningRecord.of(node.op, default, TARGET, "OK", 1e-3, consts),
            TuningRecord.of(node.op, (), TARGET, "OK", 1e-6, consts)])  # a lucky (false) reading
    assert db.best(key, TARGET).trace == ()
    rep = confirm_in_graph(g, TARGET, db, config=InGraphConfig(rounds=7, warmup=1))
    (k,) = rep.kernels
    assert k.nodes == ["mm"] and k.ratio > 2 and not k.kept and rep.kept == 0
    assert k.pick_s > 2 * k.default_s and rep.picks_s > rep.defaults_s
    assert "0 of 1 tuned kernels faster than their default inside the graph" in rep.stop_reason
    inside = [r for r in db.records(key, TARGET) if r.in_graph]
    assert len(inside) == 2 * 7 and all(r.paired_default_s is not None for r in inside)
    assert all(r.median_s == r.paired_default_s for r in inside if r.trace == default)
    best = db.best(key, TARGET)
    assert best.trace == default and best.in_graph
    assert schedules_from_database(g, TARGET, db)[0]["mm"] == list(default)
    # the records survive a reload (JSON round trip) with their in-graph flag
    again = TuningDatabase(tmp_path / "db.jsonl")
    assert again.best(key, TARGET).trace == default and sum(r.in_graph for r in again.records()) == 14
    # ... and the graph built from the database computes what the reference does
    ex = GraphExecutor(g, default_schedules(g, TARGET) | schedules_from_database(g, TARGET, again)[0],
                       ExecutorConfig(2, target=TARGET))
    x = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
    w = dict(g.constants)["W"].array
    np.testing.assert_allclose(ex({"X": x})[g.outputs[0]], np.tanh(x @ w), rtol=1e-4, atol=1e-4)


def test_nothing_to_confirm_when_every_pick_is_the_default(tmp_path):
    g = _graph()
    node, consts, key = _mm(g)
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([TuningRecord.of(node.op, tuple(default_schedules(g, TARGET)["mm"]), TARGET, "OK", 1e-3, consts)])
    rep = confirm_in_graph(g, TARGET, db, config=InGraphConfig(rounds=3))
    assert rep.kernels == [] and "no kernel's database pick differs" in rep.stop_reason and len(db) == 1


def test_in_graph_records_outrank_kernel_alone_ones(tmp_path):
    """best() decides among the in-graph pairs alone once there are any: a schedule faster alone but
    slower in the graph loses to one that is faster in the graph."""
    g = _graph()
    node, consts, key = _mm(g)
    default = tuple(default_schedules(g, TARGET)["mm"])
    db = TuningDatabase(tmp_path / "db.jsonl")
    rec = lambda tr, s, pair=None, inside=False: TuningRecord.of(node.op, tr, TARGET, "OK", s, consts,  # noqa: E731
                                                                 paired_default_s=pair, in_graph=inside)
    db.add([rec(default, 2e-3, 2e-3), rec((), 1e-3, 2e-3)])  # alone (confirmed): () is 2x faster
    assert db.best(key, TARGET).trace == ()
    db.add([rec(default, 3e-3, 3e-3, True), rec((), 4e-3, 3e-3, True)])  # in the graph: () is slower
    best = db.best(key, TARGET)
    assert best.trace == default and best.median_s == 3e-3
    # an in-graph flag needs a pair to mean anything: an unpaired one is an ordinary record
    assert not rec((), 1e-3, None, True).in_graph and '"in_graph"' not in rec((), 1e-3).to_json()


def _runner_up_db(tmp_path, runner_ratio: float):
    """A lucky (false) kernel-alone reading makes the scalar loops the pick; a schedule of the matmul's space
    other than the default, confirmed next to the default alone at ``runner_ratio``, is the runner-up."""
    g = _graph()
    node, consts, key = _mm(g)
    default = tuple(default_schedules(g, TARGET)["mm"])
    space = ScheduleSpace(node.op, TARGET, consts)
    point = space.default_point()
    rows = next(k for k in space.resolve(point)[1] if k.endswith(".rows"))
    runner = tuple(space.trace(Point.of(point.sketch, {rows: 2})))
    assert runner != default
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([TuningRecord.of(node.op, default, TARGET, "OK", 1e-3, consts, paired_default_s=1e-3),
            TuningRecord.of(node.op, (), TARGET, "OK", 1e-6, consts, paired_default_s=1e-3),
            TuningRecord.of(node.op, runner, TARGET, "OK", runner_ratio * 1e-3, consts, paired_default_s=1e-3)])
    return g, key, default, runner, db


def test_a_pick_that_lost_inside_the_graph_gives_its_runner_up_a_second_pass(tmp_path):
    g, key, default, runner, db = _runner_up_db(tmp_path, 0.5)
    assert [r.trace for _, r in db.confirmed_alone(key, TARGET)] == [(), runner, default]
    rep = confirm_in_graph(g, TARGET, db, config=InGraphConfig(rounds=5, warmup=1))
    first, second = rep.kernels
    assert not first.runner_up and not first.kept and first.ratio > 2  # the scalar loops lost
    assert second.runner_up and second.nodes == ["mm"]
    assert "runner-ups of the others" in rep.stop_reason and rep.kept == int(second.kept)
    inside = [r for r in db.records(key, TARGET) if r.in_graph]
    assert sum(r.trace == runner for r in inside) == 5 and sum(r.trace == default for r in inside) == 10
    # the database now decides among the three by their in-graph ratios: the runner-up where it won there
    assert db.best(key, TARGET).trace == (runner if second.kept else default)
    ex = GraphExecutor(g, default_schedules(g, TARGET) | schedules_from_database(g, TARGET, db)[0],
                       ExecutorConfig(2, target=TARGET))
    x = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
    np.testing.assert_allclose(ex({"X": x})[g.outputs[0]], np.tanh(x @ dict(g.constants)["W"].array),
                               rtol=1e-4, atol=1e-4)


def test_no_runner_up_without_one_confirmed_faster_alone_or_without_the_time(tmp_path):
    g, key, default, runner, db = _runner_up_db(tmp_path / "slow", 1.2)  # slower than the default alone
    rep = confirm_in_graph(g, TARGET, db, config=InGraphConfig(rounds=3, warmup=1))
    assert [k.runner_up for k in rep.kernels] == [False] and "runner-up" not in rep.stop_reason
    g, key, default, runner, db = _runner_up_db(tmp_path / "late", 0.5)
    rep = confirm_in_graph(g, TARGET, db, config=InGraphConfig(rounds=3, warmup=1, time_s=1e-6))
    # the budget is kept: the programs were not compiled (or not timed) past it, and nothing was judged
    assert rep.kernels == [] and "time budget" in rep.stop_reason, rep.stop_reason
    assert not any(r.in_graph for r in db.records(key, TARGET))
