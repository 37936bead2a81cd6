"""The global layout choice, measured: superopt NCHW vs superopt with the layout pass vs onnxruntime.

    python benchmarks/layout.py [--only resnet50,squeezenet,inception_v1,conv_bn_relu] [--threads 2] [--rounds 9]

For every workload (the suite's workloads of ``benchmarks/workloads.py``, exported to ONNX) it builds
the graph once, rewrites it as the pipeline does, then compiles two programs: the rewritten graph as it
is (NCHW) and the graph after ``search.graph.layout.choose_layouts`` (layout ``--layout``, "auto" by default).
Both are checked against the float64 reference interpreter, then timed in alternation with
onnxruntime (medians over rounds, ``superopt.measure.timing``). Writes ``benchmarks/results/layout.md``
and ``.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe_machine, machine_line  # noqa: E402

DEFAULT = ("conv_bn_relu", "squeezenet", "inception_v1", "resnet50")


def compile_program(graph, target, threads: int, layout: str | None, cost_model: str | None = "pretrained"):
    """(executor, layout report or None, compile seconds) for the rewritten ``graph``."""
    from search.graph.layout import choose_layouts
    from superopt.api import load_cost_model, schedule_graph
    from superopt.ir.canonical import canonicalize_kernels
    from superopt.runtime.compiler import CompilerConfig
    from superopt.runtime.executor import ExecutorConfig, GraphExecutor

    t0 = time.perf_counter()
    report = None
    if layout is not None:
        graph, report = choose_layouts(graph, target, layout=layout)
    graph = canonicalize_kernels(graph)
    schedules, _, _ = schedule_graph(graph, target, None, load_cost_model(cost_model))
    ex = GraphExecutor(graph, schedules, ExecutorConfig(threads, CompilerConfig(), target))
    return ex, report, time.perf_counter() - t0


def run_workload(name: str, threads: int, layout: str, rounds: int, graph_search: str = "greedy",
                 cost_model: str | None = "pretrained") -> dict:
    from benchmarks.workloads import WORKLOADS_BY_NAME
    from superopt.api import OptimizeConfig, load_graph, rewrite_graph
    from superopt.cli_artifact import _ort_session
    from superopt.interp import evaluate
    from superopt.measure.timing import TimingConfig, time_alternating
    from superopt.target import host_target

    inst = WORKLOADS_BY_NAME[name].build()
    data = inst.onnx_bytes()
    # the greedy rewrite: one fixed graph for both programs (the graph search's result depends on its
    # time budget, so on the machine's load)
    graph = rewrite_graph(load_graph(data), OptimizeConfig(graph_search=graph_search, layout="nchw"))[0]
    target = host_target(threads)
    x = {graph.inputs[0]: inst.inputs[0].detach().numpy()}
    ref = evaluate(graph, x, np.float64)[graph.outputs[0]]
    scale = float(np.abs(ref).max())
    row: dict = {"workload": name}
    fns = {}
    for system, lay in (("superopt_nchw", None), ("superopt_layout", layout)):
        ex, rep, secs = compile_program(graph, target, threads, lay, cost_model)
        out = ex(x)[graph.outputs[0]]
        row[f"{system}_err"] = float(np.abs(out - ref).max()) / scale
        row[f"{system}_compile_s"] = secs
        if rep is not None:
            row["layout"] = {"chosen": rep.chosen, "costs": dict(rep.costs), "blocked_nodes": len(rep.blocked_nodes),
                             "compute_nodes": sum(not n.is_extern for n in graph.nodes),
                             "conversions": rep.conversions, "conversions_at": list(rep.conversions_at)}
        fns[system] = (lambda ex=ex: ex(x))
    sess = _ort_session(data, threads)
    feeds = {sess.get_inputs()[0].name: x[graph.inputs[0]]}
    fns["onnxruntime"] = lambda: sess.run(None, feeds)
    res = time_alternating(fns, TimingConfig(warmup_calls=3, rounds=rounds, min_sample_s=0.1))
    for system, r in res.items():
        row[f"{system}_ms"] = r.median_s * 1e3
        row[f"{system}_min_ms"] = r.min_s * 1e3
    ort_ms = row["onnxruntime_ms"]
    row["nchw_vs_ort"] = ort_ms / row["superopt_nchw_ms"]
    row["layout_vs_ort"] = ort_ms / row["superopt_layout_ms"]
    return row


def write(rows: list[dict], out: Path, meta: dict, stem: str = "layout") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Global layout choice: superopt NCHW vs superopt with choose_layouts vs onnxruntime", "",
             machine_line(meta["machine"]) if "machine" in meta else "", "",
             f"- date: {meta['date']}; threads {meta['threads']}; rounds {meta['rounds']}; layout {meta['layout']}; "
             f"rewrite pass {meta['graph_search']} (the same rewritten graph for both superopt programs); "
             f"schedules: cost model {meta.get('cost_model', 'pretrained')}",
             f"- load average at start {meta['load_start']}, at end {meta['load_end']} (every system is timed in "
             "alternation, medians)",
             f"- command: `{meta['command']}`", "",
             "| workload | onnxruntime ms | superopt NCHW ms | superopt layout ms | NCHW vs ort | layout vs ort |"
             " layout vs NCHW | min ms (ort / NCHW / layout) | chosen | blocked nodes | conversions left |"
             " max rel err (nchw / layout) |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for r in rows:
        lay = r.get("layout", {})
        lines.append(f"| {r['workload']} | {r['onnxruntime_ms']:.3f} | {r['superopt_nchw_ms']:.3f} | "
                     f"{r['superopt_layout_ms']:.3f} | {r['nchw_vs_ort']:.2f}x | {r['layout_vs_ort']:.2f}x | "
                     f"{r['superopt_nchw_ms'] / r['superopt_layout_ms']:.2f}x | {r['onnxruntime_min_ms']:.2f} / "
                     f"{r['superopt_nchw_min_ms']:.2f} / {r['superopt_layout_min_ms']:.2f} | "
                     f"{lay.get('chosen')} | {lay.get('blocked_nodes')}/{lay.get('compute_nodes')} | "
                     f"{lay.get('conversions')} | {r['superopt_nchw_err']:.1e} / {r['superopt_layout_err']:.1e} |")
    lines += ["", "Conversions left per workload:", ""]
    for r in rows:
        lines.append(f"- {r['workload']}: {', '.join(r.get('layout', {}).get('conversions_at', [])) or 'none'}")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(DEFAULT))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--layout", default="auto")
    ap.add_argument("--graph-search", default="greedy", help="the rewrite pass's strategy (greedy: deterministic)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--cost-model", default="pretrained", help="pretrained, a model file, or none (default schedules)")
    ap.add_argument("--stem", default="layout", help="file names: STEM.md and STEM.json")
    a = ap.parse_args(argv)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": a.threads, "machine": describe_machine(a.threads),
            "graph_search": a.graph_search, "cost_model": a.cost_model, "rounds": a.rounds, "layout": a.layout,
            "load_start": [round(v, 2) for v in os.getloadavg()], "cpu": platform.processor() or platform.machine(),
            "command": "python benchmarks/layout.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows = []
    for name in a.only.split(","):
        row = run_workload(name, a.threads, a.layout, a.rounds, a.graph_search,
                           None if a.cost_model == "none" else a.cost_model)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "layout"}), flush=True)
        meta["load_end"] = [round(v, 2) for v in os.getloadavg()]
        write(rows, Path(a.out), meta, a.stem)


if __name__ == "__main__":
    main()
