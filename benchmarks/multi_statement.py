"""Multi-statement ops whose big intermediate need never touch memory, against eager PyTorch and torch.compile.

    python benchmarks/multi_statement.py [--threads 2] [--quick] [--rows em,moments,attention]

Three families, each written once in index notation and compiled through ``superopt.op``:

- ``em``: EM routing's two passes over capsule votes from a windowed contraction,
  ``V[b,o,x,y,i,p] += P[b,x+kx,y+ky,i,r] * W[kx,ky,i,o,r,p]``, then the weighted mean
  ``MU = sum R*V / sum R`` and the weighted variance around it ``VAR = sum R*(V-MU)^2 / sum R``, at three
  shapes (V from a few MB to hundreds of MB). The second pass reads MU, computed after V. Three ways:
  store V once (materialize), compute it again tile by tile for the second pass (the ``Recompute``
  record), each pass folded into the contraction's write-back, or one pass (``rewrite_rules/moments.py``:
  sums around a shift drawn from the data, both folded into one pass of the contraction). ``superopt.op``
  picks by cost (the graph search's roofline: the merge); all three are timed, the one it picks through
  the op itself. Eager PyTorch and torch.compile compute V with einsum over an unfolded window, then the
  sums.
- ``moments``: one pass, ``T[i,j,k] += A[i,k,r] * B[r,j]; S[i,j] += T[i,j,k]; Q[i,j] += T[i,j,k]^2``
  (S and Q folded into the write-back, T never stored).
- ``attention``: softmax over a contraction followed by a contraction, against torch's
  ``scaled_dot_product_attention`` at the same shapes (and eager/compiled einsum-softmax-einsum).

Every system's result is checked against a float64 reference first (the rows' own check: the first call of
``superopt.op`` also verifies against the reference interpreter on the call's inputs). Timing: each system
in its own block of calls after warm-ups, blocks alternated over rounds, medians. GFLOP/s is given for the
flops each system executes (superopt's recompute runs the contraction twice) and for the useful flops (the
op's own: the contraction once), each as a fraction of the FMA ceiling (``superopt.measure.peak``). The
largest buffer each system holds: superopt's from its memory plan, PyTorch's the largest single allocation
its profiler records during one call. Writes ``benchmarks/results/multi_statement.json`` and ``.md`` (not
with ``--quick``, a sanity run on small shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (run as a script, this folder comes first on the path, and its search.py would shadow the search package)
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).parent)]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import superopt  # noqa: E402
from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.timing import QUICK, TimingConfig, time_alternating  # noqa: E402
from rewrite_rules.moments import EM, SHIFTED_MOMENTS  # noqa: E402
from superopt.builder import GraphBuilder  # noqa: E402
from superopt.runtime.executor import ExecutorConfig, GraphExecutor  # noqa: E402
from superopt.schedule.chained import chained_reductions  # noqa: E402
from superopt.schedule.default import FOLD_REDUCTIONS, build_sketch  # noqa: E402
from superopt.schedule.graph_defaults import default_schedules  # noqa: E402
from superopt.schedule.knobs import KnobRecorder  # noqa: E402
from superopt.schedule.primitives import Recompute  # noqa: E402
from superopt.target import host_target  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MOMENTS = "T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k]\nQ[i,j] += T[i,j,k] * T[i,j,k]"
ATTENTION = """S[h,i,j] += Q[h,i,d] * K[h,j,d]
M[h,i] max= S[h,i,j]
E[h,i,j] = exp(S[h,i,j] - M[h,i])
Z[h,i] += E[h,i,j]
O[h,i,e] += E[h,i,j] * V[h,j,e]
Y[h,i,e] = O[h,i,e] / Z[h,i]"""
# (b, x, o, i, p): 3x3 windows, 4x4 poses (r = 4, p = 16), V = 4 * b*o*x*x*i*p bytes
EM_SHAPES = {"small": (2, 8, 16, 16, 16), "medium": (4, 12, 32, 32, 16), "large": (8, 20, 32, 32, 16)}
EM_QUICK = {"small": (1, 5, 4, 6, 16)}
K, R_POSE = 3, 4


def largest_torch_allocation(fn) -> int:
    """The largest single allocation PyTorch's profiler records during one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((int(e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage > 0), default=0)


def fma_ceiling(threads: int) -> float:
    from superopt.measure.peak import fma_peak_gflops

    return fma_peak_gflops(host_target(threads)).ceiling_gflops


# -- EM routing --------------------------------------------------------------------------------------------


def em_torch(P: torch.Tensor, W: torch.Tensor, R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pw = P.unfold(1, K, 1).unfold(2, K, 1)  # b, x, y, i, r, kx, ky
    V = torch.einsum("bxyirkl,klioRp->boxyip".replace("R", "r"), pw, W)
    Rs = R.sum((2, 3, 4))
    MU = torch.einsum("boxyi,boxyip->bop", R, V) / Rs[..., None]
    D = (R[..., None] * (V - MU[:, :, None, None, None, :]) ** 2).sum((2, 3, 4))
    return MU, D / Rs[..., None]


def em_reference(P, W, R) -> tuple[np.ndarray, np.ndarray]:
    P64, W64, R64 = (torch.from_numpy(a.astype(np.float64)) for a in (P, W, R))
    mu, var = em_torch(P64, W64, R64)
    return mu.numpy(), var.numpy()


def em_row(name: str, shape: tuple[int, ...], threads: int, timing: TimingConfig) -> dict:
    b, x, o, i, p = shape
    shapes = {"P": (b, x + K - 1, x + K - 1, i, R_POSE), "W": (K, K, i, o, R_POSE, p), "R": (b, o, x, x, i)}
    rng = np.random.default_rng(0)
    Pa = rng.standard_normal(shapes["P"]).astype(np.float32)
    Wa = (rng.standard_normal(shapes["W"]) / 6).astype(np.float32)
    Ra = rng.random(shapes["R"]).astype(np.float32)  # routing weights: positive
    v_elems = b * o * x * x * i * p
    useful = 2 * v_elems * K * K * R_POSE + 8 * v_elems  # the contraction once, two passes of weighted sums
    op = superopt.op(EM, outputs=["MU", "VAR"], threads=threads, name=f"em_{name}")
    t0 = time.perf_counter()
    op(Pa, Wa, Ra)  # compile and verify on these inputs
    first_call_s = time.perf_counter() - t0
    prog = next(iter(op._compiled.values())).program
    (node,) = [n for n in prog.graph.nodes if not n.is_extern]
    trace = prog.executor.traces[node.name]
    default = _variant(node.op, trace)
    # the three ways, each through its own executor, from the op as written (the graph before any rewrite)
    target = host_target(threads)
    compute = op.compute([a.shape for a in (Pa, Wa, Ra)])
    gb = GraphBuilder(f"em_{name}")
    written = gb.build(gb.add_compute(compute, [gb.input(n, compute.type_of[n].shape) for n in compute.inputs],
                                      "em", out_names=list(compute.outputs)))
    (wnode,) = written.nodes
    (stage,) = set(chained_reductions(compute))
    config = ExecutorConfig(threads, None, target)
    executors = {}
    for variant, recompute in (("recompute", True), ("materialize", False)):
        sketch = build_sketch(compute, target, frozenset(compute.inputs), FOLD_REDUCTIONS,
                              KnobRecorder({f"{stage}.recompute": recompute}))
        executors[variant] = GraphExecutor(written, {wnode.name: sketch}, config)
    merged = SHIFTED_MOMENTS.first(written)  # one pass: the shifted sums, both folded into V's write-back
    executors["merge"] = GraphExecutor(merged, default_schedules(merged, target), config)
    feed = dict(zip(written.inputs, (Pa, Wa, Ra), strict=True))
    Pt, Wt, Rt = (torch.from_numpy(a) for a in (Pa, Wa, Ra))
    compiled = torch.compile(em_torch)
    systems = {}
    for variant, ex in executors.items():  # the default's own row is the op itself, as a user calls it
        systems[f"superopt ({variant})"] = (lambda: op(Pa, Wa, Ra)) if variant == default else (
            lambda ex=ex: ex(feed))
    systems |= {"eager": lambda: em_torch(Pt, Wt, Rt), "torch.compile": lambda: compiled(Pt, Wt, Rt)}
    mu_ref, var_ref = em_reference(Pa, Wa, Ra)
    with torch.no_grad():
        for sys_name, fn in systems.items():
            out = fn()
            mu, var = (out[written.outputs[0]], out[written.outputs[1]]) if isinstance(out, dict) else out
            for got, ref, what in ((mu, mu_ref, "MU"), (var, var_ref, "VAR")):
                got = np.asarray(got)
                err = float(np.abs(got - ref).max() / np.abs(ref).max())
                if not err < 1e-3:
                    raise SystemExit(f"em {name}: {sys_name} {what} wrong (relative error {err:.3g})")
        held = {f"superopt ({v})": _largest(prog.executor if v == default else ex) for v, ex in executors.items()}
        held |= {"eager": largest_torch_allocation(systems["eager"]),
                 "torch.compile": largest_torch_allocation(systems["torch.compile"])}
        times = time_alternating(systems, timing)
    flops_exec = {"superopt (recompute)": useful + 2 * v_elems * K * K * R_POSE}
    row = _row(f"em {name}", {"b": b, "x": x, "o": o, "i": i, "p": p, "kx": K, "ky": K, "r": R_POSE},
               4 * v_elems, useful, flops_exec, times, held, first_call_s, [repr(t) for t in trace])
    row["superopt_default"] = f"superopt ({default})"
    return row


def _variant(compute, trace) -> str:
    """Which of the three ways the op's own program took: the merge rewrite, Recompute, or V stored."""
    if not chained_reductions(compute):
        return "merge"
    return "recompute" if any(isinstance(t, Recompute) for t in trace) else "materialize"


def _largest(ex: GraphExecutor) -> int:
    return max((buf.nbytes for buf in ex.memory.buffers), default=0)


def _row(name: str, shape: dict, intermediate_bytes: int, useful: int, flops_exec: dict, times: dict, held: dict,
         first_call_s: float, trace: list[str]) -> dict:
    systems = []
    for sys_name, t in times.items():
        executed = flops_exec.get(sys_name, useful)
        systems.append({"system": sys_name, "median_ms": t.median_s * 1e3, "min_ms": t.min_s * 1e3,
                        "gflops_executed": executed / t.median_s / 1e9, "gflops_useful": useful / t.median_s / 1e9,
                        "largest_buffer_bytes": held.get(sys_name)})
    return {"row": name, "shape": shape, "intermediate_bytes": intermediate_bytes, "useful_flops": useful,
            "first_call_s": first_call_s, "superopt_trace": trace, "systems": systems}


# -- one pass: moments -------------------------------------------------------------------------------------


def moments_torch(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.einsum("ikr,rj->ijk", a, b)
    return t.sum(2), (t * t).sum(2)


def moments_row(threads: int, timing: TimingConfig, quick: bool) -> dict:
    i, j, k, r = (32, 64, 100, 32) if quick else (256, 256, 800, 32)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((i, k, r)).astype(np.float32)
    B = rng.standard_normal((r, j)).astype(np.float32)
    op = superopt.op(MOMENTS, outputs=["S", "Q"], threads=threads, name="moments_bench")
    t0 = time.perf_counter()
    op(A, B)
    first_call_s = time.perf_counter() - t0
    prog = next(iter(op._compiled.values())).program
    (node,) = prog.graph.nodes
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    compiled = torch.compile(moments_torch)
    systems = {"superopt": lambda: op(A, B), "eager": lambda: moments_torch(At, Bt),
               "torch.compile": lambda: compiled(At, Bt)}
    with torch.no_grad():
        for sys_name, fn in systems.items():
            S, Q = (np.asarray(x) for x in fn())
            for row in (0, i // 2, i - 1):
                T = A[row].astype(np.float64) @ B.astype(np.float64)
                if not (np.allclose(S[row], T.sum(0), rtol=1e-4, atol=1e-3 * np.abs(T.sum(0)).max())
                        and np.allclose(Q[row], (T * T).sum(0), rtol=1e-4)):
                    raise SystemExit(f"moments: {sys_name} wrong on row {row}")
        held = {"superopt": _largest(prog.executor), "eager": largest_torch_allocation(systems["eager"]),
                "torch.compile": largest_torch_allocation(systems["torch.compile"])}
        times = time_alternating(systems, timing)
    useful = 2 * i * j * k * r + 3 * i * j * k
    return _row("moments (one pass)", {"i": i, "j": j, "k": k, "r": r}, 4 * i * j * k, useful, {}, times, held,
                first_call_s, [repr(t) for t in prog.executor.traces[node.name]])


# -- attention-like ----------------------------------------------------------------------------------------


def attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.einsum("hid,hjd->hij", q, k), dim=-1) @ v


def attention_row(threads: int, timing: TimingConfig, quick: bool) -> dict:
    h, n, d = (2, 128, 32) if quick else (8, 1024, 64)
    rng = np.random.default_rng(0)
    q, k, v = ((rng.standard_normal((h, n, d)) / d ** 0.25).astype(np.float32) for _ in range(3))
    op = superopt.op(ATTENTION, threads=threads, name="attention_bench")
    t0 = time.perf_counter()
    op(q, k, v)
    first_call_s = time.perf_counter() - t0
    prog = next(iter(op._compiled.values())).program
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    compiled = torch.compile(attention_torch)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, scale=1.0)

    systems = {"superopt": lambda: op(q, k, v), "sdpa": sdpa, "eager": lambda: attention_torch(qt, kt, vt),
               "torch.compile": lambda: compiled(qt, kt, vt)}
    ref = attention_torch(*(torch.from_numpy(a.astype(np.float64)) for a in (q, k, v))).numpy()
    with torch.no_grad():
        for sys_name, fn in systems.items():
            got = np.asarray(fn())
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            if not err < 1e-3:
                raise SystemExit(f"attention: {sys_name} wrong (relative error {err:.3g})")
        held = {"superopt": _largest(prog.executor), **{s: largest_torch_allocation(systems[s])
                                                         for s in ("sdpa", "eager", "torch.compile")}}
        times = time_alternating(systems, timing)
    useful = 4 * h * n * n * d
    traces = [repr(t) for node in prog.graph.nodes if not node.is_extern for t in prog.executor.traces[node.name]]
    return _row("attention (softmax between contractions)", {"h": h, "n": n, "d": d}, 4 * h * n * n, useful, {},
                times, held, first_call_s, traces)


# -- report ------------------------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    ceiling = report["fma_ceiling_gflops"]
    lines = ["# Multi-statement ops: the big intermediate kept out of memory", "",
             f"CPU: {report['cpu']}, {report['threads']} threads, FMA ceiling {ceiling:.0f} GFLOP/s "
             "(superopt.measure.peak). Each system in its own block of calls after warm-ups, blocks alternated over "
             f"rounds, medians. {report['note']}", "",
             "GFLOP/s counts the flops each system executes (superopt's recompute runs the contraction twice) and "
             "the useful flops (the op's: the contraction once); fractions are of the FMA ceiling. Largest buffer: "
             "superopt's memory plan (its largest is the packed weight, a copy of an input, where no intermediate is "
             "stored); PyTorch's largest single allocation in one call (its profiler).", ""]
    for row in report["rows"]:
        inter = row["intermediate_bytes"] / 1e6
        lines += [f"## {row['row']}", "",
                  f"shape {row['shape']}; the intermediate would be {inter:.1f} MB; superopt's first call (compile "
                  f"and verify; kernels already in the kernel cache are loaded, not compiled) {row['first_call_s']:.1f} s.", "",
                  "| system | median ms | min ms | GFLOP/s executed | of ceiling | GFLOP/s useful | of ceiling | "
                  "largest buffer MB | of intermediate |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in row["systems"]:
            held = s["largest_buffer_bytes"] or 0
            lines.append(f"| {s['system']} | {s['median_ms']:.1f} | {s['min_ms']:.1f} | {s['gflops_executed']:.1f} | "
                         f"{s['gflops_executed'] / ceiling:.0%} | {s['gflops_useful']:.1f} | "
                         f"{s['gflops_useful'] / ceiling:.0%} | {held / 1e6:.2f} | {held / row['intermediate_bytes']:.0%} |")
        by = {s["system"]: s["median_ms"] for s in row["systems"]}
        best = row.get("superopt_default") or min((k for k in by if k.startswith("superopt")), key=by.get)
        peers = [k for k in by if not k.startswith("superopt")]
        lead = f"{best}, what superopt.op picks" if "superopt_default" in row else best
        lines += ["", f"{lead}: " + ", ".join(f"{by[p] / by[best]:.2f}x {p}" for p in peers) + ".", ""]
    return "\n".join(lines)


def _load_note(load: float, threads: int) -> str:
    if load <= threads + 0.5:
        return f"Load average {load:.1f} at the end of the run (the machine otherwise idle)."
    return (f"Measured with other jobs running (load average {load:.1f} at the end, on {threads} threads): compare "
            "systems within a row; medians suffer most, minima least.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small shapes, few rounds, no result files")
    ap.add_argument("--rows", default="em,moments,attention")
    ap.add_argument("--rounds", type=int, default=9, help="alternated rounds per row (medians over them)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    timing = QUICK if args.quick else TimingConfig(warmup_calls=2, rounds=args.rounds, min_sample_s=0.2)
    wanted = set(args.rows.split(","))
    rows = []
    if "em" in wanted:
        for name, shape in (EM_QUICK if args.quick else EM_SHAPES).items():
            rows.append(em_row(name, shape, args.threads, timing))
            print(json.dumps(rows[-1]["systems"]), flush=True)
    if "moments" in wanted:
        rows.append(moments_row(args.threads, timing, args.quick))
        print(json.dumps(rows[-1]["systems"]), flush=True)
    if "attention" in wanted:
        rows.append(attention_row(args.threads, timing, args.quick))
        print(json.dumps(rows[-1]["systems"]), flush=True)
    import os

    report = {"cpu": cpu_model(), "threads": args.threads, "fma_ceiling_gflops": fma_ceiling(args.threads),
              "load_average_at_end": os.getloadavg()[0],
              "note": _load_note(os.getloadavg()[0], args.threads),
              "rows": rows}
    text = markdown(report)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "multi_statement.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "multi_statement.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
