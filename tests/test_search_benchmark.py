"""benchmarks/search.py without running a search: its workloads at tiny sizes against torch, the
schedules it reads back from a tuning database, rooflines, settings and the report writer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import search as bench
from benchmarks.search_workloads import SEARCH_WORKLOADS, build_sgemm
from superopt.interp import evaluate
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import host_target


@pytest.mark.parametrize("spec", SEARCH_WORKLOADS, ids=lambda s: s.name)
def test_tiny_workload_matches_torch(spec):
    w = spec.tiny()
    (out,) = evaluate(w.graph, w.feeds, np.float64).values()
    ref = w.instance.reference  # torch eager module run in float64
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-9)
    assert w.flops > 0 and w.memory_bytes > 0
    assert len(w.graph.inputs) == len(w.instance.inputs)


def test_workload_flops_and_memory_bound():
    names = {s.name for s in SEARCH_WORKLOADS}
    assert names == {"sgemm", "capsule_votes", "resnet_conv3x3", "resnet_conv1x1", "depthwise_conv3x3", "softmax",
                     "attention"}
    w = build_sgemm(8, 5, 12)
    assert w.flops == 2 * 8 * 5 * 12 and w.memory_bytes == 4 * (8 * 5 + 5 * 12 + 8 * 12)
    tiny = {s.name: s.tiny() for s in SEARCH_WORKLOADS}
    assert {n for n, w in tiny.items() if w.memory_bound} == {"softmax", "depthwise_conv3x3"}
    assert "weight" in tiny["resnet_conv3x3"].graph.constant and "W" in tiny["capsule_votes"].graph.constant


def test_schedules_read_back_in_measurement_order(tmp_path):
    from search.schedule.database import TuningDatabase, TuningRecord

    target = host_target(2)
    graph = bench.prepare_graph(build_sgemm(16, 8, 16))[0]
    default = default_schedules(graph, target)
    (node,) = default
    op = graph.nodes[0].op
    slow, mid, fast = tuple(default[node]), tuple(default[node][:-1]), tuple(default[node][:-2])
    db = TuningDatabase(tmp_path / "db.jsonl")
    db.add([TuningRecord.of(op, slow, target, "OK", 3.0), TuningRecord.of(op, (), target, "TIMEOUT"),
            TuningRecord.of(op, mid, target, "OK", 2.0), TuningRecord.of(op, fast, target, "OK", 1.0)])
    for n, trace, est in ((2, slow, 3.0), (3, mid, 2.0), (4, fast, 1.0)):
        sched, s = bench.schedules_after(graph, db, target, n, default)
        assert tuple(sched[node]) == trace and s == est
    sched, s = bench.schedules_after(graph, db, target, 0, default)
    assert sched == default and math.isnan(s)
    kernels = [SimpleNamespace(nodes=[node], best_trace=mid, default_s=3.0, best_s=2.0)]
    assert tuple(bench.schedules_from_kernels(graph, kernels, default)[node]) == mid
    assert bench.kernel_estimate(kernels, "best_s") == 2.0
    naive = [SimpleNamespace(nodes=[node], best_trace=(), default_s=3.0, best_s=2.0)]  # the empty trace is a schedule
    assert bench.schedules_from_kernels(graph, naive, default)[node] == []
    unmeasured = [SimpleNamespace(nodes=[node], best_trace=(), default_s=None, best_s=None)]
    assert bench.schedules_from_kernels(graph, unmeasured, default) == default
    assert bench.kernel_estimate(unmeasured, "best_s") is None
    assert bench.schedule_key(default) != bench.schedule_key({node: list(mid)})


def test_roofline_fractions():
    w = SimpleNamespace(flops=2e9, memory_bytes=int(1e8), memory_bound=True)
    r = bench.roofline(w, {"x": {"median_s": 0.01}}, peak_gflops=400.0, dram_gbs=20.0, footprint_gbs=40.0)["x"]
    assert r["gflops"] == pytest.approx(200.0) and r["fma_fraction"] == pytest.approx(0.5)
    assert r["dram_fraction"] == pytest.approx(0.5) and r["footprint_fraction"] == pytest.approx(0.25)
    assert "tile_fraction" not in r  # a memory-bound workload is not held to the register tile
    r = bench.roofline(w, {"x": {"median_s": 0.01}}, 400.0, 20.0, 40.0, footprint_bestof_gbs=50.0)["x"]
    assert r["footprint_fraction"] == pytest.approx(0.25) and r["footprint_bestof_fraction"] == pytest.approx(0.2)
    gemm = SimpleNamespace(flops=2e9, memory_bytes=int(1e7), memory_bound=False)
    r = bench.roofline(gemm, {"x": {"median_s": 0.01}}, 400.0, 20.0, None, tile_gflops=250.0)["x"]
    assert r["tile_fraction"] == pytest.approx(0.8) and "dram_fraction" not in r


def test_settings():
    s = bench.settings_from(bench.parse_args(["--quick"]))
    assert (s["trials"], s["early"], s["rounds"]) == (48, 16, 5)
    s = bench.settings_from(bench.parse_args(["--trials", "10"]))
    assert (s["trials"], s["early"]) == (10, 10)
    assert bench.settings_from(bench.parse_args([]))["trials"] == 200


def _synthetic_report() -> dict:
    times = {"default": 2e-3, "search@early": 1.5e-3, "search@final": 1e-3, "random@final": 1.6e-3,
             "eager": 4e-3, "onnxruntime": 1.2e-3}
    timed = {k: {"median_s": v, "min_s": v * 0.9, "samples_s": [v], "calls_per_sample": 10} for k, v in times.items()}
    timed["search@early"] = dict(timed["search@final"])  # identical schedules: the same timing
    w = SimpleNamespace(flops=4e8, memory_bytes=int(4e7), memory_bound=True)
    kernel = {"nodes": ["softmax"], "failures": {"TIMEOUT": 2}, "measured": 200}
    row = {"workload": "softmax", "description": "softmax [4096,1024]", "flops": 4e8, "memory_bytes": int(4e7),
           "memory_bound": True, "times": timed, "rel_errors": {k: 1e-7 for k in times},
           "same_as": {"default": "default", "search@early": "search@final", "search@final": "search@final",
                       "random@final": "random@final"}, "fma_ceiling_alternating_gflops": 200.0,
           "roofline": bench.roofline(w, timed, 200.0, 16.0, 40.0), "kernels": 1,
           "estimates_s": {"default": 1.9e-3, "search@early": 1.4e-3, "search@final": 0.9e-3, "random@final": None},
           "evolutionary": {"kernels": [kernel], "measured": 200, "stop_reason": "trial budget spent"},
           "random": {"kernels": [kernel], "measured": 200, "stop_reason": "trial budget spent"}}
    machine = {"cpu": "Test CPU", "threads": 2, "load_start": "0.50", "load_end": "0.70",
               "fma": {"gflops": 190.0, "gflops_1t": 100.0, "ceiling_gflops": 200.0, "threads": 2,
                       "vector_bits": 256, "accumulators": 12},
               "bandwidth": {"triad_gbs": 16.0, "array_bytes": 128 << 20},
               "tile_write_back": [{"steps": 64, "alone_fma_fraction": 0.97, "written_back_fma_fraction": 0.92},
                                   {"steps": 1024, "alone_fma_fraction": 0.86, "written_back_fma_fraction": 0.84}]}
    settings = {"quick": False, "trials": 200, "early": 64, "seed": 0, "rounds": 15, "min_sample_s": 0.1}
    return {"date": "2026-01-01 00:00 UTC", "settings": settings, "machine": machine,
            "workloads": [row, {"workload": "attention", "error": "RuntimeError: boom"}]}


def test_report_writer(tmp_path):
    report = _synthetic_report()
    bench.write_report(tmp_path, report)
    md = (tmp_path / "search.md").read_text()
    assert json.loads((tmp_path / "search.json").read_text())["workloads"][0]["workload"] == "softmax"
    assert "| workload | MFLOP | default | search@64 | search@200 | random@200 | torch eager | onnxruntime |" in md
    assert "| softmax | 400.0 | 2.000 | 1.000= | 1.000 | 1.600 | 4.000 | 1.200 |" in md
    assert "| softmax | 2.00x | 1.00x | 1.60x | 4.00x | 1.20x |" in md  # ratios over search@200
    # 400 MFLOP in 1 ms = 400 GFLOP/s... of a 200 GFLOP/s ceiling; 40 MB at 16 GB/s = 2.5 ms = 250% of 1 ms
    assert "| softmax | 10.0 | 200 | 200.0 | 400.0 | 333.3 | 200% | - | 250% | 100% |" in md  # (memory-bound: no tile %)
    assert "| softmax | 1 | 2.000 | 1.900 | 0.900 | - | 200 / 200 | TIMEOUT 2; TIMEOUT 2 | trial budget spent | 1.0e-07 |" in md
    assert "| attention | error: RuntimeError: boom |" in md
    assert "FMA 190 GFLOP/s" in md and "16.0 GB/s" in md
    assert "written back every N reduction steps" in md and "N=64 0.92, N=1024 0.84 of the chains" in md


def test_a_memory_bound_workload_is_timed_beside_its_footprint_copy():
    """A memory-bound row times the copy of its own footprint in the same rounds as its kernels (its bound is
    that copy's median), a compute-bound row does not; both time the FMA probe."""
    from benchmarks import timing
    from benchmarks.search_workloads import SEARCH_WORKLOADS_BY_NAME

    cfg = timing.TimingConfig(warmup_calls=1, rounds=2, min_sample_s=0.001)
    target = host_target(2)
    for name, bound in (("softmax", True), ("sgemm", False)):
        w = SEARCH_WORKLOADS_BY_NAME[name].tiny()
        graph, _ = bench.prepare_graph(w)
        times, errors, status, _, ceiling, copy_gbs = bench.time_workload(
            w, graph, {"default": default_schedules(graph, target)}, target, cfg)
        assert status["default"] == "ok" and errors["default"] < 1e-5 and times["default"]["median_s"] > 0
        assert ceiling > 0 and bench.FMA_PROBE not in times and bench.COPY_PROBE not in times
        assert (copy_gbs is not None and copy_gbs > 0) if bound else copy_gbs is None


def test_outcomes_tell_wins_ties_and_losses_apart():
    def row(name, search_ms, random_ms, random_same_as):
        return {"workload": name, "times": {"default": {"median_s": 1.0}, "search@final": {"median_s": search_ms},
                                            "random@final": {"median_s": random_ms}},
                "same_as": {"default": "default", "search@final": "search@final", "random@final": random_same_as}}

    report = {"workloads": [row("a", 0.5, 0.7, "random@final"), row("b", 0.5, 0.5, "search@final"),
                            row("c", 0.9, 0.6, "random@final"), {"workload": "d", "error": "x"}]}
    # b's two searches kept one program: a tie whatever its timings; a and c are decided by their medians
    assert bench.outcomes(report) == {"wins": ["a"], "ties": ["b"], "losses": ["c"]}
    assert bench.outcomes(report, other="default") == {"wins": ["a", "b", "c"], "ties": [], "losses": []}


def test_render_rewrites_the_markdown_from_the_json(tmp_path):
    src = Path(bench.REPO) / "benchmarks" / "results" / "search.json"
    assert bench.main(["--render", str(src), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "search.md").read_text()
    assert "## Search against random sampling and against the default" in md and "ties" in md
