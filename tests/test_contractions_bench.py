"""The contraction benchmark's generator and harness on tiny cases: determinism by seed, the cases' invariants,
superopt's output on generated cases against the float64 reference, the roofline arithmetic, constant flagging."""

import argparse
import math

import numpy as np
import pytest

from benchmarks import contractions as bench
from benchmarks.contraction_cases import (
    LANES,
    MIB,
    contraction,
    default_cases,
    memory_bound_cases,
    named_cases,
    random_contraction,
    random_contractions,
)
from superopt.measure.roofline import Ceilings, bandwidth_fraction, geomean, is_constant, roofline

TINY = {"min_bytes": 2 << 10, "max_bytes": 24 << 10, "max_flops": 2e6}


def test_generator_is_deterministic_by_seed():
    a, b = random_contractions(6, seed=7, **TINY), random_contractions(6, seed=7, **TINY)
    assert a == b
    c = random_contractions(6, seed=8, **TINY)
    assert [x.equation for x in a] != [x.equation for x in c] or [x.extents for x in a] != [x.extents for x in c]


def test_generated_cases_keep_their_invariants():
    rng = np.random.default_rng(3)
    kw = {"min_bytes": 64 << 10, "max_bytes": 4 * MIB, "max_flops": 5e8}
    for i in range(40):
        case = random_contraction(rng, f"c{i}", **kw)
        a, b = case.operands
        assert all(2 <= len(op) <= 6 for op in case.operands) and 2 <= len(case.output) <= 6
        for op in (a, b, case.output):
            assert len(set(op)) == len(op)  # a permutation: every index once per operand
        reduced = set(a) & set(b)
        assert reduced and reduced.isdisjoint(case.output) and set(case.reduced) == reduced
        assert set(case.output) == (set(a) | set(b)) - reduced  # every free index is an output index
        assert set(a) - reduced and set(b) - reduced  # each operand keeps a free index
        assert not all(e % LANES == 0 for _, e in case.extents)
        assert all(e >= 2 for _, e in case.extents)
        sizes = case.operand_bytes
        assert kw["min_bytes"] <= min(sizes) and max(sizes) <= kw["max_bytes"]
        assert case.flops == 2 * math.prod(e for _, e in case.extents) <= kw["max_flops"]
        assert case.reduction_steps == math.prod(case.extent[i] for i in reduced)
        assert case.text.startswith(f"C[{','.join(case.output)}] += A[{','.join(a)}] * B[")
        assert case.equation == f"{''.join(a)},{''.join(b)}->{''.join(case.output)}"


def test_default_set_sizes_and_kinds():
    cases = default_cases()
    comp = [c for c in cases if c.kind == "contraction"]
    assert len(comp) >= 24 and all(min(c.operand_bytes) >= MIB and max(c.operand_bytes) <= 64 * MIB for c in comp)
    assert len({c.name for c in cases}) == len(cases)
    names = {c.name: c for c in named_cases()}
    assert names["kil_lkj"].text == "C[i,j] += A[k,i,l] * B[l,k,j]"
    assert names["imkn_jnlm"].text == "C[i,j,k,l] += A[i,m,k,n] * B[j,n,l,m]"
    assert {c.kind for c in memory_bound_cases()} == {"transpose", "reduction"}
    t = contraction("t", "ijk->kji", {"i": 2, "j": 3, "k": 4})
    assert (t.text, t.flops, t.bytes_moved, t.memory_bound) == ("B[k,j,i] = A[i,j,k]", 0, 2 * 4 * 24, True)
    with pytest.raises(ValueError, match="no extent for index k"):
        contraction("x", "ik,kj->ij", {"i": 2, "j": 3})


def test_roofline_arithmetic_on_a_known_input():
    # 1000^3 GEMM: 2e9 flops over 12 MB -> intensity 166.7 flop/byte
    c = Ceilings(fma_gflops=100.0, bandwidth_gbs=10.0, write_back=((64, 0.9), (256, 0.8), (1024, 0.5)))
    line = roofline(2e9, 12e6, c, reduction_steps=1000)
    assert line.intensity == pytest.approx(2e9 / 12e6)
    assert (line.gflops, line.limit) == (pytest.approx(50.0), "tile written back every 1024")
    assert line.fraction(40.0) == pytest.approx(0.8)
    assert roofline(2e9, 12e6, c, reduction_steps=100).limit == "tile written back every 64"
    assert roofline(2e9, 12e6, Ceilings(100.0, 10.0)).gflops == pytest.approx(100.0)  # no sweep: the FMA chains
    noisy = Ceilings(100.0, 10.0, ((256, 1.07),))  # a sweep reading above the chains is capped at them
    assert roofline(2e9, 12e6, noisy, reduction_steps=300).gflops == pytest.approx(100.0)
    low = roofline(1e8, 1e8, c, reduction_steps=64)  # intensity 1: 10 GFLOP/s from the bandwidth
    assert (low.gflops, low.limit) == (pytest.approx(10.0), "bandwidth")
    assert bandwidth_fraction(8e9, 1.0, 10.0) == pytest.approx(0.8)
    assert geomean([2.0, 8.0, math.nan]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="bytes"):
        roofline(1.0, 0, c)


def test_constant_outputs_are_flagged():
    assert is_constant(np.zeros((3, 4), np.float32)) and is_constant(np.full(5, np.nan))
    assert not is_constant(np.arange(4.0)) and not is_constant(np.ones(1))
    case = contraction("g", "ik,kj->ij", {"i": 3, "k": 5, "j": 4})
    ref = np.zeros((3, 4))
    assert bench.check(np.zeros((3, 4), np.float32), ref, case)["constant"]
    got = bench.check(np.ones((3, 4), np.float32), np.arange(12.0).reshape(3, 4), case)
    assert not got["ok"] and "relative error" in got["error"] and got["constant"]


def _args(**kw) -> argparse.Namespace:
    base = {"seed": 1, "threads": 1, "trials": 0, "tune_seconds": 0.0, "warmup": 1, "rounds": 1,
            "min_sample_s": 0.0, "settle_s": 0.0}
    return argparse.Namespace(**(base | kw))


@pytest.mark.parametrize("seed", [11, 12])
def test_superopt_matches_the_reference_on_generated_cases(seed):
    rng = np.random.default_rng(seed)
    for i in range(2):
        case = random_contraction(rng, f"tiny{i}", **TINY)
        x = case.inputs(seed)
        got = bench.superopt_default(case, 1)(*x)
        res = bench.check(got, bench.reference(case, x), case)
        assert res["ok"], (case.text, case.shapes, res)


def test_harness_runs_and_reports_a_case(tmp_path):
    from superopt.target import host_target

    target = host_target(1)
    ceilings = Ceilings(100.0, 10.0)
    probes = bench.make_probes(target, seconds=0.001, copy_bytes=1 << 20)
    cases = [contraction("kil_tiny", "kil,lkj->ij", {"k": 5, "i": 7, "l": 6, "j": 17}),
             contraction("sum_tiny", "ijk->ik", {"i": 3, "j": 9, "k": 17})]
    results = [bench.run_case(c, ceilings, probes, _args(), tmp_path / "db.jsonl") for c in cases]
    for r in results:
        assert not r.errors, r.errors
        assert {"superopt", "torch", "numpy", "tblis"} <= set(r.ms)
        assert all(r.checks[s]["ok"] and not r.checks[s]["constant"] for s in ("superopt", "torch", "numpy", "tblis"))
    comp, mem = results
    assert comp.roofline["limit"] in ("FMA chains", "bandwidth")
    assert comp.fraction["superopt"] == pytest.approx(comp.gflops["superopt"] / comp.roofline["gflops"])
    assert mem.fraction["superopt"] == pytest.approx(mem.gbs["superopt"] / 10.0)
    s = bench.summary(results)
    assert s["contractions"] == 1 and s["memory_bound"] == 1 and "default >= 65% of roofline" in s["goals"]
    md = bench.markdown(results, {"cpu": "x", "threads": 1, "versions": "v", "timing": "t", "tuning": "none",
                                  "omp_wait_policy": "default", "load_start": [0], "command": "c",
                                  "ceilings": {"fma_gflops": 100.0, "bandwidth_gbs": 10.0, "write_back": []}}, s)
    assert "| kil_tiny |" in md and "| sum_tiny |" in md


def test_tuned_superopt_matches_the_reference(tmp_path):
    case = contraction("kil_tune", "kil,lkj->ij", {"k": 3, "i": 5, "l": 4, "j": 19})
    x = case.inputs(2)
    prog, info = bench.superopt_tuned(case, 1, trials=3, tune_seconds=None, database=tmp_path / "db.jsonl", seed=0)
    assert info["tune"]["measured"] >= 1
    got = prog.executor(dict(zip(prog.graph.inputs, x, strict=True)))[prog.graph.outputs[0]]
    assert bench.check(got, bench.reference(case, x), case)["ok"]


def test_search_outcomes_count_ties_by_schedule_not_by_time():
    def row(name, default_ms, tuned_ms, same):
        r = bench.CaseResult({"name": name, "kind": "contraction"})
        r.ms = {"superopt": default_ms, "superopt_tuned": tuned_ms}
        r.tune = {"same_schedules_as_default": same}
        return r

    # a kept schedule is a tie even where its second timing differs; a changed one wins or loses by its time
    rows = [row("a", 1.0, 0.8, False), row("b", 1.0, 1.3, True), row("c", 1.0, 1.1, False), row("d", 1.0, 0.9, True)]
    assert bench.search_outcomes(rows) == "1 wins, 2 ties (the default's schedules kept), 1 losses"


def test_a_kept_schedule_is_recognised_and_timed_once(tmp_path):
    case = contraction("kil_keep", "kil,lkj->ij", {"k": 3, "i": 5, "l": 4, "j": 19})
    x = case.inputs(2)
    default = bench.superopt_default(case, 1).program(*x)
    prog, _ = bench.superopt_tuned(case, 1, trials=1, tune_seconds=None, database=tmp_path / "db.jsonl", seed=0)
    # one measurement is the default's own: the search keeps it, and the two programs' schedules compare equal
    assert bench.schedules_of(prog) == bench.schedules_of(default)
    assert bench.schedules_of(default) and all(s != "()" for s in bench.schedules_of(default))


def test_the_memory_bound_filter_selects_the_transpositions_and_sums_only():
    args = argparse.Namespace(quick=False, seed=bench.DEFAULT_SEED, random=3, cases="", memory_bound=True)
    got = bench.select(args)
    assert got and all(c.memory_bound for c in got)
    assert {c.name for c in got} == {c.name for c in memory_bound_cases()}
    both = bench.select(argparse.Namespace(quick=False, seed=bench.DEFAULT_SEED, random=3, cases="gemm,transpose_kji",
                                           memory_bound=True))
    assert [c.name for c in both] == ["transpose_kji"]


def test_the_default_schedules_comparison_times_two_programs_of_one_contraction_that_agree(kernel_cache):
    """benchmarks/contraction_defaults.py runs both checkouts' programs of a contraction on the same inputs: two
    programs with different kernels (here the op as compiled, its output dims merged into one by a reshape, and the
    statement as written with its register tile and packs left out) must give the same output, each timed."""
    import numpy as np

    import superopt
    from benchmarks.contraction_defaults import _kernels, render, time_pair
    from superopt.builder import GraphBuilder
    from superopt.schedule.primitives import Parallel, trace_to_json

    text, shapes = "C[k,j,i] += A[j,i,r] * B[k,r]", [[3, 10, 40], [50, 40]]
    u = superopt.op(text, threads=2, verify=False)
    prog = u.program(*[np.zeros(s, np.float32) for s in shapes])
    this = (prog.executor.graph, {n: trace_to_json(t) for n, t in prog.executor.traces.items()})
    (kernel,) = (n for n in this[0].nodes if not n.is_extern)
    assert this[0].type_of[kernel.outputs[0]].shape == (50, 30)  # j, i as one dim
    c = u.compute([tuple(s) for s in shapes])
    b = GraphBuilder("plain")
    ins = [b.input(n, c.type_of[n].shape, c.type_of[n].dtype) for n in c.inputs]
    graph = b.build(b.add_compute(c, ins, "k", out_names=list(c.outputs)))
    node = next(n for n in graph.nodes if not n.is_extern).name
    plain = (graph, {node: trace_to_json([Parallel("C", "k")])})  # (no tile, no pack)
    cases = [{"graph": g, "traces": t} for g, t in (plain, this)]
    assert _kernels(cases[0]) != _kernels(cases[1])
    r = time_pair(shapes, {"baseline": plain, "this": this}, 2, 1)
    assert r["baseline_s"] > 0 and r["this_s"] > 0 and r["max_rel_diff"] < 1e-5, r
    speedup = r["baseline_s"] / r["this_s"]
    table = render({"cpu": "x", "threads": 2, "seed": 7, "random": 1, "rounds": 1, "tie": 0.03,
                    "baseline_name": "before", "changed": {"c0": r | {"text": text, "shapes": shapes, "speedup": speedup}},
                    "summary": {"geomean": speedup, "wins": int(speedup > 1.03), "losses": int(speedup < 0.97),
                                "ties": int(abs(speedup - 1) <= 0.03), "max_rel_diff": r["max_rel_diff"]}})
    assert "1 of 1 kernels differ" in table and f"{speedup:.2f}x" in table
