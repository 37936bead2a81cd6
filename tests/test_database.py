"""The tuning database: round trip, rename-invariant hits, corrupt lines skipped, concurrent writers,
targets kept apart, and the database schedule pass over a graph."""

from __future__ import annotations

import dataclasses
import multiprocessing
import warnings

import numpy as np
import pytest

from search.schedule.database import TuningDatabase, TuningRecord, node_workload_key, schedules_from_database
from superopt.api import define_op
from superopt.interp import evaluate
from superopt.ir.canonical import canonicalize, canonicalize_kernels, workload_key
from superopt.lang import compile_op
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule import Reorder, Split, Vectorize
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import Target, host_target

MM_A = "C[i,j] += A[i,k] * B[k,j]"
MM_B = "Out[row,col] += Lhs[row,red] * Rhs[red,col]"
SHAPES_A = {"A": (8, 32), "B": (32, 16)}
SHAPES_B = {"Lhs": (8, 16), "Rhs": (16, 16)}
# a trace in the canonical names: out0[d0,d1] += in0[d0,d2] * in1[d2,d1]
TRACE = (Split("out0", "d1", 8), Reorder("out0", ("d0", "d1_o", "d2", "d1_i")), Vectorize("out0", "d1_i"))
TARGET = Target(cpu_model="test cpu", cores=2, threads=1)


def _canon(src=MM_A, shapes=None):
    return canonicalize(compile_op(src, shapes or SHAPES_A))


def _rec(median, code="OK", trace=TRACE, target=TARGET, compute=None, ts=None):
    return TuningRecord.of(compute or _canon(), trace, target, code, median, (), ts)


def test_round_trip_and_best(tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    assert len(db) == 0 and db.best("nope", TARGET) is None
    recs = [_rec(3e-3), _rec(1e-3, trace=TRACE[:2]), _rec(None, "WRONG_ANSWER"), _rec(2e-3, trace=())]
    db.add(recs[:2])
    db.add(recs[2:])
    again = TuningDatabase(tmp_path / "db.jsonl")
    assert again.records() == recs
    key = recs[0].workload_key
    assert key == workload_key(_canon())
    assert again.best(key, TARGET) == recs[1] and again.best(key, TARGET.key()) == recs[1]
    assert again.measured(key, TARGET) == 4
    assert again.records(key, TARGET) == recs
    # a failed candidate never counts as a best, whatever its fields say
    assert not recs[2].ok and recs[2].median_s is None
    # records parse back into their canonical compute
    from superopt.lang.parser import parse_compute

    assert parse_compute(recs[0].workload_text) == _canon()
    with pytest.raises(ValueError, match="canonical"):
        TuningRecord.of(compile_op(MM_A, SHAPES_A), TRACE, TARGET, "OK", 1e-3)


def test_a_record_for_one_naming_applies_to_the_other(tmp_path, kernel_cache):
    db = TuningDatabase(tmp_path / "db.jsonl")
    target = host_target(1)
    graph_a = canonicalize_kernels(define_op(MM_A, SHAPES_A))
    (node_a,) = graph_a.nodes
    db.add([TuningRecord.of(node_a.op, TRACE, target, "OK", 1e-4)])
    # the same op in other names (its weight-free graph: both inputs are run-time)
    graph_b = canonicalize_kernels(define_op(MM_B, {"Lhs": (8, 32), "Rhs": (32, 16)}))
    assert node_workload_key(graph_b, graph_b.nodes[0].name) == node_workload_key(graph_a, node_a.name)
    scheds, hits = schedules_from_database(graph_b, target, db)
    assert hits == [graph_b.nodes[0].name] and scheds[hits[0]] == list(TRACE)
    # the canonical trace compiles and runs on the renamed graph
    ex = GraphExecutor(graph_b, scheds, ExecutorConfig(1, kernel_cache, target))
    rng = np.random.default_rng(0)
    feed = {"Lhs": rng.standard_normal((8, 32)).astype(np.float32),
            "Rhs": rng.standard_normal((32, 16)).astype(np.float32)}
    np.testing.assert_allclose(ex(feed)[graph_b.outputs[0]], evaluate(graph_b, feed)[graph_b.outputs[0]],
                               rtol=1e-4, atol=1e-4)
    # a different shape is another workload: no hit
    other = canonicalize_kernels(define_op(MM_B, SHAPES_B))
    assert schedules_from_database(other, target, db) == ({}, [])
    # uncanonical kernels are refused (their traces would not apply)
    with pytest.raises(ValueError, match="canonicalize_kernels"):
        schedules_from_database(define_op(MM_A, SHAPES_A), target, db)


def test_constness_is_part_of_the_key(tmp_path):
    from superopt.builder import GraphBuilder

    b = GraphBuilder("w")
    x = b.input("x", (8, 32))
    w = b.constant(np.ones((32, 16), np.float32), "w")
    g = canonicalize_kernels(b.build([b.compute1(MM_A, {"A": x, "B": w}, "mm")]))
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([_rec(1e-4, target=TARGET)])  # recorded with both inputs at run time
    assert schedules_from_database(g, TARGET, db) == ({}, [])
    db.add([TuningRecord.of(g.nodes[0].op, TRACE, TARGET, "OK", 2e-4, {"in1"})])
    assert schedules_from_database(g, TARGET, db)[1] == ["mm"]


def test_other_target_is_no_hit(tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([_rec(1e-3)])
    key = workload_key(_canon())
    other = dataclasses.replace(TARGET, threads=2)
    assert db.best(key, other) is None and db.measured(key, other) == 0
    assert db.best(key, TARGET) is not None and db.measured(key, TARGET) == 1
    g = canonicalize_kernels(define_op(MM_A, SHAPES_A))
    assert schedules_from_database(g, other, db, check=False) == ({}, [])


def test_corrupt_lines_anywhere_are_skipped_with_a_warning(tmp_path):
    path = tmp_path / "db.jsonl"
    good = [_rec(1e-3 * (i + 1)) for i in range(4)]
    lines = [r.to_json() for r in good]
    text = "\n".join(["{not json", lines[0], lines[1][:40], lines[2], "[1, 2]",
                      lines[3].replace('"version": 1', '"version": 7'), "[" * 100000, lines[3]]) + "\n"
    path.write_text(text)
    db = TuningDatabase(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = db.records()
    assert recs == [good[0], good[2], good[3]]
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 5, msgs
    for line_no, m in zip((1, 3, 5, 6, 7), msgs, strict=True):
        assert f"{path}:{line_no}:" in m and "corrupt" in m
    # a writer killed mid-line: readers wait for the newline, the next writer ends that line first
    with open(path, "a") as f:
        f.write(lines[0][:30])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(db) == 3
    db.add([good[1]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert db.records()[-1] == good[1] and len(db) == 4
    assert len(caught) == 1 and f"{path}:9:" in str(caught[0].message)
    # a missing file is an empty database
    assert TuningDatabase(tmp_path / "none.jsonl").records() == []


def test_readers_see_other_writers(tmp_path):
    path = tmp_path / "db.jsonl"
    reader, writer = TuningDatabase(path), TuningDatabase(path)
    assert len(reader) == 0
    writer.add([_rec(2e-3)])
    assert len(reader) == 1
    writer.add([_rec(1e-3, trace=())])
    assert reader.best(workload_key(_canon()), TARGET).trace == ()
    path.unlink()  # replaced from scratch
    writer.add([_rec(5e-3)])
    assert [r.median_s for r in reader.records()] == [5e-3]


def _writer(args):
    path, proc = args
    db = TuningDatabase(path)
    for i in range(40):
        db.add([_rec(1e-3 + proc * 1e-5 + i * 1e-7, ts=float(proc * 1000 + i * 3 + k)) for k in range(3)])
    return proc


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "db.jsonl"
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        assert sorted(pool.map(_writer, [(path, p) for p in range(4)])) == [0, 1, 2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one torn line
        recs = TuningDatabase(path).records()
    assert len(recs) == 4 * 40 * 3
    assert sorted(r.timestamp for r in recs) == sorted(float(p * 1000 + i * 3 + k) for p in range(4)
                                                       for i in range(40) for k in range(3))
    # each add is one contiguous block of its 3 records
    for j in range(0, len(recs), 3):
        t = recs[j].timestamp
        assert [r.timestamp for r in recs[j:j + 3]] == [t, t + 1, t + 2]


def test_database_schedules_complete_with_defaults(tmp_path):
    g = canonicalize_kernels(define_op(MM_A, SHAPES_A))
    target = host_target(1)
    db = TuningDatabase(tmp_path / "db.jsonl")
    scheds, hits = schedules_from_database(g, target, db)
    assert hits == []
    full = default_schedules(g, target) | scheds
    assert set(full) == {n.name for n in g.nodes if not n.is_extern}


def _paired(median, trace, pair):
    """A confirmation record: ``trace`` took ``median`` in a round where the default took ``pair``."""
    return TuningRecord.of(_canon(), trace, TARGET, "OK", median, (), None, paired_default_s=pair)


def test_confirmed_leaders_are_ranked_by_their_ratio_to_the_default_in_the_same_round(tmp_path):
    """A machine whose speed drifts: the leader (truly 5% slower than the default) read fast in the search and
    in a quiet confirmation round, the default slow in the search. Medians of absolute times would pick the
    leader; ratios within each round pick the default. An unconfirmed trace's one lucky reading never wins
    once the workload has confirmation rounds."""
    default, leader, other = TRACE[:2], TRACE, ()
    db = TuningDatabase(tmp_path / "db.jsonl")

    db.add([_rec(1.5e-3, trace=default), _rec(0.63e-3, trace=leader), _rec(0.1e-3, trace=other)])  # the search
    key = workload_key(_canon())
    assert db.best(key, TARGET).trace == other  # without confirmation: the fastest median
    db.add([_paired(0.6e-3, default, 0.6e-3), _paired(0.63e-3, leader, 0.6e-3)])  # a quiet round
    db.add([_paired(1.5e-3, default, 1.5e-3), _paired(1.575e-3, leader, 1.5e-3)])  # a busy round
    best = TuningDatabase(tmp_path / "db.jsonl").best(key, TARGET)
    assert best.trace == default and best.median_s == pytest.approx(1.05e-3)  # the default's median in the rounds
    assert np.median([r.median_s for r in db.records() if r.trace == leader]) < best.median_s  # (what medians said)
    # the pairing survives the file; records without it (older files) still load
    back = TuningRecord.from_json(_paired(2e-3, leader, 1e-3).to_json())
    assert back.paired_default_s == 1e-3 and "paired_default_s" not in _rec(1e-3).to_json()
    bad = _paired(2e-3, leader, 1e-3).to_json().replace('"paired_default_s": 0.001', '"paired_default_s": -1')
    with pytest.raises(ValueError, match="paired_default_s"):
        TuningRecord.from_json(bad)


@pytest.mark.parametrize("ratio, replaces", [(0.99, False), (0.981, False), (0.95, True)])
def test_a_confirmed_schedule_replaces_the_default_only_by_more_than_the_noise(tmp_path, ratio, replaces):
    """Paired ratios are medians of a few rounds on a shared machine: a schedule confirmed 1% faster than the
    default stays behind it (MIN_GAIN = 2%), one confirmed 5% faster replaces it; without the default's own
    paired records (it failed there) the fastest ratio wins."""
    from search.schedule.database import MIN_GAIN

    default, leader = TRACE[:2], TRACE
    assert MIN_GAIN == 0.02
    db = TuningDatabase(tmp_path / "db.jsonl")

    for t in (1.0e-3, 1.2e-3):
        db.add([_paired(t, default, t), _paired(ratio * t, leader, t)])
    key = workload_key(_canon())
    assert (db.best(key, TARGET).trace == leader) == replaces
    alone = TuningDatabase(tmp_path / "alone.jsonl")
    alone.add([_paired(ratio * 1e-3, leader, 1e-3)])
    assert alone.best(key, TARGET).trace == leader
