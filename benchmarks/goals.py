"""The performance goals of the benchmark suite, evaluated on one benchmark report (same run, same machine)."""

from __future__ import annotations

import math

MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512")
BATCHED = ("resnet50_b16", "squeezenet_b16", "ffn_block_b16")
BLOCKS = ("ffn_block", "attention", "conv_bn_relu", "llama_mlp", "layernorm", "softmax", "sgemm")
FUSED_BLOCKS = ("ffn_block", "attention", "conv_bn_relu", "llama_mlp")


def _ms(report: dict, workload: str, system: str) -> float | None:
    w = next((w for w in report["workloads"] if w["workload"] == workload), None)
    r = (w or {}).get("systems", {}).get(system, {})
    return r.get("median_ms") if r.get("status", "ok").startswith("ok") else None


def evaluate_goals(report: dict) -> list[dict]:
    """One row per goal: what is compared, the measured ratio (>= target means met), the target.

    A row whose output the run flagged (all zeros, constant) is never met: a fast program whose output
    cannot be told from a wrong one is no win."""
    rows = []

    def ratio(goal: str, workload: str, baseline: str, target: float) -> None:
        w = next((w for w in report["workloads"] if w["workload"] == workload), None)
        if w is None or baseline not in w["systems"] or "superopt" not in w["systems"]:
            return  # not part of this run (a failed system is part of it, and fails the goal)
        base, ours = _ms(report, workload, baseline), _ms(report, workload, "superopt")
        value = base / ours if base and ours else None
        row = {"goal": goal, "workload": workload, "baseline": baseline, "ratio": value, "target": target,
               "met": value is not None and value >= target and not w.get("output_flag")}
        if w.get("output_flag"):
            row["flagged"] = w["output_flag"]
        rows.append(row)

    for w in MODELS + BLOCKS:
        ratio("peers: >= 1.0x OpenVINO (LATENCY hint) on each batch-1 row", w, "openvino", 1.0)
    for w in BATCHED:
        ratio("peers: >= 1.0x onnxruntime on each batched row", w, "onnxruntime", 1.0)
        ratio("peers: >= 1.0x OpenVINO (THROUGHPUT hint) on each batched row", w, "openvino", 1.0)
    ratios = [r["ratio"] for r in rows if r["baseline"] == "openvino" and r["workload"] not in BATCHED]
    if ratios:
        value = None if None in ratios else math.exp(sum(math.log(v) for v in ratios) / len(ratios))
        rows.append({"goal": "peers: geomean >= 1.3x OpenVINO over the batch-1 rows", "workload": "all batch-1 rows",
                     "baseline": "openvino", "ratio": value, "target": 1.3, "met": value is not None and value >= 1.3})

    for w in MODELS + BLOCKS:
        ratio(">= 1.0x onnxruntime on each model and block", w, "onnxruntime", 1.0)
    for w in FUSED_BLOCKS:
        ratio(">= torch.compile on each fused block", w, "torch.compile", 1.0)
    ratio("capsule votes >= the expert PyTorch formulation", "capsule_votes", "eager", 1.0)
    for w in ("layernorm", "softmax"):
        ratio("default heuristic >= torch eager", w, "eager", 1.0)
    ratio("sgemm >= 50% of torch.matmul", "sgemm", "eager", 0.5)
    cap = next((w for w in report["workloads"] if w["workload"] == "capsule_votes"), None)
    if cap is None or "superopt" not in cap["systems"]:
        return rows
    ours = cap["systems"]["superopt"].get("gflops")
    machine = report["machine"]["sgemm"]["median_gflops"]
    value = ours / machine if ours and machine else None
    rows.append({"goal": "capsule votes >= 50% of the machine's sgemm GFLOP/s", "workload": "capsule_votes",
                 "baseline": "torch.matmul 2048^3", "ratio": value, "target": 0.5,
                 "met": value is not None and value >= 0.5})
    return rows


def goals_markdown(rows: list[dict]) -> list[str]:
    met = sum(r["met"] for r in rows)
    lines = [f"## Goals ({met} of {len(rows)} met in this run)", "",
             "| goal | workload | baseline | measured (baseline time / superopt time) | target | met |",
             "|---|---|---|---:|---:|:---:|"]
    for r in rows:
        value = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        if r.get("flagged"):
            value += f" (output flagged: {r['flagged']})"
        lines.append(f"| {r['goal']} | {r['workload']} | {r['baseline']} | {value} | {r['target']:.2f} | "
                     f"{'yes' if r['met'] else '**no**'} |")
    return lines
