"""Materialize or recompute: a contraction whose large result only feeds reductions.

    python benchmarks/multi_statement.py [--threads 2] [--quick]

``T[i,j,k] += A[i,k,r] * B[r,j]; S[i,j] += T[i,j,k]; Q[i,j] += T[i,j,k] * T[i,j,k]`` at i=j=256, k=800,
r=32 (T would be 210 MB). superopt folds S and Q into the contraction's write-back (``ReduceEpilogue``),
so T is never stored; eager PyTorch computes T with einsum, then its sum and sum of squares; torch.compile
(Inductor) compiles that same function. All three are checked against float64 numpy on a few rows, then
timed in alternation (medians). Writes ``benchmarks/results/multi_statement.json`` and ``.md`` (not with
``--quick``, a sanity run on small shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if sys.path[0] != str(REPO):  # first: this folder's search.py would hide the search package
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.machine import describe_machine, machine_line  # noqa: E402
from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402
from superopt.api import OptimizeConfig, compile_graph  # noqa: E402
from superopt.builder import GraphBuilder  # noqa: E402
from superopt.schedule.primitives import ReduceEpilogue  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SRC = "T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k]\nQ[i,j] += T[i,j,k] * T[i,j,k]"


def moments(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.einsum("ikr,rj->ijk", a, b)
    return t.sum(2), (t * t).sum(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes, few rounds, no result files")
    args = ap.parse_args()
    i, j, k, r = (32, 64, 100, 32) if args.quick else (256, 256, 800, 32)
    torch.set_num_threads(args.threads)
    b = GraphBuilder("moments")
    a_in, b_in = b.input("a", (i, k, r)), b.input("w", (r, j))
    graph = b.build(b.compute(SRC, {"A": a_in, "B": b_in}, "moments", outputs=["S", "Q"]))
    t0 = time.perf_counter()
    ex = compile_graph(graph, OptimizeConfig(threads=args.threads))
    compile_s = time.perf_counter() - t0
    (node,) = graph.nodes
    trace = ex.traces[node.name]
    folded = [p.stage for p in trace if isinstance(p, ReduceEpilogue)]
    t_bytes = i * j * k * 4
    stored_t = ex.memory.holding("T", node.name)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((i, k, r)).astype(np.float32)
    B = rng.standard_normal((r, j)).astype(np.float32)
    feed = {a_in: A, b_in: B}
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    compiled = torch.compile(moments)
    with torch.no_grad():
        results = {"superopt": lambda: ex(feed), "eager": lambda: moments(At, Bt), "torch.compile": lambda: compiled(At, Bt)}
        outs = {name: fn() for name, fn in results.items()}  # (torch.compile compiles here)
        for name, out in outs.items():
            S, Q = (out[graph.outputs[0]], out[graph.outputs[1]]) if isinstance(out, dict) else \
                (out[0].numpy(), out[1].numpy())
            for row in (0, i // 2, i - 1):
                T = A[row].astype(np.float64) @ B.astype(np.float64)
                if not (np.allclose(S[row], T.sum(0), rtol=1e-4, atol=1e-3 * np.abs(T.sum(0)).max())
                        and np.allclose(Q[row], (T * T).sum(0), rtol=1e-4)):
                    raise SystemExit(f"{name}: wrong result on row {row}")
        timing = time_alternating(results, QUICK if args.quick else FULL)
    flops = 2 * i * j * k * r
    from superopt.measure.peak import fma_peak_gflops  # this machine's FMA ceiling (cached), for the fraction column
    from superopt.runtime.target import host_target

    ceiling = fma_peak_gflops(host_target(args.threads)).ceiling_gflops
    rows = []
    for name, t in timing.items():
        gflops = flops / t.median_s / 1e9
        rows.append({"system": name, "median_ms": t.median_s * 1e3, "min_ms": t.min_s * 1e3, "gflops": gflops,
                     "fma_fraction": gflops / ceiling})
    by = {row["system"]: row["median_ms"] for row in rows}
    report = {
        "workload": SRC.replace("\n", "; "), "shape": {"i": i, "j": j, "k": k, "r": r}, "t_bytes": t_bytes,
        "threads": args.threads, "superopt_trace": [repr(p) for p in trace], "folded_reductions": folded,
        "buffers_holding_T": [repr(x) for x in stored_t], "executor_bytes_held": ex.memory.total_bytes,
        "compile_s": compile_s, "results": rows,
        "speedup_vs_eager": by["eager"] / by["superopt"], "speedup_vs_torch_compile": by["torch.compile"] / by["superopt"],
        "note": "medians of alternated samples", "machine": describe_machine(args.threads),
    }
    lines = [f"# Multi-statement op: {report['workload']}", "", machine_line(report["machine"]), "",
             f"i={i} j={j} k={k} r={r}: T would be {t_bytes / 1e6:.0f} MB. superopt folds {folded} into the "
             f"contraction's write-back; buffers holding T: {len(stored_t)}; executor memory held: "
             f"{ex.memory.total_bytes:,d} bytes. {args.threads} threads. {report['note']}.", "",
             "| system | median ms | min ms | GFLOP/s | of FMA ceiling |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {row['system']} | {row['median_ms']:.1f} | {row['min_ms']:.1f} | {row['gflops']:.1f} | "
              f"{row['fma_fraction']:.0%} |" for row in rows]
    lines += ["", f"superopt is {report['speedup_vs_eager']:.2f}x eager PyTorch and "
              f"{report['speedup_vs_torch_compile']:.2f}x torch.compile."]
    print("\n".join(lines))
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "multi_statement.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "multi_statement.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
