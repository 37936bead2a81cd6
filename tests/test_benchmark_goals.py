"""The goal table of the benchmark report: ratios and verdicts from a synthetic report."""

from benchmarks.goals import evaluate_goals, goals_markdown


def _report(ms: dict[str, dict[str, float]], capsule_gflops: float, machine: float) -> dict:
    workloads = []
    for w, systems in ms.items():
        recs = {s: {"median_ms": t, "status": "ok"} for s, t in systems.items()}
        if w == "capsule_votes":
            recs["superopt"]["gflops"] = capsule_gflops
        workloads.append({"workload": w, "systems": recs})
    return {"workloads": workloads, "machine": {"sgemm": {"median_gflops": machine}}}


def test_goal_ratios_and_verdicts():
    rep = _report({
        "resnet50": {"eager": 30.0, "onnxruntime": 20.0, "superopt": 25.0, "torch.compile": 28.0},
        "ffn_block": {"eager": 7.0, "onnxruntime": 3.0, "superopt": 2.5, "torch.compile": 7.5},
        "layernorm": {"eager": 0.5, "onnxruntime": 1.0, "superopt": 0.4},
        "sgemm": {"eager": 10.0, "onnxruntime": 5.0, "superopt": 19.0},
        "capsule_votes": {"eager": 1.4, "superopt": 1.5},
    }, capsule_gflops=300.0, machine=220.0)
    rows = {(r["goal"][:60], r["workload"]): r for r in evaluate_goals(rep)}
    ort = ">= 1.0x onnxruntime on each model and block"
    assert rows[(ort, "resnet50")]["ratio"] == 0.8 and not rows[(ort, "resnet50")]["met"]
    assert rows[(ort, "ffn_block")]["ratio"] == 1.2 and rows[(ort, "ffn_block")]["met"]
    assert (ort, "squeezenet") not in rows  # not part of this run
    assert rows[(">= torch.compile on each fused block", "ffn_block")]["met"]
    assert not rows[("capsule votes >= the expert PyTorch formulation", "capsule_votes")]["met"]
    assert rows[("sgemm >= 50% of torch.matmul", "sgemm")]["met"]  # 10 / 19 = 0.53
    cap = rows[("capsule votes >= 50% of the machine's sgemm GFLOP/s", "capsule_votes")]
    assert cap["met"] and abs(cap["ratio"] - 300 / 220) < 1e-12
    table = "\n".join(goals_markdown(list(rows.values())))
    assert "| **no** |" in table and "met in this run" in table


def test_a_failed_system_counts_as_not_met():
    rep = _report({"softmax": {"eager": 1.0, "superopt": 0.5}}, 0.0, 200.0)
    rep["workloads"][0]["systems"]["superopt"]["status"] = "error: crashed"
    row = next(r for r in evaluate_goals(rep) if r["workload"] == "softmax" and r["baseline"] == "eager")
    assert row["ratio"] is None and not row["met"]


def test_readme_results_section_is_regenerated_between_markers(tmp_path):
    import json

    from benchmarks import update_readme

    rep = _report({"softmax": {"eager": 1.0, "onnxruntime": 0.8, "torch.compile": 1.1, "superopt": 0.5}}, 0.0, 200.0)
    rep["workloads"][0]["systems"]["superopt"]["speedup_vs_eager"] = 2.0
    rep.update(quick=True, date="2026-11-30T07:31:57",
               machine={"cpu_model": "Test CPU", "logical_cpus": 2, "threads": 2, "sgemm": {"median_gflops": 200.0},
                        "sgemm_end": {"median_gflops": 199.0}, "loadavg_start": [0.5], "loadavg_end": [0.7]})
    results = tmp_path / "results.json"
    results.write_text(json.dumps(rep))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{update_readme.BEGIN}\nold table\n{update_readme.END}\nafter\n")
    update_readme.main(["--results", str(results), "--readme", str(readme)])
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    assert "| softmax | 1.000 |" in text and "2.00x" in text and "Test CPU" in text and "2026-11-30" in text
    assert "2 of 2 goals met in this run." in text
