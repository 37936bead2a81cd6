"""Capsule votes from ONNX with the weight as a run-time input: superopt vs onnxruntime vs OpenVINO on the
same file, and the same op written in index notation (``superopt.op``), side by side.

    python benchmarks/capsule_weight_input.py [--threads 2] [--quick] [--out benchmarks/results]

Every system gets the same inputs (P and the OHWI conv weight; the index-notation op takes W[kh,kw,i,o,r,q])
and is checked against the float64 reference before timing. Each system is timed in its own block of calls
after warm-up calls, the blocks alternating over rounds (medians). Writes capsule_weight_input.md and .json.
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
if sys.path[0] != REPO:
    sys.path.insert(0, REPO)

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"


def systems(threads: int) -> tuple[dict, dict, object]:
    """name -> callable (each returns the votes), name -> note, and the reference."""
    import numpy as np
    import onnxruntime as ort

    import superopt
    from benchmarks.workloads import build_capsule, build_capsule_weight_input
    from superopt.api import OptimizeConfig, optimize

    inst = build_capsule_weight_input()
    data = inst.onnx_bytes()
    P, Wo = (x.numpy() for x in inst.inputs)
    W = build_capsule().meta["W_tensor"].numpy()
    fns, notes = {}, {}
    prog = optimize(data, OptimizeConfig(threads=threads))
    fns["superopt (ONNX)"] = lambda: prog(P, Wo)[0]
    conv = max((n for n in prog.graph.nodes if not n.is_extern), key=lambda n: len(n.op.statements[-1].reduce_dims))
    notes["superopt (ONNX)"] = f"conv kernel trace: {prog.executor.traces[conv.name]}"
    op = superopt.op(CAPSULE, threads=threads)
    fns["superopt.op (index notation)"] = lambda: op(P, W)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    fns["onnxruntime"] = lambda: sess.run(None, {names[0]: P, names[1]: Wo})[0]
    try:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(data), "CPU",
                                      {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                       "INFERENCE_PRECISION_HINT": "f32"})  # (not bf16 where the CPU has it)
        req = compiled.create_infer_request()
        fns["OpenVINO"] = lambda: req.infer([P, Wo])[compiled.outputs[0]]
        notes["OpenVINO"] = f"openvino {ov.__version__}"
    except ImportError as e:
        notes["OpenVINO"] = f"not installed ({e})"
    for name, fn in fns.items():
        err = float(np.max(np.abs(np.asarray(fn(), np.float64) - inst.reference)))
        if err > 1e-3:
            raise SystemExit(f"{name}: max abs error {err:.2e} against the float64 reference")
        notes[name] = f"max abs err {err:.1e}" + (f"; {notes[name]}" if name in notes else "")
    return fns, notes, inst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer timing rounds (a smoke run, not a measurement)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--cpu-time", action="store_true",
                    help="time samples in CPU seconds of this process (with --threads 1: a machine other work shares)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    fns, notes, inst = systems(args.threads)
    cfg = QUICK if args.quick else FULL
    res = time_alternating(fns, replace(cfg, clock=time.process_time) if args.cpu_time else cfg)
    ms = {k: r.median_s * 1e3 for k, r in res.items()}
    ours = ms["superopt (ONNX)"]
    rows = [{"system": k, "median_ms": v, "min_ms": res[k].min_s * 1e3, "gflops": inst.flops / (v * 1e6),
             "superopt_onnx_speedup": v / ours, "note": notes.get(k, "")} for k, v in ms.items()]
    meta = {"cpu": cpu_model(), "threads": args.threads, "clock": "process CPU time" if args.cpu_time else "wall",
            "rounds": len(next(iter(res.values())).samples_s),
            "workload": inst.name, "flops": inst.flops}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capsule_weight_input.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [f"# Capsule votes from ONNX, the weight a run-time input ({meta['cpu']}, threads: {args.threads}, "
             f"{meta['clock']} clock)", "",
             "Each system timed in its own block of calls, blocks alternating over "
             f"{meta['rounds']} rounds (medians); every output checked against the float64 reference.", "",
             "| system | median ms | GFLOP/s | superopt (ONNX) speed-up over it |", "|---|---:|---:|---:|"]
    lines += [f"| {r['system']} | {r['median_ms']:.3f} | {r['gflops']:.0f} | {r['superopt_onnx_speedup']:.2f}x |"
              for r in rows]
    lines += ["", *(f"- {r['system']}: {r['note']}" for r in rows)]
    (out / "capsule_weight_input.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
