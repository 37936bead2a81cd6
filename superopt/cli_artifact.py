"""The artifact commands: ``superopt optimize -o OUT`` writes it; ``run``, ``explain`` and ``bench`` use it.

    superopt run OUT/ [--inputs in.npz] [--output out.npz] [--json]
    superopt explain OUT/ [--json]
    superopt bench MODEL.onnx|OUT/ [--threads T] [--json]   (OpenVINO too when installed: superopt[bench])

``write_artifact`` is what ``optimize -o`` calls: it times the optimized program against onnxruntime (with
and without onnxruntime's graph optimizations) in alternation, builds the report, and saves everything —
kernels, traces, ``optimized.onnx``, ``report.md/json/png``, the source model — in one atomic directory.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from superopt.interp.inputs import random_inputs

QUICK_ROUNDS = 5


def _ort_session(model_bytes: bytes, threads: int, optimized: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # its workers spin within a run and stop when it returns: spinning after it would steal a core from the
    # other system, spinning off altogether slowed onnxruntime 6-34% (resnet50, squeezenet)
    so.add_session_config_entry("session.force_spinning_stop", "1")
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def time_systems(executor, source_onnx: bytes | None, input_names: list[str] | None, threads: int,
                 rounds: int = QUICK_ROUNDS, openvino: bool = False) -> dict[str, float]:
    """Median seconds per run of superopt and, for an ONNX source, onnxruntime with and without its graph
    optimizations (and OpenVINO when ``openvino``), timed in alternation on the same random inputs."""
    return bench_systems(executor, source_onnx, input_names, threads, rounds, openvino)["latency_s"]


def bench_systems(executor, source_onnx: bytes | None, input_names: list[str] | None, threads: int,
                  rounds: int = QUICK_ROUNDS, openvino: bool = False) -> dict[str, Any]:
    """``time_systems`` with the checks: each system's first output against onnxruntime's (max abs error),
    a flag when onnxruntime's output is all zeros or constant, and a note per peer that did not run.

    Each system is timed in its own block of calls after warm-up calls, the blocks alternating over rounds.
    OpenVINO gets the LATENCY hint for a batch of 1 (the first input's leading axis), else THROUGHPUT."""
    from dataclasses import replace

    from superopt.measure.peers import openvino_available, openvino_runner, output_flag
    from superopt.measure.timing import QUICK, time_alternating

    feed = random_inputs(executor.graph)
    first_out = executor.graph.outputs[0]
    fns = {"superopt": lambda: executor(feed)[first_out]}
    notes: dict[str, str] = {}
    if source_onnx is not None:
        names = input_names or list(executor.graph.inputs)
        ort_feed = {o: feed[g] for g, o in zip(executor.graph.inputs, names, strict=True)}
        for label, opt in (("onnxruntime", True), ("onnxruntime (no graph optimizations)", False)):
            sess = _ort_session(source_onnx, threads, opt)
            fns[label] = lambda sess=sess: sess.run(None, ort_feed)[0]
        if openvino:
            ok, why = openvino_available()
            if ok:
                xs = [feed[g] for g in executor.graph.inputs]
                batched = bool(xs) and xs[0].ndim > 0 and xs[0].shape[0] > 1
                fns["openvino"] = openvino_runner(source_onnx, xs, threads, batched).run
            else:
                notes["openvino"] = why
    outs = {k: np.asarray(fn()) for k, fn in fns.items()}
    ref = outs.get("onnxruntime")
    errors = {k: float(np.max(np.abs(v.astype(np.float64) - ref))) if v.shape == ref.shape else float("nan")
              for k, v in outs.items()} if ref is not None else {}
    res = time_alternating(fns, replace(QUICK, rounds=rounds))
    return {"latency_s": {k: r.median_s for k, r in res.items()}, "err_vs_onnxruntime": errors,
            "output_flag": output_flag(ref if ref is not None else outs["superopt"]), "notes": notes}


def write_artifact(prog, out: str | Path, model_label: str, source_onnx: bytes | None = None,
                   input_names: list[str] | None = None, threads: int = 2, rewrites: tuple[str, ...] = (),
                   schedule_source: dict[str, str] | None = None) -> tuple[Path, dict[str, Any]]:
    """Save ``prog`` (an ``OptimizedProgram``) with its report and ``optimized.onnx`` at ``out``."""
    from superopt.artifact import save_executor
    from superopt.onnx_export import graph_to_onnx
    from superopt.report import build_report, render_markdown, render_png

    ex = prog.executor
    latency = time_systems(ex, source_onnx, input_names, threads)
    profile = ex.profile(random_inputs(ex.graph), repeats=5)
    report = build_report(model_label, prog.report, profile, latency, rewrites=rewrites,
                          schedule_source=schedule_source, target=ex.target.describe())
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "report.png"
        render_png(report, png)
        files = {"report.md": render_markdown(report).encode(), "report.png": png.read_bytes(),
                 "optimized.onnx": graph_to_onnx(ex.graph, ex.traces).SerializeToString()}
    if source_onnx is not None:
        files["source.onnx"] = source_onnx
        files["source_inputs.json"] = json.dumps(input_names or list(ex.graph.inputs)).encode()
    path = save_executor(ex, out, report=report, extra_files=files)
    return path, report


# ---- superopt run -----------------------------------------------------------------------------------------
def _load_inputs(path: str | None, executor) -> dict[str, np.ndarray]:
    g = executor.graph
    if path is None:
        return random_inputs(executor.graph)
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such inputs file: {path}")
    try:
        with np.load(p, allow_pickle=False) as data:
            given = {k: data[k] for k in data.files}
    except Exception as err:  # noqa: BLE001 - anything unreadable is the user's file
        raise ValueError(f"cannot read inputs {path}: not an .npz file ({type(err).__name__})") from None
    if not isinstance(given, dict):
        raise ValueError(f"inputs {path} must be an .npz archive of named arrays")
    missing = [n for n in g.inputs if n not in given]
    if missing:
        raise ValueError(f"inputs {path} lack {', '.join(missing)} (the program takes {', '.join(g.inputs)})")
    feed = {}
    for n in g.inputs:
        t, a = g.type_of[n], given[n]
        if tuple(a.shape) != t.shape:
            raise ValueError(f"input {n!r} has shape {tuple(a.shape)} but the program was compiled for {t.shape}")
        if a.dtype.kind != np.dtype(t.np_dtype).kind:
            raise ValueError(f"input {n!r} has dtype {a.dtype} but the program takes {t.dtype}")
        feed[n] = a.astype(t.np_dtype, copy=False)
    return feed


def cmd_run(args: argparse.Namespace) -> int:
    from superopt.artifact import load_executor

    ex, _ = load_executor(args.artifact, threads=args.threads)
    feed = _load_inputs(args.inputs, ex)
    out = ex(feed)
    outputs = {o: out[o] for o in ex.graph.outputs}
    if args.output:
        dest = Path(args.output)
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        tmp = dest.with_name(f".{dest.name}.partial")
        try:
            tmp.write_bytes(buf.getvalue())
            tmp.replace(dest)
        except OSError as err:
            raise OSError(f"cannot write {dest}: {err.strerror or err}") from None
    summary = {o: {"shape": list(a.shape), "dtype": str(a.dtype), "mean": float(np.mean(a)) if a.size else 0.0}
               for o, a in outputs.items()}
    if args.json:
        print(json.dumps({"artifact": str(args.artifact), "outputs": summary, "written": args.output}, indent=1))
    else:
        for o, s in summary.items():
            print(f"{o}: {s['dtype']}{s['shape']} mean {s['mean']:.6g}")
        if args.output:
            print(f"wrote {args.output}")
    return 0


# ---- superopt explain -------------------------------------------------------------------------------------
def cmd_explain(args: argparse.Namespace) -> int:
    from superopt.artifact import read_manifest

    read_manifest(args.artifact)
    root = Path(args.artifact)
    report = json.loads((root / "report.json").read_text()) if (root / "report.json").exists() else {}
    schedules = json.loads((root / "schedules.json").read_text())
    timed = {k["node"]: k for k in report.get("kernels", [])}
    rows = []
    for node, trace in schedules.items():
        k = timed.get(node, {})
        rows.append({"node": node, "schedule_source": k.get("schedule_source", "unknown"), "ms": k.get("ms"),
                     "share": k.get("share"), "computes": k.get("what", ""), "trace": trace})
    rows.sort(key=lambda r: -(r["ms"] or 0))
    doc = {"artifact": str(root), "rewrites": report.get("rewrites", []), "latency_ms": report.get("latency_ms", {}),
           "kernels": rows}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{root}: {len(rows)} kernels, {len(doc['rewrites'])} rewrites")
    for r in doc["rewrites"]:
        print(f"  rewrite: {r}")
    for r in rows:
        ms = "?" if r["ms"] is None else f"{r['ms']:.3f} ms ({100 * r['share']:.1f}%)"
        print(f"  {r['node']}: {ms}, schedule from {r['schedule_source']}")
        print(f"    computes {r['computes'][:120]}")
        print(f"    schedule {json.dumps(r['trace'])[:300]}")
    return 0


# ---- superopt bench ---------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    target = Path(args.model)
    if target.is_dir():
        from superopt.artifact import load_executor

        ex, _ = load_executor(target, threads=args.threads)
        src = target / "source.onnx"
        source = src.read_bytes() if src.exists() else None
        names = json.loads((target / "source_inputs.json").read_text()) if source is not None else None
    else:
        if not target.is_file():
            raise FileNotFoundError(f"no such model file or artifact directory: {args.model}")
        from superopt.api import OptimizeConfig, optimize
        from superopt.frontends.onnx_frontend import import_onnx_model

        source = target.read_bytes()
        names = import_onnx_model(source).input_names
        ex = optimize(source, OptimizeConfig(threads=args.threads)).executor
    bench = bench_systems(ex, source, names, args.threads, rounds=args.rounds, openvino=True)
    latency, errors = bench["latency_s"], bench["err_vs_onnxruntime"]
    base = latency["superopt"]
    for why in bench["notes"].values():
        print(why, file=sys.stderr)
    if args.json:
        print(json.dumps({"model": str(target), "threads": args.threads, "latency_ms": {k: v * 1e3 for k, v in
                                                                                       latency.items()},
                          "speedup_vs": {k: v / base for k, v in latency.items() if k != "superopt"},
                          "err_vs_onnxruntime": errors, "output_flag": bench["output_flag"],
                          "not_run": bench["notes"]}, indent=1))
    else:
        print(f"{target} ({args.threads} threads), median of {args.rounds} alternating rounds:")
        for k, v in latency.items():
            err = f"  max |diff| vs onnxruntime {errors[k]:.1e}" if k in errors else ""
            print(f"  {k:40s} {v * 1e3:9.3f} ms  {v / base:6.2f}x superopt's time{err}")
        if bench["output_flag"]:
            print(f"  FLAGGED: the output is {bench['output_flag']}; agreement with onnxruntime means little")
    return 0


def register(sub: Any) -> None:
    """Add ``run``, ``explain`` and ``bench`` to a ``superopt`` subparsers object."""
    r = sub.add_parser("run", help="run a saved artifact (superopt optimize -o OUT) on inputs")
    r.add_argument("artifact", help="artifact directory")
    r.add_argument("--inputs", help=".npz of named input arrays (default: random inputs)")
    r.add_argument("--output", help="write the outputs to this .npz")
    r.add_argument("--threads", type=int, default=None, help="threads (default: as saved)")
    r.add_argument("--json", action="store_true", help="one JSON document on stdout")
    r.set_defaults(fn=cmd_run)
    e = sub.add_parser("explain", help="each rewrite and kernel schedule of an artifact, with its time")
    e.add_argument("artifact", help="artifact directory")
    e.add_argument("--json", action="store_true", help="one JSON document on stdout")
    e.set_defaults(fn=cmd_explain)
    b = sub.add_parser("bench", help="time a model or artifact side by side with onnxruntime and OpenVINO "
                                     "(when installed), in alternation")
    b.add_argument("model", help="an ONNX model file, or an artifact directory")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--rounds", type=int, default=QUICK_ROUNDS, help="alternating timing rounds (median)")
    b.add_argument("--json", action="store_true", help="one JSON document on stdout")
    b.set_defaults(fn=cmd_bench)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: superopt run|explain|bench")
