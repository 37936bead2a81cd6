"""CPU seconds of the rewrite phase of the light models, beside another checkout's, and whether both give the
same graph.

    python -m benchmarks.rewrite_time [model ...] --baseline CHECKOUT [--rounds 3] [--budget 1e-6] [--out DIR]

The rewrite phase is what ``superopt.optimize`` charges to ``rewrite``: prune, the graph search, the layout
choice, the Winograd convs, the canonical kernels. Each measurement runs in a fresh process (``--child``):
the model is imported, the machine's ceilings read from a cache measured once, then the phase runs and its
process CPU seconds are taken (the machine may be shared: CPU seconds, the systems alternating within each
round, medians over rounds). ``--budget``: the graph search's seconds; the default, 1e-6, leaves the first
descent from the start graph (which completes whatever the budget), so the graph is the same on a loaded
machine as on an idle one and the two checkouts can be compared graph for graph; 1.0 is the pipeline's
setting, where a faster search explores further. A graph is compared by its rename-invariant digest and by
the sorted digests of its kernels. Writes ``NAME.md`` and ``NAME.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(path: str, cache: str, budget: float) -> dict:
    """The rewrite phase of one model in this (fresh) process."""
    from search.graph.cost import Ceilings
    from search.graph.rewrite import search_rewrites
    from search.graph.search import GraphDigests
    from superopt.api import OptimizeConfig
    from superopt.collector import fewer_collections
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.ir.canonical import canonicalize_kernels
    from superopt.runtime.compiler import CompilerConfig

    config = OptimizeConfig(threads=2, compiler=CompilerConfig(cache_dir=Path(cache)), graph_budget_s=budget)
    graph = import_onnx_model(path, shapes={}, strict=False, example={}).graph  # (as optimize imports)
    Ceilings.measured(config.resolved_target(), config.compiler)  # (read from the cache: not part of the phase)
    c0, w0 = time.process_time(), time.perf_counter()
    with fewer_collections():  # (as optimize runs its passes)
        out, report = search_rewrites(graph, config.rewrite_config())
        out = canonicalize_kernels(out)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    kernels = sorted(n.op.text() if n.is_extern else n.op.digest() for n in out.nodes)
    return {"cpu_s": cpu, "wall_s": wall, "nodes": len(out.nodes), "digest": GraphDigests()(out),
            "kernels": hashlib.sha256("\n".join(kernels).encode()).hexdigest(),
            "rewrites": len(report.applied) if report is not None else 0,
            "expansions": report.expansions if report is not None else 0,
            "stop_reason": str(report.stop_reason) if report is not None else "no search"}


def measure(code: Path, path: Path, cache: Path, budget: float) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{REPO}")
    argv = ["rewrite_time", "--child", str(path), str(cache), "--budget", repr(budget)]
    run = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    p = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, env=env, cwd=code)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def render(result: dict) -> str:
    lines = ["# The rewrite phase: CPU seconds before and after, and the graphs", "",
             f"CPU: {result['cpu']}; graph search budget {result['budget']:g} s; median of {result['rounds']} "
             f"round(s), the two checkouts alternating, each measurement a fresh process; CPU seconds of the rewrite "
             f"phase (prune, graph search, layout choice, Winograd convs, canonical kernels). Before: "
             f"`{result['baseline_name']}`; after: `{result['code_name']}`.", "",
             "| model | before (CPU s) | after (CPU s) | after / before | same graph | same kernels | rewrites | stop |",
             "|---|---:|---:|---:|---|---|---:|---|"]
    for name, r in result["models"].items():
        b, a = r["before"], r["after"]
        if "error" in b or "error" in a:
            lines.append(f"| {name} | {b.get('error', '')} | {a.get('error', '')} | | | | | |")
            continue
        lines.append(f"| {name} | {b['cpu_s']:.2f} | {a['cpu_s']:.2f} | {a['cpu_s'] / b['cpu_s']:.2f} | "
                     f"{'yes' if r['same_graph'] else 'no'} | {'yes' if r['same_kernels'] else 'no'} | "
                     f"{a['rewrites']} | {a['stop_reason']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--baseline", help="the checkout measured before (required unless --child)")
    ap.add_argument("--code", default=str(REPO), help="the checkout measured after (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1e-6)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default="rewrite_time")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "CACHE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.budget)))
        return
    if not args.baseline:
        ap.error("--baseline CHECKOUT is required (the before of the comparison)")
    sys.path.insert(0, str(REPO))
    import onnx

    from benchmarks.compile_time import ceilings_cache
    from benchmarks.machine import cpu_model, write_result
    from superopt.frontends.light_models import LIGHT_MODELS, randomized_light_model

    code, baseline = Path(args.code).resolve(), Path(args.baseline).resolve()
    result: dict = {"cpu": cpu_model(), "budget": args.budget, "rounds": args.rounds, "code_name": code.name,
                    "baseline_name": baseline.name, "models": {}}
    with tempfile.TemporaryDirectory(prefix="superopt-rewrite-time-") as tmp:
        root = Path(tmp)
        cache, _ = ceilings_cache(root, 2)
        for name in args.models or list(LIGHT_MODELS):
            path = root / f"{name}.onnx"
            onnx.save(randomized_light_model(name), str(path))
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for rnd in range(args.rounds):
                order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
                for side in order:
                    runs[side].append(measure(baseline if side == "before" else code, path, cache, args.budget))
            path.unlink()
            entry: dict = {"runs": runs}
            for side, rs in runs.items():
                ok = [r for r in rs if "error" not in r]
                entry[side] = {**ok[-1], "cpu_s": statistics.median(r["cpu_s"] for r in ok),
                               "wall_s": statistics.median(r["wall_s"] for r in ok)} if ok else rs[0]
            digests = {side: {(r["digest"], r["kernels"]) for r in rs if "error" not in r} for side, rs in runs.items()}
            entry["same_graph"] = {d for d, _ in digests["before"]} == {d for d, _ in digests["after"]}
            entry["same_kernels"] = {k for _, k in digests["before"]} == {k for _, k in digests["after"]}
            result["models"][name] = entry
            b, a = entry["before"], entry["after"]
            print(f"{name:14s} before {b.get('cpu_s', float('nan')):6.2f}s  after {a.get('cpu_s', float('nan')):6.2f}s"
                  f"  same graph {entry['same_graph']}", flush=True)
            write_result(args.out, args.name, result, render(result))
    print(render(result))


if __name__ == "__main__":
    main()
