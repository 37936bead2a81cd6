"""Command line: ``superopt tune``, ``superopt optimize`` and ``superopt demo``.

``superopt tune MODEL.onnx`` (or ``--op TEXT --shape NAME=AxB ...``) searches schedules for every
kernel of the model and records every measurement in the tuning database (``--db``, default
``./superopt_tuning.jsonl``); a second run for the same model and machine finds everything tuned and
measures nothing. ``superopt optimize`` then compiles with the database's best schedules.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

from superopt.cli_artifact import register as register_artifact
from superopt.cli_costmodel import register as register_costmodel
from superopt.cli_dataset import register as register_dataset

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"
DEFAULT_DB = "superopt_tuning.jsonl"  # in the current directory


# exit statuses of every command: 0 success; 1 a user error (bad or missing file, unsupported op, bad input);
# 2 bad arguments (argparse's own convention, kept for every subcommand); 3 the compiled program failed
# verification; 4 an internal error (a bug of superopt's)
EXIT_USER_ERROR, EXIT_USAGE, EXIT_VERIFICATION, EXIT_INTERNAL = 1, 2, 3, 4


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""


_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_time(text: str, flag: str = "--time") -> float:
    """A wall-clock budget: ``90s``, ``10m``, ``1.5h``, ``1h30m`` or plain seconds (``45``)."""
    t = text.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)", t)
    if not t or re.sub(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)", "", t).strip() or not parts \
            or (len(parts) > 1 and any(not u for _, u in parts)):
        raise UsageError(f"bad {flag} {text!r}: give a number with a unit s, m or h (e.g. 90s, 10m, 1h, 1h30m)")
    seconds = sum(float(v) * _TIME_UNITS[u or "s"] for v, u in parts)
    if not seconds > 0 or not math.isfinite(seconds):
        raise UsageError(f"bad {flag} {text!r}: the budget must be positive")
    return seconds


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=AxBxC`` -> (NAME, (A, B, C)); a scalar is ``NAME=`` (rank 0)."""
    name, eq, dims = text.partition("=")
    name = name.strip()
    if not eq or not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise UsageError(f"bad --shape {text!r}: expected NAME=AxBx.. (e.g. A=64x128)")
    dims = dims.strip()
    if not dims:
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"bad --shape {text!r}: dimensions must be positive integers separated by x") from None
    if any(d <= 0 for d in shape):
        raise UsageError(f"bad --shape {text!r}: dimensions must be positive")
    return name, shape


def _median_time(fn, repeats: int) -> float:
    return _alternating_medians([fn], repeats)[0]


def _alternating_medians(fns, repeats: int) -> list[float]:
    """Median time of each function, timed in alternation (machine noise hits all alike)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            fn()  # settle: another runtime's worker threads may still be busy-waiting
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [float(np.median(ts)) for ts in times]


def _model_file(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such model file: {path}")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not a model file")
    return path


def _optimize_db(args: argparse.Namespace) -> str | None:
    """--db PATH; without it the default database when it exists; --no-db: none."""
    if args.no_db:
        return None
    if args.db is not None:
        if not Path(args.db).exists() and getattr(args, "budget", None) is None and getattr(args, "trials", None) is None:
            raise FileNotFoundError(f"no such tuning database: {args.db}")
        return args.db
    return DEFAULT_DB if Path(DEFAULT_DB).exists() else None


def parse_dim(text: str) -> tuple[str, int]:
    """``NAME=N`` -> (NAME, N): the size of a symbolic dimension."""
    name, eq, size = text.partition("=")
    name = name.strip()
    if not eq or not name:
        raise UsageError(f"bad --dim {text!r}: expected NAME=N (e.g. batch=1)")
    try:
        n = int(size)
    except ValueError:
        raise UsageError(f"bad --dim {text!r}: the size must be an integer") from None
    if n <= 0:
        raise UsageError(f"bad --dim {text!r}: the size must be positive")
    return name, n


def _onnx_shapes(args: argparse.Namespace, model) -> dict[str, tuple[int, ...]] | None:
    """--shape NAME=AxB and --dim NAME=N for a model (an ``onnx.ModelProto``), as shapes by input name (None when
    neither is given)."""
    if not args.shape and not args.dim:
        return None
    from superopt.frontends.onnx_shapes import resolve_shapes

    shapes = dict(parse_shape(s) for s in args.shape or [])
    dims = dict(parse_dim(d) for d in args.dim or [])
    return resolve_shapes(model, shapes, dims)


def _optimize_target(args: argparse.Namespace):
    """--target cpu (this machine, --threads threads) or cuda (the GPU backend; a clear error without a GPU)."""
    from superopt.runtime.compiler import CompilerConfig
    from superopt.target import host_target

    if args.threads < 1:
        raise UsageError(f"bad --threads {args.threads}: at least 1")
    if args.target == "cuda":
        try:
            from superopt.runtime.gpu import require_gpu
        except ImportError:
            raise RuntimeError("--target cuda: this build of superopt has no CUDA backend") from None
        require_gpu()  # raises a one-line error naming what is missing (driver, device, binding)
        raise RuntimeError("--target cuda: optimizing whole models for the GPU is not supported yet; "
                           "use benchmarks/gpu_check.sh for GPU kernels")
    return host_target(args.threads, CompilerConfig().cc)


def cmd_optimize(args: argparse.Namespace) -> int:
    from superopt.api import OptimizeConfig, optimize
    from superopt.interp.inputs import random_inputs

    budget = parse_time(args.budget, "--budget") if args.budget is not None else None
    if args.trials is not None and args.trials < 1:
        raise UsageError(f"bad --trials {args.trials}: at least 1")
    target = _optimize_target(args)
    graph = {}  # the graph search gets a tenth of --budget (its own default otherwise), more expansions with it
    if budget is not None:
        graph = {"graph_budget_s": max(1.0, budget / 10), "graph_expansions": None, "graph_patience": 20}
    db = _optimize_db(args)  # with --budget/--trials the search's records go here (a temporary file when None)
    path = _model_file(args.model)
    from superopt.frontends.onnx_frontend import _load

    model = _load(path)  # parsed once: the shapes, the pipeline and the artifact's source all read this one
    prog = optimize(model, _onnx_shapes(args, model),
                    OptimizeConfig(threads=args.threads, verify=not args.no_verify, database=db,
                                   cost_model=_cost_model_arg(args), strict=args.strict, target=target,
                                   seed=args.seed, budget_s=budget, tune_trials=args.trials,
                                   progress=not (args.no_progress or args.json), graph_search=args.graph_search,
                                   program_cache=not args.no_program_cache, **graph))
    log = sys.stderr if args.json else sys.stdout
    print(f"optimized {args.model}: {prog.report}", file=log)
    for line in prog.report.fallback_lines():
        print(f"  {line}", file=log)
    if args.out:
        from superopt.cli_artifact import write_artifact

        first = getattr(prog, "first", prog)  # an OptimizedModel (symbolic dims): its first compiled shape
        source = Path(path).read_bytes()  # (the file optimize parsed: not parsed a second time)
        rep = first.report
        out, report = write_artifact(first, args.out, Path(path).name, source, first.input_names, args.threads,
                                     tuple((rep.graph_search or {}).get("applied", ())), rep.schedule_source)
        if args.json:
            print(json.dumps({"artifact": str(out), **report}, indent=1, default=str))
        else:
            lat = report["latency_ms"]
            print("  ".join(f"{k}: {v:.3f} ms" for k, v in lat.items()))
            print(f"wrote {out}/ (report.md, report.json, report.png, optimized.onnx, kernels/)")
        return 0
    feed = random_inputs(prog.graph)
    t = _median_time(lambda: prog.executor(feed), args.repeat)
    if args.json:
        import dataclasses

        print(json.dumps({"model": args.model, "report": dataclasses.asdict(prog.report), "median_ms": t * 1e3,
                          "threads": args.threads}, indent=1, default=str))
    else:
        print(f"median run time: {t * 1e3:.2f} ms ({args.threads} threads)")
    return 0


def _cost_model_arg(args: argparse.Namespace) -> str | None:
    """--cost-model PATH|pretrained, or None with --no-cost-model; a missing file is a one-line error."""
    if args.no_cost_model:
        return None
    spec = args.cost_model
    if spec not in ("pretrained", "online") and not Path(spec).exists():
        raise FileNotFoundError(f"no such cost model file: {spec}")
    return spec


def _tune_model(args: argparse.Namespace):
    """The cost model guiding a tune: the shipped (or given) model refined online, or one learned from
    scratch online (``online``, or when the package ships none); None with --no-cost-model (random)."""
    from costmodel.xgb import XGBModel
    from superopt.api import load_cost_model

    spec = _cost_model_arg(args)
    if spec is None:
        return None
    if spec == "online":
        return XGBModel()
    return load_cost_model(spec) or XGBModel()


def _zero_measurement(args: argparse.Namespace, graph, target, label: str) -> int:
    """``tune --trials 0``: each kernel's schedule picked by the cost model alone; nothing is measured
    or recorded (the database holds measurements only)."""
    from search.schedule.model_guided import schedules_from_model

    model = _tune_model(args)
    if model is None or not getattr(model, "trained", False):
        raise UsageError("--trials 0 picks schedules with a trained cost model: give one with --cost-model PATH "
                         "(or drop --no-cost-model to use the shipped one)")
    _, picks = schedules_from_model(graph, target, model, seed=args.seed)
    rows = [{"node": name, "default": p.is_default, "predicted_gain": p.predicted_gain, "candidates": p.candidates,
             "trace": [repr(x) for x in p.trace]} for name, p in picks.items()]
    if args.json:
        print(json.dumps({"model": label, "target": target.to_dict(), "measured": 0, "kernels": rows}, indent=2))
    else:
        changed = sum(not r["default"] for r in rows)
        print(f"picked schedules for {label} on {target.describe()} with no measurement: {changed} of "
              f"{len(rows)} kernels differ from the default heuristic (nothing recorded)")
        for r in rows:
            print(f"  {r['node'][:40]:40s} {'default' if r['default'] else 'model  '} "
                  f"predicted gain {r['predicted_gain']:+.3f} ({r['candidates']} scored)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on an embedded default: the capsule votes op and squeezenet, verified and timed."""
    import torch

    from superopt.api import OptimizeConfig, optimize, optimize_op
    from superopt.cli_artifact import _ort_session, write_artifact
    from superopt.frontends.light_models import light_model_inputs, randomized_light_model

    torch.set_num_threads(args.threads)
    cfg = OptimizeConfig(threads=args.threads)
    print(f"[1/2] capsule votes, one line of index notation:\n      {CAPSULE}")
    prog = optimize_op(CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)}, cfg)
    print(f"      {prog.report}")
    rng = np.random.default_rng(0)
    P = rng.standard_normal((8, 15, 15, 32, 4, 4)).astype(np.float32)
    W = rng.standard_normal((3, 3, 32, 32, 4, 4)).astype(np.float32)
    tp, tw = torch.from_numpy(P), torch.from_numpy(W)
    unfold = lambda: torch.einsum("nyxhwipr,hwiorq->nyxopq",  # noqa: E731
                                  tp.unfold(1, 3, 2).unfold(2, 3, 2).permute(0, 1, 2, 6, 7, 3, 4, 5), tw)
    ours, theirs = _alternating_medians([lambda: prog(P, W), unfold], 15)
    flops = 2 * 8 * 7 * 7 * 32 * 4 * 4 * 3 * 3 * 32 * 4
    err = float(np.abs(prog(P, W)[0] - unfold().numpy()).max())
    print(f"      superopt {ours * 1e3:.2f} ms ({flops / ours / 1e9:.1f} GFLOP/s) vs torch einsum "
          f"{theirs * 1e3:.2f} ms: {theirs / ours:.2f}x; max |diff| {err:.1e}")
    print("[2/2] squeezenet (onnx wheel, seeded random weights)")
    model = randomized_light_model("squeezenet")
    prog = optimize(model, cfg)
    print(f"      {prog.report}")
    feed = light_model_inputs(model)
    sess = _ort_session(model.SerializeToString(), args.threads)
    ref = sess.run(None, feed)[0]
    x = list(feed.values())
    got = prog(*x)[0]
    ours, theirs = _alternating_medians([lambda: prog(*x), lambda: sess.run(None, feed)], 15)
    print(f"      superopt {ours * 1e3:.1f} ms vs onnxruntime {theirs * 1e3:.1f} ms: {theirs / ours:.2f}x; "
          f"max |diff| vs onnxruntime {float(np.abs(got - ref).max()):.1e}")
    out, _ = write_artifact(prog, Path(args.out) / "squeezenet", "squeezenet (seeded random weights)",
                            model.SerializeToString(), prog.input_names, args.threads)
    print(f"wrote {out}/: report.md, report.json, report.png, optimized.onnx and the compiled kernels "
          f"(rerun: superopt run {out})")
    return 0


def _tune_graph_input(args: argparse.Namespace):
    """The graph to tune, from the model file or --op/--shape, and a label for it."""
    from superopt.api import define_op, load_graph

    if (args.model is None) == (args.op is None):
        raise UsageError("give a model file or --op TEXT (one of them)")
    if args.op is None:
        if args.shape:
            raise UsageError("--shape goes with --op")
        return load_graph(_model_file(args.model)), args.model
    shapes = dict(parse_shape(s) for s in args.shape or [])
    if not shapes:
        raise UsageError("--op needs the shape of every input: --shape NAME=AxBx.. (once per input)")
    return define_op(args.op, shapes), "op"


def _fma_peak(target, compiler) -> float | None:
    """The machine's FMA ceiling in GFLOP/s (superopt.measure.peak), or None where unavailable."""
    try:
        from superopt.measure.peak import fma_peak_gflops
    except ImportError:
        return None
    try:
        peak = fma_peak_gflops(target, compiler)
        return float(getattr(peak, "ceiling_gflops", peak))
    except Exception:  # noqa: BLE001 - the ceiling is extra information; the report stands without it
        return None


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def tune_summary(report, peak_gflops: float | None) -> dict:
    """The JSON form of a tune run: per kernel default/best ms, GFLOP/s, fraction of the FMA ceiling,
    measurements made in this run; totals weighted by how many nodes run each kernel. Where the picks were
    confirmed inside the graph, a kernel's default and best are its in-graph times there."""
    kernels = []
    tot_default = tot_best = 0.0
    complete = True
    for k in report.kernels:
        best = k.best_s if k.best_s is not None else k.default_s
        gflops = k.flops / best / 1e9 if best and k.flops else None
        kernels.append({
            "nodes": list(k.nodes), "workload_key": k.workload_key, "flops": k.flops,
            "default_ms": _ms(k.default_s), "best_ms": _ms(k.best_s),
            "speedup": k.default_s / k.best_s if k.default_s and k.best_s else None,
            "gflops": gflops,
            "fma_fraction": gflops / peak_gflops if gflops is not None and peak_gflops else None,
            "measured": k.measured, "from_database": k.from_database, "stop_reason": k.stop_reason,
        })
        if k.default_s is None or best is None:
            complete = False
        else:
            tot_default += k.default_s * len(k.nodes)
            tot_best += best * len(k.nodes)
    return {
        "kernels": kernels, "measured": report.measured, "elapsed_s": report.elapsed_s,
        "stop_reason": report.stop_reason, "fma_peak_gflops": peak_gflops,
        "total_default_ms": tot_default * 1e3 if complete else None,
        "total_best_ms": tot_best * 1e3 if complete else None,
        "all_from_database": bool(report.kernels) and all(k.from_database for k in report.kernels),
        # the picks timed against their defaults inside the graph (search/graph/confirm.py), where that ran
        "in_graph": report.in_graph.to_dict() if report.in_graph is not None else None,
    }


def _fmt_ms(v: float | None) -> str:
    return "    -    " if v is None else f"{v:9.3f}"


def print_tune_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout
    ks = summary["kernels"]
    if summary["all_from_database"] and summary["measured"] == 0:
        print(f"nothing to measure: all {len(ks)} kernels already tuned for this target", file=out)
    print(f"{'kernel':<28} {'default ms':>10} {'best ms':>10} {'speedup':>8} {'GFLOP/s':>8} {'measured':>9}", file=out)
    for k in ks:
        name = ",".join(k["nodes"])
        name = name if len(name) <= 28 else name[:25] + "..."
        speed = "-" if k["speedup"] is None else f"{k['speedup']:.2f}x"
        gf = "-" if k["gflops"] is None else f"{k['gflops']:.1f}"
        tag = " (db)" if k["from_database"] else ""
        print(f"{name:<28} {_fmt_ms(k['default_ms']):>10} {_fmt_ms(k['best_ms']):>10} {speed:>8} {gf:>8} "
              f"{k['measured']:>9}{tag}", file=out)
    d, b = summary["total_default_ms"], summary["total_best_ms"]
    total = "-" if d is None or not b else f"{d / b:.2f}x"
    print(f"{'total':<28} {_fmt_ms(d):>10} {_fmt_ms(b):>10} {total:>8} {'':>8} {summary['measured']:>9}", file=out)
    if not summary["stop_reason"].startswith("nothing to measure"):
        print(f"{summary['measured']} measurements in {summary['elapsed_s']:.1f}s; stop: {summary['stop_reason']}",
              file=out)


def cmd_tune(args: argparse.Namespace) -> int:
    from search.budget import DEFAULT_TRIALS
    from search.schedule.database import TuningDatabase
    from superopt.api import OptimizeConfig, rewrite_graph
    from superopt.ir.canonical import canonicalize_kernels
    from superopt.measure import MeasureConfig
    from superopt.runtime.compiler import CompilerConfig
    from superopt.target import host_target

    started = time.perf_counter()
    time_s = parse_time(args.time) if args.time is not None else None
    if args.trials is None and time_s is None:  # a time budget alone is the budget; neither given: the default trials
        args.trials = DEFAULT_TRIALS
    if args.trials is not None and args.trials < 0:
        raise UsageError(f"bad --trials {args.trials}: at least 0 (0: the cost model picks, nothing is measured)")
    if args.threads < 1:
        raise UsageError(f"bad --threads {args.threads}: at least 1")
    graph, label = _tune_graph_input(args)
    from search.schedule.tune import TuneConfig, tune_graph  # the schedule search (imported only when used)

    compiler = CompilerConfig()
    target = host_target(args.threads, compiler.cc)
    graph = canonicalize_kernels(rewrite_graph(graph, OptimizeConfig(threads=args.threads, target=target))[0])
    if args.trials == 0:
        return _zero_measurement(args, graph, target, label)
    db = TuningDatabase(args.db)
    mcfg = MeasureConfig(threads=args.threads, target=target, compiler=compiler)
    model = _tune_model(args)
    # --time is the command's: loading the model, its rewrites and the cost model came out of it
    left_s = None if time_s is None else max(0.0, time_s - (time.perf_counter() - started))
    config = TuneConfig(trials=args.trials, time_s=left_s, seed=args.seed, progress=not args.no_progress)
    if args.ray is not None:
        from superopt.measure.runner import make_runner

        with make_runner(args.ray, mcfg, args.ray_workers) as runner:
            report = tune_graph(graph, target, config, db, mcfg, model=model, runner=runner)
    else:
        report = tune_graph(graph, target, config, db, mcfg, model=model)
    summary = tune_summary(report, _fma_peak(target, compiler) if args.json else None)
    if args.json:
        if summary["all_from_database"] and summary["measured"] == 0:
            print(f"nothing to measure: all {len(summary['kernels'])} kernels already tuned for this target",
                  file=sys.stderr)
        summary = {"model": label, "database": str(args.db), "target": target.to_dict(),
                   "target_key": target.key(), **summary}
        print(json.dumps(summary, indent=2))
    else:
        print(f"tuned {label} on {target.describe()}; database {args.db}")
        print_tune_summary(summary)
    return 0


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _cost_model_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--cost-model", default="pretrained", metavar="PATH|pretrained",
                   help=f"{what} (default: the model shipped in the package)")
    p.add_argument("--no-cost-model", action="store_true", help="no cost model (default heuristic / random ranking)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superopt", description="search-based superoptimizer for tensor programs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("optimize", help="compile an ONNX model to verified C kernels and time it")
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--no-verify", action="store_true", help="skip the check against the reference interpreter")
    p.add_argument("--db", default=None, help=f"tuning database to take schedules from (default: ./{DEFAULT_DB} "
                                               "when it exists)")
    p.add_argument("--no-db", action="store_true", help="default schedules only, no tuning database")
    _cost_model_args(p, "the cost model that picks schedules with no measurement for kernels the database lacks")
    p.add_argument("--strict", action="store_true", help="fail on any node superopt cannot lower natively "
                                                         "(default: it runs through the ONNX fallback, named in the report)")
    p.add_argument("--shape", action="append", metavar="NAME=AxB..", help="shape of a model input with symbolic "
                                                                            "dimensions (repeat)")
    p.add_argument("--dim", action="append", metavar="NAME=N", help="size of a symbolic dimension, e.g. batch=1 "
                                                                      "(repeat)")
    p.add_argument("-o", "--out", default=None, metavar="OUT",
                   help="write the compiled artifact, optimized.onnx and report.md/json/png to this directory "
                        "(atomically); reload with superopt run OUT or superopt.load(OUT)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout (logs on stderr)")
    p.add_argument("--no-program-cache", action="store_true",
                   help="compile even when the compiler cache holds this model's verified program (and keep none)")
    p.add_argument("--budget", default=None, metavar="TIME",
                   help="wall-clock budget of the whole optimization, e.g. 90s, 5m: the schedule search over the "
                        "kernels the database lacks gets half of it (default: no schedule search)")
    p.add_argument("--trials", type=int, default=None, help="schedule search: at most this many measurements")
    p.add_argument("--seed", type=int, default=0, help="seed of the searches and of the verification inputs")
    p.add_argument("--target", default="cpu", choices=("cpu", "cuda"), help="what to compile for (default: cpu)")
    p.add_argument("--graph-search", default="backtracking", choices=("backtracking", "mcts", "greedy"),
                   help="how the rewrite rules are explored (default: cost-based backtracking)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(fn=cmd_optimize)
    t = sub.add_parser("tune", help="search schedules for every kernel of a model (or one op); record them in "
                                    "the tuning database",
                       description="superopt tune MODEL.onnx | --op TEXT --shape NAME=AxB.. [--shape ..]")
    t.add_argument("model", nargs="?", help="an ONNX model file")
    t.add_argument("--op", help="an op in index notation instead of a model, e.g. 'C[i,j] += A[i,k] * B[k,j]'")
    t.add_argument("--shape", action="append", metavar="NAME=AxB..", help="shape of an --op input (repeat)")
    t.add_argument("--trials", type=int, default=None,
                   help="measurements over all kernels (default 200, or no limit when --time is given)")
    t.add_argument("--time", default=None, help="wall-clock budget, e.g. 90s, 10m, 1h (default: none)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--db", default=DEFAULT_DB, help=f"tuning database (JSON lines; default ./{DEFAULT_DB})")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _cost_model_args(t, "the cost model ranking candidates (refined online); 'online': learn from scratch")
    t.add_argument("--ray", default=None, metavar="auto|ADDRESS", help="measure on a Ray cluster")
    t.add_argument("--ray-workers", type=int, default=None, metavar="W", help="Ray actors (default: CPUs / threads)")
    t.set_defaults(fn=cmd_tune)
    register_dataset(sub)
    register_costmodel(sub)
    register_artifact(sub)
    d = sub.add_parser("demo", help="run the capsule votes op and squeezenet end to end")
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--out", default="demo_out", help="where the squeezenet artifact and its report go")
    d.set_defaults(fn=cmd_demo)
    args = parser.parse_args(argv)
    from superopt.api import VerificationError

    try:
        return args.fn(args)
    except UsageError as err:
        print(f"superopt {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except VerificationError as err:
        print(f"superopt {args.command}: verification failed: {_one_line(err)}", file=sys.stderr)
        return EXIT_VERIFICATION
    except (ValueError, RuntimeError, OSError) as err:
        print(f"superopt {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as err:  # noqa: BLE001 - a bug of ours: one line, its own exit code
        print(f"superopt {args.command}: internal error: {type(err).__name__}: {_one_line(err)}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
