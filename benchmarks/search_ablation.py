"""Ablation of the learned cost model: model-guided search against random sampling, and zero measurements.

    python benchmarks/search.py --ablation [--random N] [--ratio 5] [--only sgemm,...] [--rounds R]
        [--cost-model PATH] [--out benchmarks/results]

For every workload of the schedule-search benchmark (``search_workloads.py``):
  * **random@N**: N uniform samples of the schedule space, measured (``tune_graph`` strategy random);
  * **guided@N/ratio**: the evolutionary search guided by the cost model (the shipped pretrained model
    unless ``--cost-model``, reloaded per workload and refined online on that workload only), N/ratio
    measurements;
  * **zero-shot**: every kernel's schedule picked by the model alone (``schedules_from_model``), no
    measurement;
  * **default**: the heuristic.
Best-so-far curves (the searches' own measurements: the graph's estimate is the sum over kernels of
each kernel's best so far) go to ``ablation.png``. The final schedules of all four are then built,
checked against the float64 reference and re-timed **in alternation**, and the verdicts use those
times: guided@N/ratio within 5% of random@N, and zero-shot within 1.25x of guided.

Writes ``ablation.md``, ``ablation.json`` and ``ablation.png`` into ``--out``.
"""

from __future__ import annotations

import datetime
import json
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks import timing
from benchmarks.search import (
    REPO,
    kernel_estimate,
    log,
    machine_facts,
    prepare_graph,
    schedules_from_kernels,
    time_workload,
)
from benchmarks.search_workloads import SEARCH_WORKLOADS, WorkloadSpec

VARIANTS = ("default", "zero-shot", "guided", "random")
WITHIN = 1.05  # guided must reach random's best within this factor
ZERO_SHOT_WITHIN = 1.25


def best_so_far_curve(db, graph, target, default) -> list[tuple[int, float]]:
    """(measurements, the graph's estimated time with the best kernels so far) after every measurement
    once every kernel has an OK one (the search's own timings, in measurement order)."""
    from search.schedule.database import node_workload_key

    nodes = list(default)
    keys = {n: node_workload_key(graph, n) for n in nodes}
    best: dict[str, float] = {}
    curve = []
    for i, r in enumerate(db.records(target=target), start=1):
        if r.ok and r.median_s is not None and r.median_s < best.get(r.workload_key, np.inf):
            best[r.workload_key] = r.median_s
        if all(keys[n] in best for n in nodes):
            curve.append((i, sum(best[keys[n]] for n in nodes)))
    return curve


def trials_to_reach(curve: list[tuple[int, float]], goal: float) -> int | None:
    return next((n for n, t in curve if t <= goal), None)


def run_workload(spec: WorkloadSpec, target, settings: dict) -> dict:
    from costmodel.xgb import XGBModel, load_pretrained
    from search.schedule.database import TuningDatabase
    from search.schedule.model_guided import schedules_from_model
    from search.schedule.tune import TuneConfig, tune_graph
    from superopt.schedule.graph_defaults import default_schedules

    t0 = time.perf_counter()
    w = spec.build()
    graph, _ = prepare_graph(w)
    default = default_schedules(graph, target)
    n_random = settings["random"]
    n_guided = max(1, n_random // settings["ratio"])

    def model():
        return XGBModel.load(settings["cost_model"]) if settings["cost_model"] else load_pretrained("cpu")

    log(f"[{w.name}] {w.description}: random@{n_random} vs guided@{n_guided}")
    with tempfile.TemporaryDirectory(prefix="superopt-ablation-") as tmp:
        runs, curves = {}, {}
        for name, strategy, trials, m in (("random", "random", n_random, None),
                                          ("guided", "evolutionary", n_guided, model())):
            db = TuningDatabase(Path(tmp) / f"{name}.jsonl")
            t1 = time.perf_counter()
            cfg = TuneConfig(trials=trials, seed=settings["seed"], strategy=strategy, progress=True, confirm_rounds=0)
            runs[name] = tune_graph(graph, target, cfg, db, model=m)
            curves[name] = best_so_far_curve(db, graph, target, default)
            log(f"  {name}: {runs[name].measured} measurements in {time.perf_counter() - t1:.0f}s")
        t1 = time.perf_counter()
        zero, picks = schedules_from_model(graph, target, model(), seed=settings["seed"])
        zero_s = time.perf_counter() - t1
    variants = {"default": default, "zero-shot": default | zero,
                "guided": schedules_from_kernels(graph, runs["guided"].kernels, default),
                "random": schedules_from_kernels(graph, runs["random"].kernels, default)}
    times, errors, status, same_as, _, _ = time_workload(w, graph, variants, target, settings["timing"])
    med = {k: v["median_s"] for k, v in times.items()}
    random_best = curves["random"][-1][1] if curves["random"] else None
    reach = trials_to_reach(curves["guided"], WITHIN * random_best) if random_best else None
    row = {
        "workload": w.name, "description": w.description, "random_trials": n_random, "guided_trials": n_guided,
        "times": times, "rel_errors": errors, "status": status, "same_as": same_as,
        "curves": curves, "estimates_s": {"random": kernel_estimate(runs["random"].kernels, "best_s"),
                                          "guided": kernel_estimate(runs["guided"].kernels, "best_s")},
        "guided_trials_to_reach_random": reach,
        "zero_shot": {"kernels_changed": sum(not p.is_default for p in picks.values()), "kernels": len(picks),
                      "pick_s": zero_s},
        "verdict": {
            "guided_within_5pct_of_random": bool(med.get("guided") and med.get("random")
                                                 and med["guided"] <= WITHIN * med["random"]),
            "zero_shot_within_1.25x_of_guided": bool(med.get("zero-shot") and med.get("guided")
                                                     and med["zero-shot"] <= ZERO_SHOT_WITHIN * med["guided"]),
        },
        "elapsed_s": time.perf_counter() - t0,
    }
    for name in VARIANTS:
        if name in times:
            log(f"  {name:10s} {times[name]['median_s'] * 1e3:9.3f} ms  rel err {errors.get(name)}")
    return row


def _ms(row: dict, name: str) -> str:
    t = row.get("times", {}).get(name)
    return f"{t['median_s'] * 1e3:.3f}" if t else "-"


def _ratio(row: dict, a: str, b: str) -> str:
    ta, tb = row.get("times", {}).get(a), row.get("times", {}).get(b)
    return f"{ta['median_s'] / tb['median_s']:.2f}" if ta and tb else "-"


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# Cost-model ablation ({report['date']})", "",
             f"Machine: {report['machine']['cpu']}, {report['machine']['threads']} threads. Cost model: "
             f"{report['cost_model']}. random@{s['random']} vs guided@{s['random'] // s['ratio']} measurements; "
             "times re-measured in alternation (medians of "
             f"{s['rounds']} rounds); ratios < 1 mean the first is faster.", "",
             "| workload | default ms | zero-shot ms | guided ms | random ms | guided/random | zero-shot/guided | "
             "zero-shot/default | guided trials to reach random's best (x1.05) | kernels changed by zero-shot |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["workloads"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | error: {r['error']} |")
            continue
        z = r["zero_shot"]
        lines.append(f"| {r['workload']} | {_ms(r, 'default')} | {_ms(r, 'zero-shot')} | {_ms(r, 'guided')} | "
                     f"{_ms(r, 'random')} | {_ratio(r, 'guided', 'random')} | {_ratio(r, 'zero-shot', 'guided')} | "
                     f"{_ratio(r, 'zero-shot', 'default')} | {r['guided_trials_to_reach_random'] or 'not reached'} "
                     f"of {r['guided_trials']} | {z['kernels_changed']} of {z['kernels']} |")
    ok = [r for r in report["workloads"] if "verdict" in r]
    lines += ["", f"Guided@{s['random'] // s['ratio']} within 5% of random@{s['random']} (re-timed): "
              f"{sum(r['verdict']['guided_within_5pct_of_random'] for r in ok)} of {len(ok)} workloads. "
              f"Zero-shot within 1.25x of guided: {sum(r['verdict']['zero_shot_within_1.25x_of_guided'] for r in ok)} "
              f"of {len(ok)}.", "", "Best-so-far curves: `ablation.png`."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in report["workloads"] if "curves" in r]
    if not rows:
        return
    cols = min(4, len(rows))
    fig = Figure(figsize=(4 * cols, 3.2 * ((len(rows) + cols - 1) // cols)))
    FigureCanvasAgg(fig)
    for i, r in enumerate(rows):
        ax = fig.add_subplot((len(rows) + cols - 1) // cols, cols, i + 1)
        for name, style in (("random", "tab:gray"), ("guided", "tab:blue")):
            c = r["curves"].get(name) or []
            if c:
                ax.step([n for n, _ in c], [t * 1e3 for _, t in c], where="post", color=style, label=name)
        d = r["times"].get("default")
        if d:
            ax.axhline(d["median_s"] * 1e3, color="tab:red", linestyle=":", label="default (re-timed)")
        ax.set_xscale("log")
        ax.set_title(r["workload"], fontsize=9)
        ax.set_xlabel("measurements")
        ax.set_ylabel("best so far (ms)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def run(args) -> int:
    from benchmarks.systems.base import THREADS
    from superopt.target import host_target

    target = host_target(THREADS)
    only = args.only.split(",") if args.only else [w.name for w in SEARCH_WORKLOADS]
    specs = [w for w in SEARCH_WORKLOADS if w.name in only]
    rounds = args.rounds or 9
    settings = {"random": args.random, "ratio": args.ratio, "seed": args.seed, "cost_model": args.cost_model,
                "timing": timing.TimingConfig(warmup_calls=3, rounds=rounds, min_sample_s=0.1), "rounds": rounds}
    from costmodel.xgb import pretrained_path

    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "settings": {k: v for k, v in settings.items() if k != "timing"},
              "cost_model": args.cost_model or str(pretrained_path("cpu").relative_to(REPO)),
              "machine": machine_facts(target, False), "workloads": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        try:
            report["workloads"].append(run_workload(spec, target, settings))
        except Exception as e:  # noqa: BLE001 - one broken workload does not sink the run
            traceback.print_exc()
            report["workloads"].append({"workload": spec.name, "error": f"{type(e).__name__}: {e}"[:300]})
        (out / "ablation.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "ablation.md").write_text(markdown(report))
        plot(report, out / "ablation.png")
    log(f"wrote {out / 'ablation.md'}, ablation.json and ablation.png")
    return 0
