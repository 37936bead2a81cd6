"""Differential fuzzing: random ONNX graphs through the whole pipeline, compared with onnxruntime.

Each case (``run_case``) imports a random model (``superopt.testing.fuzz_graphs``), applies the rewrite
rules, canonicalizes kernels, schedules every kernel — by the default heuristic, by a random legal point of
its schedule space (what a search tries; the default mode), or by a real search with a few measured trials
— compiles, runs on random inputs and compares every output with onnxruntime. Outcomes:

- ``pass``;
- ``mismatch``: an output differs (shape, NaN pattern, or error above ``rtol`` of the output's largest
  magnitude); the detail says whether the reference interpreter agrees with onnxruntime (then the bug is in
  code generation or a rewrite) or not (then in the importer or an op's definition);
- ``error``: superopt raised (the detail names the exception);
- ``invalid``: onnxruntime rejected the graph (a generator bug, not a superopt one).

A failing case is shrunk (``shrink``) to the smallest sub-graph that still fails and can be saved as a
regression test (``save_regression``: ``tests/fuzz_regressions/*.onnx``, run by
``tests/test_fuzz_regressions.py``).

Command line (thousands of graphs, in parallel worker processes; a worker killed by a signal — a
segfaulting kernel — is reported as a ``crash`` of the case it was running, and a new worker goes on):

    python -m superopt.testing.fuzz --count 2000 --jobs 2 [--start 0] [--schedules random|default|search]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from superopt.frontends.light_models import light_model_inputs as random_feed
from superopt.frontends.light_models import run_onnxruntime
from superopt.testing.fuzz_graphs import random_model

MODES = ("default", "random", "search")
REGRESSIONS = Path(__file__).resolve().parents[2] / "tests" / "fuzz_regressions"


@dataclass(frozen=True)
class FuzzConfig:
    schedules: str = "random"  # "default" | "random" (a random point of each kernel's space) | "search"
    trials: int = 8  # measured trials per graph in "search" mode
    threads: int = 2
    rtol: float = 1e-3  # of the output's largest magnitude (float32 vs float32, different summation orders)
    min_ops: int = 2
    max_ops: int = 12

    def __post_init__(self) -> None:
        if self.schedules not in MODES:
            raise ValueError(f"unknown schedule mode {self.schedules!r} (known: {', '.join(MODES)})")


@dataclass(frozen=True)
class FuzzResult:
    seed: int
    outcome: str  # pass | mismatch | error | invalid | crash
    detail: str = ""
    nodes: int = 0  # ONNX nodes
    kernels: int = 0  # compute nodes after the rewrite rules
    random_fallbacks: int = 0  # kernels whose random schedule point was illegal (the default ran instead)
    seconds: float = 0.0


ABS_FLOOR = 0.1  # errors are relative to max(largest |value|, this): near-zero outputs get an absolute tolerance
CONDITIONING = 16.0  # superopt may stray from float64 this many times further than onnxruntime's float32 does
IMPORT_BOUND = 1e-2  # onnxruntime this far from the float64 reference: the import (or the op's meaning) is wrong


def error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| relative to max(|want|, ABS_FLOOR), NaN and infinity pattern ignored (see compare)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    ok = np.isfinite(got) & np.isfinite(want)
    scale = max(float(np.abs(want[ok]).max(initial=0.0)), ABS_FLOOR)
    return float(np.abs(got[ok] - want[ok]).max(initial=0.0)) / scale


def compare(got: np.ndarray, want: np.ndarray, rtol: float) -> str | None:
    """None when ``got`` matches ``want``; otherwise why not."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_g, nan_w):
        return f"NaN at {int(nan_g.sum())} places, onnxruntime at {int(nan_w.sum())}"
    got, want = np.where(nan_g, 0, got), np.where(nan_w, 0, want)
    inf = np.isinf(want) | np.isinf(got)
    if not np.array_equal(got[inf], want[inf]):
        return "infinities differ"
    err = error(got, want)
    return None if err <= rtol else f"relative error {err:.3g}"


def _schedules(graph, target, config: FuzzConfig, seed: int) -> tuple[dict, int]:
    from superopt.schedule.graph_defaults import constant_inputs, default_schedules
    from superopt.schedule.plan import ScheduleError
    from superopt.schedule.space import ScheduleSpace

    schedules = default_schedules(graph, target)
    if config.schedules == "default":
        return schedules, 0
    if config.schedules == "search":
        from search.schedule.database import TuningDatabase, schedules_from_database
        from search.schedule.tune import TuneConfig, tune_graph

        with tempfile.TemporaryDirectory() as tmp:
            db = TuningDatabase(Path(tmp) / "db.jsonl")
            tune_graph(graph, target, TuneConfig(trials=config.trials, seed=seed, progress=False, confirm_top=0), db)
            found, _ = schedules_from_database(graph, target, db)
        return schedules | found, 0
    rng = random.Random(seed)
    fallbacks = 0
    for n in graph.nodes:
        if n.is_extern:
            continue
        space = ScheduleSpace(n.op, target, constant_inputs(graph, n))
        try:
            schedules[n.name] = list(space.trace(space.sample(rng)))
        except ScheduleError:
            fallbacks += 1  # the sampler drew an illegal combination: keep the default
    return schedules, fallbacks


def run_case(model: onnx.ModelProto, seed: int, config: FuzzConfig) -> FuzzResult:
    """Optimize ``model`` through the pipeline and compare it with onnxruntime on random inputs."""
    from superopt.api import OptimizeConfig, rewrite_graph
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.interp import evaluate
    from superopt.ir.canonical import canonicalize_kernels
    from superopt.runtime.executor import ExecutorConfig, GraphExecutor

    t0 = time.perf_counter()
    n_nodes = len(model.graph.node)
    feed = random_feed(model, seed)
    try:
        want = run_onnxruntime(model, feed)
    except Exception as err:  # noqa: BLE001 - any rejection is a generator bug
        return FuzzResult(seed, "invalid", _one_line(err), n_nodes)
    kernels = fallbacks = 0
    try:
        cfg = OptimizeConfig(threads=config.threads, cost_model=None)
        imported = import_onnx_model(model)
        graph = canonicalize_kernels(rewrite_graph(imported.graph, cfg)[0])
        target = cfg.resolved_target()
        kernels = sum(not n.is_extern for n in graph.nodes)
        schedules, fallbacks = _schedules(graph, target, config, seed)
        ex = GraphExecutor(graph, schedules, ExecutorConfig(target.threads, cfg.compiler, target))
        args = {g: feed[o] for g, o in zip(imported.graph.inputs, imported.input_names, strict=True)}
        out = ex(args)
        got = [out[o] for o in graph.outputs]
    except Exception as err:  # noqa: BLE001 - every failure is an outcome to count
        return FuzzResult(seed, "error", _one_line(err), n_nodes, kernels, fallbacks, time.perf_counter() - t0)
    bad = [(i, why) for i, (g, w) in enumerate(zip(got, want, strict=True))
           if (why := compare(g, w, config.rtol)) is not None]
    if not bad:
        return FuzzResult(seed, "pass", "", n_nodes, kernels, fallbacks, time.perf_counter() - t0)
    ref = evaluate(imported.graph, {g: feed[o] for g, o in zip(imported.graph.inputs, imported.input_names)}, np.float64)
    outcome, detail = judge(bad, got, want, [ref[o] for o in imported.graph.outputs], config.rtol,
                            [o.name for o in model.graph.output])
    return FuzzResult(seed, outcome, detail, n_nodes, kernels, fallbacks, time.perf_counter() - t0)


def judge(bad: list[tuple[int, str]], got: list[np.ndarray], want: list[np.ndarray], ref: list[np.ndarray],
          rtol: float, names: list[str]) -> tuple[str, str]:
    """The outcome of outputs ``bad`` (index, why) that differ from onnxruntime (``want``), given the float64
    reference interpreter's ``ref``. An ill-conditioned output (a normalization of nearly equal values, ...)
    strays from float64 in any float32 implementation: superopt is judged against how far onnxruntime itself
    strays, unless onnxruntime and the reference disagree, which points at the import or an op's meaning."""
    importer, codegen = [], []
    for i, why in bad:
        if compare(ref[i], want[i], IMPORT_BOUND) is not None:
            importer.append((i, why))
        elif error(got[i], ref[i]) > max(rtol, CONDITIONING * error(want[i], ref[i])):
            codegen.append((i, why + f" (onnxruntime strays {error(want[i], ref[i]):.2g} from float64)"))
    if not importer and not codegen:
        return "pass", "ill-conditioned: within the float32 error"
    where = "the reference interpreter differs too (importer or op definition)" if importer else \
        "the reference interpreter agrees with onnxruntime (code generation, schedule or rewrite)"
    return "mismatch", "; ".join(f"output {names[i]}: {why}" for i, why in importer + codegen) + f"; {where}"


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: " + " ".join(str(err).split())[:300]


def fuzz_seed(seed: int, config: FuzzConfig) -> FuzzResult:
    return run_case(random_model(seed, config.min_ops, config.max_ops), seed, config)


# ---- shrinking ------------------------------------------------------------------------------------------
def sub_model(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """The part of ``model`` that computes ``output`` (its ancestors), with ``output`` as the only output."""
    producers = {o: n for n in model.graph.node for o in n.output}
    keep: list[onnx.NodeProto] = []
    seen: set[str] = set()
    stack = [output]
    while stack:
        t = stack.pop()
        n = producers.get(t)
        if n is None or n.name in seen:
            continue
        seen.add(n.name)
        keep.append(n)
        stack.extend(i for i in n.input if i)
    nodes = [n for n in model.graph.node if n.name in seen]  # original (topological) order
    used = {i for n in nodes for i in n.input}
    g = model.graph
    shapes = onnx.shape_inference.infer_shapes(model).graph
    vi = {v.name: v for v in list(shapes.value_info) + list(shapes.output) + list(shapes.input)}
    graph = onnx.helper.make_graph(
        nodes, g.name, [i for i in g.input if i.name in used],
        [vi[output]], [t for t in g.initializer if t.name in used])
    m = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    m.ir_version = model.ir_version
    return m


def shrink(model: onnx.ModelProto, fails: Callable[[onnx.ModelProto], bool]) -> onnx.ModelProto:
    """The smallest sub-model (ancestors of one tensor) for which ``fails`` still holds."""
    best = model
    candidates = sorted({o for n in model.graph.node for o in n.output},
                        key=lambda t: len(sub_model(model, t).graph.node))
    for t in candidates:
        m = sub_model(model, t)
        if len(m.graph.node) >= len(best.graph.node):
            break
        if fails(m):
            return m
    return best


def save_regression(model: onnx.ModelProto, result: FuzzResult, config: FuzzConfig, directory: Path = REGRESSIONS
                    ) -> Path:
    """Write a failing (shrunk) model with what is needed to replay it; ``tests/test_fuzz_regressions.py``
    runs every file there."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"seed": result.seed, "schedules": config.schedules, "outcome": result.outcome, "detail": result.detail}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, {"superopt_fuzz": json.dumps(meta, sort_keys=True)})
    data = model.SerializeToString()
    path = directory / f"seed{result.seed}_{hashlib.sha256(data).hexdigest()[:10]}.onnx"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


# ---- the command line: many seeds in worker processes ---------------------------------------------------
def _worker(seeds: list[int], config: FuzzConfig) -> None:
    for s in seeds:
        print(json.dumps({"start": s}), flush=True)
        print(json.dumps(asdict(fuzz_seed(s, config))), flush=True)


def _run_chunk(seeds: list[int], config: FuzzConfig, timeout: float) -> list[FuzzResult]:
    """Run ``seeds`` in a child process; a crash or hang costs only the case it happened in."""
    results: list[FuzzResult] = []
    todo = list(seeds)
    while todo:
        cmd = [sys.executable, "-m", "superopt.testing.fuzz", "--worker", json.dumps(todo), "--config",
               json.dumps(asdict(config))]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(todo))
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
            rc = "timeout"
        current = None
        for line in out.splitlines():
            d = json.loads(line)
            if "start" in d:
                current = d["start"]
            else:
                results.append(FuzzResult(**d))
                todo.remove(d["seed"])
                current = None
        if current is not None:  # died inside this case
            results.append(FuzzResult(current, "crash", f"worker exit {rc}"))
            todo.remove(current)
        elif todo and rc != 0:
            results.extend(FuzzResult(s, "crash", f"worker exit {rc} before starting") for s in todo)
            break
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m superopt.testing.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--schedules", choices=MODES, default="random")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads per case (jobs x threads <= cores)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--save", action="store_true", help="shrink failures and save them under tests/fuzz_regressions")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(json.loads(args.worker), FuzzConfig(**json.loads(args.config)))
        return 0
    config = FuzzConfig(schedules=args.schedules, trials=args.trials, threads=args.threads)
    seeds = list(range(args.start, args.start + args.count))
    chunks = [seeds[i::args.jobs] for i in range(args.jobs)]
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = sorted((r for rs in pool.map(lambda c: _run_chunk(c, config, args.timeout), chunks) for r in rs),
                         key=lambda r: r.seed)
    counts = Counter(r.outcome for r in results)
    failures = [r for r in results if r.outcome not in ("pass",)]
    saved = []
    if args.save:
        for r in failures:
            if r.outcome in ("mismatch", "error"):
                model = random_model(r.seed, config.min_ops, config.max_ops)
                small = shrink(model, lambda m, r=r: run_case(m, r.seed, config).outcome == r.outcome)
                saved.append(str(save_regression(small, run_case(small, r.seed, config), config)))
    report = {"count": len(results), "outcomes": dict(counts), "seconds": round(time.perf_counter() - t0, 1),
              "failures": [asdict(r) for r in failures], "saved": saved, "config": asdict(config),
              "start": args.start}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{len(results)} graphs in {report['seconds']} s: " +
              ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for r in failures:
            print(f"  seed {r.seed}: {r.outcome}: {r.detail}")
        for p in saved:
            print(f"  saved {p}")
    return 0 if counts.get("pass", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
