"""Schedule search against the default heuristic, random sampling and the peers, with rooflines.

    python benchmarks/search.py [--quick] [--trials N] [--early N] [--only sgemm,softmax,...] [--rounds R]
        [--seed S] [--out benchmarks/results]
    python benchmarks/search.py --ablation [--random N] [--ratio 5] ...   (the cost model: search_ablation.py)

For every workload (``search_workloads.py``) the graph goes through the graph passes (rewrite,
canonical kernels) and then:
  * one evolutionary search run of N trials over all its kernels (``search.schedule.tune.tune_graph``, a fresh
    temporary tuning database): "search@N" is its best schedules, "search@E" the best among the
    first E measurements (read back from the database, which holds them in measurement order);
  * one random-sampling run of N trials: "random@N" (its best over its own samples, not the default);
  * the default heuristic's schedules, PyTorch eager and onnxruntime.
Every superopt variant is compiled into a graph executor and checked against the float64 reference;
then all variants and peers are re-timed **in alternation** (``timing.time_alternating``): the table
never shows the search's own measurements (those are listed separately as its estimates).
Rooflines: GFLOP/s over the FMA ceiling of ``superopt.measure.peak`` (measured at the start of the
run), and for memory-bound workloads the time the compulsory traffic takes at the DRAM triad
bandwidth and at the copy bandwidth of a buffer of the workload's own size (which may sit in cache).

Writes ``search.md`` and ``search.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("OMP_NUM_THREADS", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# run as a script, this file's folder comes first on sys.path and its name would shadow the search package
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE]
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.search_workloads import SEARCH_WORKLOADS, SearchWorkload, WorkloadSpec  # noqa: E402
from benchmarks.systems.base import THREADS  # noqa: E402

if TYPE_CHECKING:
    from search.schedule.database import TuningDatabase
    from search.schedule.tune import GraphTuneReport, KernelTuneResult
    from superopt.ir.graph import Graph
    from superopt.measure.peak import CopyKernel
    from superopt.target import Target

SUPEROPT_VARIANTS = ("default", "search@early", "search@final", "random@final")
PEERS = ("eager", "onnxruntime")
QUICK = dict(trials=48, early=16, timing=timing.TimingConfig(warmup_calls=2, rounds=5, min_sample_s=0.04))
FULL = dict(trials=200, early=64, timing=timing.TimingConfig(warmup_calls=3, rounds=15, min_sample_s=0.1))


def log(msg: str) -> None:
    print(msg, flush=True)


# -- schedules from search runs ---------------------------------------------------------------------------


def schedules_from_kernels(graph: Graph, kernels: Sequence[KernelTuneResult], default: Mapping[str, list]
                           ) -> dict[str, list]:
    """Node -> the kernel's best trace from a tune report (the default where a kernel has none)."""
    out = dict(default)
    for k in kernels:
        if k.best_s is not None:  # an empty trace is a schedule too (the naive loop nest)
            out.update({n: list(k.best_trace) for n in k.nodes})
    return out


def schedules_after(graph: Graph, db: TuningDatabase, target: Target, n: int, default: Mapping[str, list]
                    ) -> tuple[dict[str, list], float]:
    """Node -> the best trace among the first ``n`` measurements in ``db`` (file = measurement order),
    and the search's own estimate of the graph's time with them (sum over nodes of kernel times)."""
    from search.schedule.database import node_workload_key

    best: dict[str, tuple[float, tuple]] = {}
    for r in db.records(target=target)[:n]:
        if r.ok and r.median_s is not None and r.median_s < best.get(r.workload_key, (np.inf,))[0]:
            best[r.workload_key] = (r.median_s, r.trace)
    out, est = dict(default), 0.0
    for node in default:
        key = node_workload_key(graph, node)
        if key in best:
            out[node] = list(best[key][1])
            est += best[key][0]
        else:
            est = np.nan
    return out, est


def kernel_estimate(kernels: Sequence[KernelTuneResult], attr: str) -> float | None:
    """The search's own measure of the graph: sum over nodes of a kernel's ``default_s``/``best_s``."""
    total = 0.0
    for k in kernels:
        v = getattr(k, attr)
        if v is None:
            return None
        total += v * len(k.nodes)
    return total


def run_search(graph: Graph, target: Target, trials: int, seed: int, strategy: str, workdir: Path,
               guide: str = "none") -> tuple[GraphTuneReport, TuningDatabase]:
    """One tune of ``graph``; ``guide``: ``none`` (candidates ranked at random) or ``pretrained`` (the shipped
    cost model refined online, as ``superopt tune`` runs by default)."""
    from search.schedule.database import TuningDatabase
    from search.schedule.tune import TuneConfig, tune_graph
    from superopt.api import load_cost_model

    db = TuningDatabase(workdir / f"{strategy}.jsonl")
    t0 = time.perf_counter()
    model = load_cost_model("pretrained") if guide == "pretrained" and strategy != "random" else None
    rep = tune_graph(graph, target, TuneConfig(trials=trials, seed=seed, strategy=strategy, progress=True), db,
                     model=model)
    log(f"  {strategy}: {rep.measured} measurements in {time.perf_counter() - t0:.0f}s ({rep.stop_reason})")
    return rep, db


# -- building and checking what is timed ----------------------------------------------------------------------


def schedule_key(schedules: Mapping[str, list]) -> str:
    from superopt.schedule.primitives import trace_to_json

    return json.dumps({n: trace_to_json(t) for n, t in sorted(schedules.items())})


def rel_error(out: object, reference: np.ndarray | None) -> float | None:
    if reference is None:
        return None
    if isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, torch.Tensor):
        out = out.detach().numpy()
    out = np.asarray(out, np.float64)
    if out.shape != reference.shape:
        return float("nan")
    return float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-30))


def superopt_fn(graph: Graph, schedules: Mapping[str, list], target: Target, feeds: Mapping[str, np.ndarray]
                ) -> Callable[[], np.ndarray]:
    from superopt.runtime.executor import ExecutorConfig, GraphExecutor

    ex = GraphExecutor(graph, schedules, ExecutorConfig(target.threads, target=target))
    out = graph.outputs[0]
    return lambda: ex(feeds)[out]


def peer_fns(instance: object) -> dict[str, Callable[[], object] | str]:
    """Peer name -> its prepared callable, or a string saying why it is missing."""
    from benchmarks.systems import load_system

    fns: dict[str, Callable[[], object] | str] = {}
    for name in PEERS:
        system, note = load_system(name)
        if system is None:
            fns[name] = note
            continue
        try:
            fns[name] = system.prepare(instance, True)[0]
        except Exception as e:  # noqa: BLE001 - a failing peer is reported, not fatal
            fns[name] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return fns


# -- one workload -------------------------------------------------------------------------------------------------


def prepare_graph(w: SearchWorkload) -> tuple[Graph, tuple[str, ...]]:
    from superopt.api import rewrite_graph
    from superopt.ir.canonical import canonicalize_kernels

    graph, rules = rewrite_graph(w.graph)
    return canonicalize_kernels(graph), rules


def search_variants(graph: Graph, target: Target, trials: int, early: int, seed: int, guide: str = "none"
                    ) -> tuple[dict[str, dict], dict]:
    """The four superopt variants' schedules, and the search facts for the report."""
    from superopt.schedule.graph_defaults import default_schedules

    default = default_schedules(graph, target)
    with tempfile.TemporaryDirectory(prefix="superopt-search-bench-") as tmp:
        evo, evo_db = run_search(graph, target, trials, seed, "evolutionary", Path(tmp), guide)
        rnd, _ = run_search(graph, target, trials, seed, "random", Path(tmp))
        early_sched, early_est = schedules_after(graph, evo_db, target, early, default)
    variants = {"default": default, "search@early": early_sched,
                "search@final": schedules_from_kernels(graph, evo.kernels, default),
                "random@final": schedules_from_kernels(graph, rnd.kernels, default)}
    facts = {
        "kernels": len(evo.kernels), "compute_nodes": len(default),
        "estimates_s": {"default": kernel_estimate(evo.kernels, "default_s"),
                        "search@early": None if np.isnan(early_est) else early_est,
                        "search@final": kernel_estimate(evo.kernels, "best_s"),
                        "random@final": kernel_estimate(rnd.kernels, "best_s")},
        "evolutionary": evo.to_dict(), "random": rnd.to_dict(),
    }
    return variants, facts


def time_workload(w: SearchWorkload, graph: Graph, variants: dict[str, dict], target: Target, cfg: timing.TimingConfig
                  ) -> tuple[dict, dict, dict, dict, float, float | None]:
    """Build every distinct variant and the peers, check them, time them all in alternation, together with the
    FMA probe and, for a memory-bound workload, the copy of its own footprint: (times, errors, status, same_as,
    FMA ceiling GFLOP/s, footprint copy GB/s or None)."""
    feeds = w.feeds
    keys = {name: schedule_key(s) for name, s in variants.items()}
    same_as = {name: next(n for n in variants if keys[n] == keys[name]) for name in variants}
    fns, errors, status = {}, {}, {}
    for name in variants:
        if same_as[name] != name:
            status[name] = f"same schedules as {same_as[name]}"
            continue
        try:
            fns[name] = superopt_fn(graph, variants[name], target, feeds)
            errors[name] = rel_error(fns[name](), w.instance.reference)
            status[name] = "ok"
        except Exception as e:  # noqa: BLE001
            status[name] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            traceback.print_exc(limit=3)
    for name, fn in peer_fns(w.instance).items():
        if isinstance(fn, str):
            status[name] = fn
            continue
        try:
            errors[name] = rel_error(fn(), w.instance.reference)
        except Exception as e:  # noqa: BLE001
            status[name] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        fns[name] = fn
        status[name] = "ok"
    probe, probe_flops = fma_probe(target)
    fns[FMA_PROBE] = probe
    copy = footprint_copy(w, target)
    if copy is not None:
        fns[COPY_PROBE] = copy.run
    timed = timing.time_alternating(fns, cfg)
    ceiling = probe_flops() / timed.pop(FMA_PROBE).median_s / 1e9
    copy_gbs = copy.bytes_moved / timed.pop(COPY_PROBE).median_s / 1e9 if copy is not None else None
    times = {}
    for name in (*variants, *PEERS):
        src = same_as.get(name, name)
        if src in timed:
            r = timed[src]
            times[name] = {"median_s": r.median_s, "min_s": r.min_s, "samples_s": r.samples_s,
                           "calls_per_sample": r.calls_per_sample}
            errors.setdefault(name, errors.get(src))
    return times, errors, status, same_as, ceiling, copy_gbs


FMA_PROBE = "fma_chains"
COPY_PROBE = "footprint_copy"


def fma_probe(target: Target, call_s: float = 0.002) -> tuple[Callable[[], object], Callable[[], float]]:
    """The FMA-chain kernel of ``superopt.measure.peak`` as one more system of the alternating rounds (about
    ``call_s`` a call), and a function giving the flops of a call on ``target.threads`` threads: the ceiling
    measured in the same minutes as the kernels (a shared host's ceiling moves by 10-15% with its
    neighbours' load, a cached one may be from a quieter or a busier hour). Each thread runs the same chains
    however many run, so a call's time is the ceiling's time even where OpenMP gave it fewer threads; counting
    the calibration call's threads instead would halve a row's ceiling whenever that call got one thread of two."""
    from superopt.measure.peak import FmaKernel

    k = FmaKernel(target)
    threads = target.threads
    iters, _, _ = k.calibrate(threads, call_s)
    ran: list[int] = []

    def flops() -> float:
        if any(r != threads for r in ran):
            log(f"  (FMA probe: {sum(r != threads for r in ran)} of {len(ran)} calls ran on fewer than {threads} threads)")
        return k.flops(iters, threads)
    return (lambda: ran.append(k.run(iters, threads)[1])), flops


def roofline(w: SearchWorkload, times: Mapping[str, dict], peak_gflops: float, dram_gbs: float,
             footprint_gbs: float | None, tile_gflops: float | None = None,
             footprint_bestof_gbs: float | None = None) -> dict[str, dict]:
    """Per timed variant: GFLOP/s, fraction of the FMA ceiling (and of the register-tile ceiling, the
    best a broadcast-FMA tile fed from L1 does), fraction of the memory bounds: the DRAM triad's, the copy
    of the workload's own footprint timed in the same rounds (``footprint_gbs``, its median) and that copy's
    best of 50 calls measured apart (``footprint_bestof_gbs``, an upper bound no median reaches)."""
    out = {}
    for name, t in times.items():
        s = t["median_s"]
        r = {"gflops": w.flops / s / 1e9}
        r["fma_fraction"] = r["gflops"] / peak_gflops
        if tile_gflops and not w.memory_bound:
            r["tile_fraction"] = r["gflops"] / tile_gflops
        if w.memory_bound:
            r["dram_fraction"] = w.memory_bytes / (dram_gbs * 1e9) / s
            if footprint_gbs:
                r["footprint_fraction"] = w.memory_bytes / (footprint_gbs * 1e9) / s
            if footprint_bestof_gbs:
                r["footprint_bestof_fraction"] = w.memory_bytes / (footprint_bestof_gbs * 1e9) / s
        out[name] = r
    return out


def footprint_bytes(w: SearchWorkload) -> int:
    """Each of the two copy buffers of the footprint bound: half the workload's compulsory traffic."""
    return max(w.memory_bytes // 2, 1 << 16)


def footprint_bandwidth(w: SearchWorkload, target: Target) -> float | None:
    """Best-of-50 copy bandwidth over two buffers of half the workload's traffic each (its own footprint)."""
    if not w.memory_bound:
        return None
    from superopt.measure.peak import measure_bandwidth

    return measure_bandwidth(target, array_bytes=footprint_bytes(w), repeats=50).copy_gbs


def footprint_copy(w: SearchWorkload, target: Target) -> CopyKernel | None:
    """The footprint's copy as one more system of the workload's alternating rounds (memory-bound workloads):
    its median is the bound a kernel's median is held to: a best of 50 calls measured apart runs faster than a
    median on a shared host, so it would hold the kernels' medians to a bound no median reaches (it is still
    reported, in brackets)."""
    if not w.memory_bound:
        return None
    from superopt.measure.peak import CopyKernel

    return CopyKernel(target, footprint_bytes(w))


def run_workload(spec: WorkloadSpec, target: Target, settings: dict, machine: dict) -> dict:
    t0, load_before = time.perf_counter(), _load()
    w = spec.build()
    graph, rules = prepare_graph(w)
    log(f"[{w.name}] {w.description}: {sum(not n.is_extern for n in graph.nodes)} compute node(s), "
        f"rewrites {list(rules)}")
    variants, facts = search_variants(graph, target, settings["trials"], settings["early"], settings["seed"],
                                      settings.get("guide", "none"))
    times, errors, status, same_as, ceiling, copy_gbs = time_workload(w, graph, variants, target, settings["timing"])
    fastest = max((w.flops / t["median_s"] / 1e9 for t in times.values() if t.get("median_s")), default=0.0)
    if ceiling < fastest:
        # no kernel outruns the FMA chains: the probe's calls were slowed in this row's rounds (a neighbour's
        # threads can take a core from the probe alone, even with every call on two threads); the row
        # falls back to the ceiling measured at the start of the run
        log(f"  (FMA probe read {ceiling:.0f} GFLOP/s, below the fastest system's {fastest:.0f}: the start-of-run "
            f"ceiling {machine['fma']['ceiling_gflops']:.0f} is used for this row)")
        ceiling = machine["fma"]["ceiling_gflops"]
    fp = footprint_bandwidth(w, target)
    # the tile's ceiling on the same scale: its ratio to the FMA chains (measured in alternation) times the ceiling
    tile_fraction = machine.get("tile", {}).get("fma_fraction")
    row = {"workload": w.name, "description": w.description, "flops": w.flops, "memory_bytes": w.memory_bytes,
           "memory_bound": w.memory_bound, "rewrites": list(rules), "times": times, "rel_errors": errors,
           "status": status, "same_as": same_as, "footprint_copy_gbs": fp, "footprint_copy_alternating_gbs": copy_gbs,
           "fma_ceiling_alternating_gflops": ceiling,
           "roofline": roofline(w, times, ceiling, machine["bandwidth"]["triad_gbs"], copy_gbs,
                                tile_fraction * ceiling if tile_fraction else None, fp),
           **facts, "elapsed_s": time.perf_counter() - t0, "load_before": load_before, "load_after": _load()}
    for name, t in times.items():
        log(f"  {name:14s} {t['median_s'] * 1e3:9.3f} ms  rel err {errors.get(name)}")
    del w, graph, variants
    gc.collect()
    return row


# -- report -------------------------------------------------------------------------------------------------------------


def _ms(row: dict, name: str) -> str:
    t = row.get("times", {}).get(name)
    if t is None:
        return "-"
    same = row.get("same_as", {}).get(name, name)
    return f"{t['median_s'] * 1e3:.3f}" + ("=" if same != name else "")


def _ratio(row: dict, num: str, den: str) -> str:
    t = row.get("times", {})
    if num not in t or den not in t:
        return "-"
    return f"{t[num]['median_s'] / t[den]['median_s']:.2f}x"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _labels(settings: dict) -> dict[str, str]:
    early, final = settings["early"], settings["trials"]
    return {"default": "default", "search@early": f"search@{early}", "search@final": f"search@{final}",
            "random@final": f"random@{final}", "eager": "torch eager", "onnxruntime": "onnxruntime"}


def _header(report: dict) -> list[str]:
    s, m = report["settings"], report["machine"]
    early, final = s["early"], s["trials"]
    fma, bw = m["fma"], m["bandwidth"]
    return [
        "# Schedule search benchmark", "",
        f"`benchmarks/search.py{' --quick' if s['quick'] else ''}`, run {report['date']} on {m['cpu']} "
        f"({m['threads']} threads per system; load average {m['load_start']} -> {m.get('load_end', '?')}). "
        f"One evolutionary search of {final} trials per workload"
        + (" guided by the shipped cost model (refined online)" if s.get("guide") == "pretrained" else
           " (candidates ranked in random order)")
        + f" (all its kernels share the budget; search@{early} is "
        f"its best among the first {early} measurements), one random-sampling run of {final} trials; then every "
        f"variant and peer re-timed in alternation ({s['rounds']} rounds of >= {s['min_sample_s']} s samples, "
        "median). `=` marks a variant whose schedules are identical to another column's (timed once).", "",
        f"Machine ceilings (`superopt.measure.peak`): FMA {fma['gflops']:.0f} GFLOP/s with {fma['threads']} threads "
        f"(one thread {fma['gflops_1t']:.0f}; {fma['vector_bits']}-bit vectors, {fma['accumulators']} chains); "
        f"roofline ceiling used {fma['ceiling_gflops']:.0f} GFLOP/s"
        + (f"; register tile ({m['tile']['rows']} x {m['tile']['vectors']} vectors fed from L1) "
           f"{m['tile']['fma_fraction']:.2f} of the FMA chains in alternation, {m['tile']['ceiling_gflops']:.0f} GFLOP/s"
           if "tile" in m else "")
        + ("; the same tile written back every N reduction steps, as a contraction's tiles are (at 1024 its vector "
           "operand streams from L2, as sgemm's packed panel does): "
           + ", ".join(f"N={x['steps']} {x['written_back_fma_fraction']:.2f}" for x in m["tile_write_back"])
           + " of the chains" if m.get("tile_write_back") else "")
        + "; memory bandwidth (triad, "
        f"{bw['array_bytes'] >> 20} MiB arrays) {bw['triad_gbs']:.1f} GB/s.",
    ]


def _times_table(report: dict) -> list[str]:
    label, cols = _labels(report["settings"]), (*SUPEROPT_VARIANTS, *PEERS)
    lines = ["## Times (ms, lower is better)", "",
             "| workload | MFLOP | " + " | ".join(label[c] for c in cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for row in report["workloads"]:
        if "error" in row:
            lines.append(f"| {row['workload']} | error: {row['error']} |")
        else:
            lines.append(f"| {row['workload']} | {row['flops'] / 1e6:.1f} | "
                         + " | ".join(_ms(row, c) for c in cols) + " |")
    return lines


def _ratio_table(report: dict) -> list[str]:
    label = _labels(report["settings"])
    best = label["search@final"]
    others = ("default", "search@early", "random@final", "eager", "onnxruntime")
    lines = [f"## Ratios (time of the other / time of {best}; above 1: the search wins)", "",
             "| workload | " + " | ".join(f"{label[o]} / {best}" for o in others) + " |",
             "|---|" + "---:|" * len(others)]
    for row in report["workloads"]:
        if "error" not in row:
            lines.append(f"| {row['workload']} | " + " | ".join(_ratio(row, o, "search@final") for o in others) + " |")
    return lines


def _gflops(rf: dict, name: str) -> str:
    return f"{rf[name]['gflops']:.1f}" if name in rf else "-"


def _roofline_table(report: dict) -> list[str]:
    best = _labels(report["settings"])["search@final"]
    lines = ["## Rooflines", "",
             "GFLOP/s and fraction of the FMA ceiling and of the register-tile ceiling (the default tile's loop with "
             "its operands in L1: what a kernel loses to the memory hierarchy); for memory-bound workloads, the time "
             "the compulsory traffic "
             "(inputs, weights and outputs once) takes at the DRAM triad bandwidth, and at the copy bandwidth of "
             "buffers of the workload's own size, as a fraction of the measured time (repeated calls keep a working "
             "set that fits the caches there: above 100% of the DRAM bound means it did). That copy is timed as one "
             "more system of the workload's rounds (its median); in brackets, against its best of 50 calls timed "
             "apart.", "",
             "The FMA ceiling of each row is the FMA-chain kernel timed as one more system in that workload's "
             "alternating rounds (its median, like every time here), so a kernel and its ceiling share the host's "
             "load; the register-tile ceiling is that times the tile's ratio to the chains.", "",
             f"| workload | flop/byte | FMA ceiling GFLOP/s | default GFLOP/s | {best} GFLOP/s | onnxruntime GFLOP/s "
             f"| {best} % FMA | {best} % tile | {best} % DRAM bound | {best} % footprint bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["workloads"]:
        if "error" in row:
            continue
        rf = row["roofline"]
        b = rf.get("search@final", {})
        ceil = row.get("fma_ceiling_alternating_gflops")
        lines.append(f"| {row['workload']} | {row['flops'] / row['memory_bytes']:.1f} | "
                     f"{f'{ceil:.0f}' if ceil else '-'} | {_gflops(rf, 'default')} | "
                     f"{_gflops(rf, 'search@final')} | {_gflops(rf, 'onnxruntime')} | {_pct(b.get('fma_fraction'))} | "
                     f"{_pct(b.get('tile_fraction'))} | {_pct(b.get('dram_fraction'))} | "
                     f"{_pct(b.get('footprint_fraction'))}{_bestof(b)} |")
    return lines


def _bestof(r: dict) -> str:
    v = r.get("footprint_bestof_fraction")
    return "" if v is None else f" ({_pct(v)})"


def _est(row: dict, name: str) -> str:
    v = row["estimates_s"].get(name)
    return "-" if v is None else f"{v * 1e3:.3f}"


def _fails(tune: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(_failures(tune).items())) or "none"


def _search_table(report: dict) -> list[str]:
    label = _labels(report["settings"])
    lines = ["## The searches", "",
             "The search's own estimates (sum over nodes of its measured kernel times, not re-timed) next to what it "
             "did, and the re-timed default for comparison (where the two are far apart, the machine was busy while "
             "the search measured); the last column is the largest relative error against the float64 reference of anything "
             "timed.", "",
             f"| workload | kernels | re-timed default ms | est. default ms | est. {label['search@final']} ms | est. "
             f"{label['random@final']} ms | measured (evo / random) | failures (evo; random) | stop reason | "
             "max rel. error |", "|---|---:|---:|---:|---:|---:|---|---|---|---:|"]
    for row in report["workloads"]:
        if "error" in row:
            continue
        errs = [v for v in row["rel_errors"].values() if v is not None]
        worst = f"{max(errs):.1e}" if errs else "-"
        lines.append(f"| {row['workload']} | {row['kernels']} | {_ms(row, 'default')} | {_est(row, 'default')} | "
                     f"{_est(row, 'search@final')} | "
                     f"{_est(row, 'random@final')} | {row['evolutionary']['measured']} / {row['random']['measured']} | "
                     f"{_fails(row['evolutionary'])}; {_fails(row['random'])} | {row['evolutionary']['stop_reason']} | "
                     f"{worst} |")
    return lines


def outcomes(report: dict, ours: str = "search@final", other: str = "random@final") -> dict[str, list[str]]:
    """The workloads where ``ours`` wins against ``other``, ties (both keep the same schedules: one program,
    timed once) and loses, by their median times."""
    out: dict[str, list[str]] = {"wins": [], "ties": [], "losses": []}
    for row in report["workloads"]:
        t = row.get("times", {})
        if "error" in row or ours not in t or other not in t:
            continue
        same = row.get("same_as", {})
        if same.get(ours, ours) == same.get(other, other):
            out["ties"].append(row["workload"])
        else:
            out["wins" if t[ours]["median_s"] < t[other]["median_s"] else "losses"].append(row["workload"])
    return out


def _outcome_lines(report: dict) -> list[str]:
    label = _labels(report["settings"])
    lines = ["## Search against random sampling and against the default", "",
             "A tie is a workload where both keep the same schedules (one program, timed once); otherwise the "
             "faster median wins.", ""]
    for other in ("random@final", "default"):
        o = outcomes(report, "search@final", other)
        lines.append(f"- {label['search@final']} against {label[other]}: "
                     + "; ".join(f"{len(v)} {k}" + (f" ({', '.join(v)})" if v else "") for k, v in o.items()))
    return lines


def markdown(report: dict) -> str:
    workloads = ["## Workloads", ""] + [f"- **{r['workload']}**: {r.get('description', r.get('error'))}"
                                        for r in report["workloads"]]
    parts = (_header(report), _times_table(report), _ratio_table(report), _outcome_lines(report),
             _roofline_table(report), _search_table(report), workloads)
    return "\n\n".join("\n".join(p) for p in parts) + "\n"


def _failures(tune: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in tune.get("kernels", []):
        for code, n in k.get("failures", {}).items():
            out[code] = out.get(code, 0) + n
    return out


def write_report(out_dir: Path, report: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "search.md").write_text(markdown(report))


# -- main ------------------------------------------------------------------------------------------------------------


def machine_facts(target: Target, refresh: bool) -> dict:
    from benchmarks.run import cpu_model
    from superopt.measure.peak import fma_peak_gflops, measure_bandwidth, tile_peak_gflops, tile_write_back_sweep

    peak = fma_peak_gflops(target, refresh=refresh)
    tile = tile_peak_gflops(target, refresh=refresh)
    bw = measure_bandwidth(target, refresh=refresh)
    # what a contraction's tiles reach: the tile written back after 64 (attention's) and 1024 (sgemm's) steps
    write_back = [{"steps": n, "alone_fma_fraction": a, "written_back_fma_fraction": w}
                  for n, a, w in tile_write_back_sweep(target, steps=(64, 1024))]
    # the tile's ceiling on the roofline's scale: its alternating ratio to the FMA chains times that ceiling
    tile_ceiling = tile.fma_fraction * peak.ceiling_gflops
    log(f"FMA ceiling {peak.gflops:.1f} GFLOP/s ({peak.gflops_1t:.1f} one thread), roofline ceiling "
        f"{peak.ceiling_gflops:.1f}; register tile {tile.fma_fraction:.2f} of it ({tile_ceiling:.1f}); "
        f"triad bandwidth {bw.triad_gbs:.1f} GB/s")
    return {"cpu": cpu_model(), "threads": target.threads, "target": target.to_dict(), "target_key": target.key(),
            "fma": {**peak.to_dict(), "ceiling_gflops": peak.ceiling_gflops, "from_cache": peak.from_cache},
            "tile": {**tile.to_dict(), "ceiling_gflops": tile_ceiling, "from_cache": tile.from_cache},
            "tile_write_back": write_back, "bandwidth": {**bw.to_dict(), "from_cache": bw.from_cache}, "load_start": _load()}


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="48 trials (best after 16), 5 timing rounds")
    ap.add_argument("--trials", type=int, help="search budget per workload (default 200, --quick 48)")
    ap.add_argument("--early", type=int, help="the 'best after E measurements' column (default 64, --quick 16)")
    ap.add_argument("--rounds", type=int, help="alternating timing rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--guide", choices=("none", "pretrained"), default="none",
                    help="the evolutionary search's ranking: none (random order, the search alone) or pretrained "
                         "(the shipped cost model refined online, as `superopt tune` runs); random sampling is "
                         "never guided")
    ap.add_argument("--refresh-peak", action="store_true", help="measure the machine ceilings again")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument("--ablation", action="store_true",
                    help="cost-model ablation instead (benchmarks/search_ablation.py): guided vs random vs zero-shot")
    ap.add_argument("--render", metavar="JSON", help="rewrite search.md (in --out) from a search.json; measures nothing")
    ap.add_argument("--random", type=int, default=1000, help="ablation: random samples per workload (default 1000)")
    ap.add_argument("--ratio", type=int, default=5, help="ablation: guided search gets random/ratio measurements")
    ap.add_argument("--cost-model", default=None, help="ablation: a model file (default: the shipped one)")
    return ap.parse_args(argv)


def settings_from(args: argparse.Namespace) -> dict:
    base = QUICK if args.quick else FULL
    trials = args.trials or base["trials"]
    early = min(args.early or base["early"], trials)
    cfg = base["timing"]
    if args.rounds:
        cfg = timing.TimingConfig(cfg.warmup_calls, args.rounds, cfg.min_sample_s)
    return {"quick": args.quick, "trials": trials, "early": early, "seed": args.seed, "timing": cfg,
            "rounds": cfg.rounds, "min_sample_s": cfg.min_sample_s, "guide": args.guide}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        (Path(args.out) / "search.md").write_text(markdown(json.loads(Path(args.render).read_text())))
        return 0
    torch.set_num_threads(THREADS)
    if args.ablation:
        from benchmarks import search_ablation

        return search_ablation.run(args)
    from superopt.target import host_target

    settings = settings_from(args)
    target = host_target(THREADS)
    only = args.only.split(",") if args.only else [w.name for w in SEARCH_WORKLOADS]
    unknown = sorted(set(only) - {w.name for w in SEARCH_WORKLOADS})
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {', '.join(w.name for w in SEARCH_WORKLOADS)}")
    specs = [w for w in SEARCH_WORKLOADS if w.name in only]
    machine = machine_facts(target, args.refresh_peak)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "settings": {k: v for k, v in settings.items() if k != "timing"}, "machine": machine, "workloads": []}
    for spec in specs:
        try:
            report["workloads"].append(run_workload(spec, target, settings, machine))
        except Exception as e:  # noqa: BLE001 - one broken workload does not sink the run
            traceback.print_exc()
            report["workloads"].append({"workload": spec.name, "error": f"{type(e).__name__}: {e}"[:300]})
        machine["load_end"] = _load()
        write_report(Path(args.out), report)  # after every workload: an interrupted run keeps what it has
    log(f"wrote {Path(args.out) / 'search.md'} and search.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
