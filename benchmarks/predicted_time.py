"""The graph search's predicted time beside the measured time of the program ``optimize`` builds, per workload.

    python benchmarks/predicted_time.py [--only name,...] [--quick] [--threads 2] [--out benchmarks/results]

For every workload of ``benchmarks/run.py`` (the capsule votes with the weight as a run-time input among them),
built as the suite's superopt system builds it: the graph search's prediction for the graph it chose
(``report.graph_search.cost_after``), the same cost (:class:`search.graph.cost.GraphCost`, this machine's
ceilings) over the final program graph (after the layout and Winograd passes), and the program's measured
median time; the ratio measured / predicted, and whether it lies within 2x either way. The programs are
verified against the reference before timing. Writes predicted_time.md and .json to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run as a script: benchmarks/search.py would shadow the search package
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.machine import cpu_model  # noqa: E402

WITHIN = 2.0  # the goal: predicted within this factor of measured


def program(instance, threads: int):
    """The program the suite's superopt system times for ``instance`` (see benchmarks/systems/superopt_system.py)."""
    import numpy as np

    from benchmarks.systems.superopt_system import CAPSULE
    from superopt.api import OptimizeConfig, optimize
    from superopt.builder import GraphBuilder
    from superopt.runtime.compiler import CompilerConfig

    cfg = OptimizeConfig(threads=threads, compiler=CompilerConfig(timeout_s=900.0))
    if instance.name == "capsule_votes":
        b = GraphBuilder("capsule_votes")
        p = b.input("P", tuple(instance.inputs[0].shape))
        w = b.constant(instance.meta["W_tensor"].detach().numpy().astype(np.float32), "W")
        return optimize(b.build([b.compute1(CAPSULE, {"P": p, "W": w}, "votes")]), cfg), cfg
    return optimize(instance.onnx_bytes(), cfg), cfg


def measure_one(workload, threads: int, quick: bool, cpu_time: bool = False) -> dict:
    import numpy as np

    from search.graph.cost import Ceilings, GraphCost
    from superopt.measure.timing import FULL, QUICK, time_alternating

    inst = workload.build()
    prog, cfg = program(inst, threads)
    xs = [x.detach().numpy() for x in inst.inputs]
    got = np.asarray(prog(*xs)[0], np.float64)
    err = float(np.max(np.abs(got - inst.reference)) / max(1e-30, float(np.max(np.abs(inst.reference)))))
    if not err <= 1e-3:
        raise SystemExit(f"{workload.name}: relative error {err:.2e} against the float64 reference")
    target = cfg.resolved_target()
    cost = GraphCost(Ceilings.measured(target, cfg.compiler), target)
    final = cost(prog.graph)
    search = (prog.report.graph_search or {}).get("cost_after")
    timing = QUICK if quick else FULL
    if cpu_time:
        timing = replace(timing, clock=time.process_time)
    res = time_alternating({"superopt": lambda: prog(*xs)}, timing)["superopt"]
    measured = res.median_s
    worst = max(measured / final, final / measured)
    kernels = sorted(((n, s) for n, s in cost.breakdown(prog.graph) if s > 0), key=lambda kv: -kv[1])[:3]
    return {"workload": workload.name, "measured_ms": measured * 1e3, "predicted_ms": final * 1e3,
            "search_predicted_ms": None if search is None else search * 1e3, "measured_over_predicted": measured / final,
            "within_2x": worst <= WITHIN, "kernels": len([n for n in prog.graph.nodes if not n.is_extern]),
            "top_predicted": [(n, s * 1e3) for n, s in kernels], "max_rel_error": err, "method": cost.method}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all of run.py's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer timing rounds (a smoke run, not a measurement)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--cpu-time", action="store_true",
                    help="time samples in CPU seconds of this process (with --threads 1: a machine other work shares)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from benchmarks.workloads import WORKLOADS, WORKLOADS_BY_NAME

    names = [n for n in args.only.split(",") if n] or [w.name for w in WORKLOADS]
    unknown = [n for n in names if n not in WORKLOADS_BY_NAME]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {list(WORKLOADS_BY_NAME)}")
    load = os.getloadavg()[0]
    rows = []
    for name in names:
        t0 = time.perf_counter()
        row = measure_one(WORKLOADS_BY_NAME[name], args.threads, args.quick, args.cpu_time)
        rows.append(row)
        print(f"{name}: predicted {row['predicted_ms']:.3f} ms, measured {row['measured_ms']:.3f} ms "
              f"({row['measured_over_predicted']:.2f}x){'' if row['within_2x'] else '  OUTSIDE 2x'} "
              f"[{time.perf_counter() - t0:.0f}s]", flush=True)
    meta = {"cpu": cpu_model(), "threads": args.threads, "load_average_at_start": load, "quick": args.quick,
            "clock": "process CPU time" if args.cpu_time else "wall",
            "within": WITHIN, "method": rows[0]["method"] if rows else ""}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "predicted_time.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    inside = sum(r["within_2x"] for r in rows)
    lines = [f"# The graph cost's predicted time against the measured time ({meta['cpu']}, threads: {args.threads}, "
             f"{meta['clock']} clock)", "",
             f"Load average {load:.1f} at the start{' (a quick run: few timing rounds)' if args.quick else ''}. "
             f"Predicted: {meta['method']}, summed over the program's final graph; the graph search's own figure "
             "is for the graph it chose, before the layout pass. Every program verified against the float64 "
             f"reference. {inside} of {len(rows)} within {WITHIN:g}x.", "",
             "| workload | kernels | predicted ms | graph search ms | measured ms | measured / predicted | within 2x |",
             "|---|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        search = "-" if r["search_predicted_ms"] is None else f"{r['search_predicted_ms']:.3f}"
        lines.append(f"| {r['workload']} | {r['kernels']} | {r['predicted_ms']:.3f} | {search} | {r['measured_ms']:.3f} "
                     f"| {r['measured_over_predicted']:.2f}x | {'yes' if r['within_2x'] else 'no'} |")
    (out / "predicted_time.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if inside == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
