"""Run the benchmark suite: superopt beside PyTorch eager, torch.compile, onnxruntime and OpenVINO.

    python benchmarks/run.py [--quick] [--only name,...] [--systems name,...] [--out benchmarks/results]
                             [--name results]

Writes NAME.md, NAME.json and a chart (chart.png for the default name, else NAME.png) into --out. Every
system's output is checked against onnxruntime's and the float64 reference; an output that is all zeros or
constant is flagged in both files, since agreeing with a constant reference proves nothing.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run as a script: benchmarks/search.py would shadow the search package
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.goals import evaluate_goals, goals_markdown  # noqa: E402
from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.systems import SYSTEM_MODULES, load_system  # noqa: E402
from benchmarks.systems.base import THREADS  # noqa: E402
from benchmarks.workloads import WORKLOADS, WORKLOADS_BY_NAME  # noqa: E402
from superopt.measure.peers import output_flag  # noqa: E402

PEERS = ("onnxruntime", "openvino")  # the ratio columns: peer time / superopt time


def machine_sgemm_gflops(n: int = 2048, reps: int = 7) -> dict:
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    for _ in range(2):
        torch.matmul(a, b, out=c)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        ts.append(time.perf_counter() - t0)
    fl = 2.0 * n ** 3
    return {"n": n, "median_gflops": fl / statistics.median(ts) / 1e9, "best_gflops": fl / min(ts) / 1e9}


def to_numpy(y) -> np.ndarray:
    if isinstance(y, (tuple, list)):
        y = y[0]
    if isinstance(y, torch.Tensor):
        return y.detach().float().numpy()
    return np.asarray(y)


def max_err(a: np.ndarray, b: np.ndarray | None) -> float | None:
    if b is None:
        return None
    if a.shape != b.shape:
        return float("nan")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def versions(systems) -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for s in systems:
        try:
            v.update(s.versions())
        except Exception:  # noqa: BLE001
            pass
    return v


def run_workload(w, systems, quick: bool, cfg: timing.TimingConfig, log) -> dict:
    t_build = time.perf_counter()
    inst = w.build()
    log(f"  built in {time.perf_counter() - t_build:.1f}s")
    res = {"workload": w.name, "description": w.description, "flops": inst.flops, "systems": {},
           "meta": {k: v for k, v in inst.meta.items() if isinstance(v, (str, int, float, list))}}
    fns, eager_out, outs = {}, None, {}
    res["output_flag"] = output_flag(inst.reference) if inst.reference is not None else None
    entries = [(s.name, s) for s in systems]
    # capsule: the other torch formulations are timed as extra eager systems
    from benchmarks.systems.torch_eager import eager_fn

    for vname, vmod in inst.variants.items():
        entries.append((f"eager[{vname}]", vmod))
    for name, s in entries:
        rec: dict = {"status": "ok"}
        res["systems"][name] = rec
        try:
            if isinstance(s, torch.nn.Module):
                fn = eager_fn(s, inst.inputs)
                t0 = time.perf_counter()
                fn()
                prep = time.perf_counter() - t0
            else:
                if not s.supports(inst):
                    rec.update(status="unsupported")
                    continue
                if quick and s.skip_in_quick(inst):
                    rec.update(status="skipped (--quick)")
                    log(f"  {name}: skipped in --quick")
                    continue
                s.last_note = ""
                fn, prep = s.prepare(inst, quick)
                if getattr(s, "last_note", ""):
                    rec["status"] = f"ok ({s.last_note})"
            out = to_numpy(fn())
            if name == "eager":
                eager_out = out
            rec["prepare_s"] = prep
            rec["err_vs_eager"] = max_err(out, eager_out) if eager_out is not None else None
            rec["err_vs_ref"] = max_err(out, inst.reference)
            rec["output_flag"] = output_flag(out)
            outs[name] = out
            fns[name] = fn
            log(f"  {name}: prepared in {prep:.2f}s, err vs eager {rec['err_vs_eager']}, "
                f"vs f64 {rec['err_vs_ref']}")
        except Exception as e:  # noqa: BLE001 - report and go on
            rec.update(status=f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            log(f"  {name}: FAILED {rec['status']}")
            traceback.print_exc(limit=3)
    ort_out = outs.get("onnxruntime")
    for name, out in outs.items():
        res["systems"][name]["err_vs_onnxruntime"] = max_err(out, ort_out) if ort_out is not None else None
        if res["output_flag"] is None and res["systems"][name]["output_flag"] is not None:
            res["output_flag"] = f"{name}: {res['systems'][name]['output_flag']}"
    if res["output_flag"]:
        log(f"  FLAGGED: output {res['output_flag']}")
    if fns:
        tr = timing.time_alternating(fns, cfg)
        base = tr["eager"].median_s if "eager" in tr else None
        for name, r in tr.items():
            rec = res["systems"][name]
            rec.update(median_ms=r.median_s * 1e3, min_ms=r.min_s * 1e3, calls_per_sample=r.calls_per_sample,
                       rounds=len(r.samples_s))
            rec["speedup_vs_eager"] = base / r.median_s if base else None
            if inst.flops:
                rec["gflops"] = inst.flops / r.median_s / 1e9
            log(f"  {name:28s} {r.median_s * 1e3:9.3f} ms  x{rec['speedup_vs_eager'] or 0:.2f}")
        ours = res["systems"].get("superopt", {}).get("median_ms")
        for peer in PEERS:
            theirs = res["systems"].get(peer, {}).get("median_ms")
            if ours and theirs:
                res[f"superopt_vs_{peer}"] = theirs / ours
    del inst, fns
    gc.collect()
    return res


def ratio_cell(w: dict, peer: str) -> str:
    r = w.get(f"superopt_vs_{peer}")
    return "-" if r is None else f"{r:.2f}x"


def geomean(values: list[float]) -> float | None:
    return float(np.exp(np.mean(np.log(values)))) if values else None


def geomeans(report: dict) -> dict[str, float | None]:
    """superopt's geomean speedup over each peer, over the batch-1 rows and over the batched rows."""
    out = {}
    for peer in PEERS:
        for label, batched in (("batch 1", False), ("batched", True)):
            vals = [w[f"superopt_vs_{peer}"] for w in report["workloads"]
                    if w.get(f"superopt_vs_{peer}") and (w.get("meta", {}).get("batch", 1) > 1) == batched]
            out[f"{peer}, {label}"] = geomean(vals)
    return out


def fmt(v, spec: str, none: str = "-") -> str:
    if v is None:
        return none
    if isinstance(v, float) and np.isnan(v):
        return "nan"
    return format(v, spec)


def write_markdown(path: str, report: dict) -> None:
    m = report["machine"]
    lines = [
        "# superopt benchmark results",
        "",
        f"- date: {report['date']}",
        f"- mode: {'quick' if report['quick'] else 'full'}; timing: {report['timing']}",
        f"- CPU: {m['cpu_model']} ({m['logical_cpus']} logical CPUs), threads per system: {m['threads']}",
        f"- machine sgemm (torch.matmul {m['sgemm']['n']}^3, {m['threads']} threads): "
        f"{m['sgemm']['median_gflops']:.1f} GFLOP/s median (best {m['sgemm']['best_gflops']:.1f}); "
        f"at end of run: {m['sgemm_end']['median_gflops']:.1f} (a large drop means a contended machine)",
        f"- load average (1/5/15 min) at start {m['loadavg_start']}, at end {m['loadavg_end']}; "
        f"OMP_WAIT_POLICY {m.get('omp_wait_policy', 'unset')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "- systems skipped: "
        + (", ".join(f"{k} ({v})" for k, v in report["skipped_systems"].items()) or "none"),
        *([f"- rows merged from {len(report['merged_from'])} runs (the systems of each row timed together in one "
           "process): " + "; ".join(f"{r['rows']} at {r['date']} (load {r['loadavg_start'][0]:.1f} -> "
                                      f"{r['loadavg_end'][0]:.1f})" for r in report["merged_from"])]
          if report.get("merged_from") else []),
        "",
        "Times are medians over alternating rounds (per call, ms); each system is timed in its own block of "
        "calls after warm-up calls. Speed = eager time / system time (higher is better). "
        "superopt / peer = the peer's time / superopt's time. Errors are max |diff| vs PyTorch eager float32, "
        "vs onnxruntime and vs a float64 reference. Prepare = torch.compile compile time (incl. first call) / "
        "onnxruntime session creation / OpenVINO read + compile. **FLAGGED** marks a row whose output is all "
        "zeros or (nearly) constant: agreement with the reference means little there.",
        "",
    ]
    sys_names = report["main_systems"]
    peers = [p for p in PEERS if p in sys_names and "superopt" in sys_names]
    lines += ["## Summary: speed relative to PyTorch eager", "",
              "| workload | eager ms | " + " | ".join(sys_names[1:]) + "".join(f" | superopt / {p}" for p in peers)
              + " |", "|---|---:|" + "---:|" * (len(sys_names) - 1 + len(peers))]
    for w in report["workloads"]:
        e = w["systems"].get("eager", {})
        cells = []
        for s in sys_names[1:]:
            r = w["systems"].get(s, {})
            sp = r.get("speedup_vs_eager")
            cells.append(f"{sp:.2f}x" if sp else r.get("status", "-"))
        cells += [ratio_cell(w, p) for p in peers]
        label = w["workload"] + (f" **FLAGGED: {w['output_flag']}**" if w.get("output_flag") else "")
        lines.append(f"| {label} | {fmt(e.get('median_ms'), '.3f')} | " + " | ".join(cells) + " |")
    gm = report.get("geomeans") or geomeans(report)
    lines += ["", "Geomean of superopt / peer: " + ", ".join(
        f"{k} {fmt(v, '.2f')}x" for k, v in gm.items() if v is not None) + "."]
    lines += [""] + goals_markdown(report.get("goals") or evaluate_goals(report))
    lines += ["", "## Details", "",
              "| workload | system | time ms (median) | min ms | speed vs eager | GFLOP/s | err vs eager "
              "| err vs onnxruntime | err vs f64 ref | prepare s | output | status |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for w in report["workloads"]:
        for s, r in w["systems"].items():
            lines.append(
                f"| {w['workload']} | {s} | {fmt(r.get('median_ms'), '.3f')} | "
                f"{fmt(r.get('min_ms'), '.3f')} | "
                f"{fmt(r.get('speedup_vs_eager'), '.2f')} | {fmt(r.get('gflops'), '.1f')} | "
                f"{fmt(r.get('err_vs_eager'), '.1e')} | {fmt(r.get('err_vs_onnxruntime'), '.1e')} | "
                f"{fmt(r.get('err_vs_ref'), '.1e')} | {fmt(r.get('prepare_s'), '.2f')} | "
                f"{'**' + r['output_flag'] + '**' if r.get('output_flag') else 'ok'} | {r.get('status', '')} |")
    cap = next((w for w in report["workloads"] if w["workload"] == "capsule_votes"), None)
    if cap:
        sg = m["sgemm"]["median_gflops"]
        lines += ["", "## capsule_votes formulations (PyTorch eager)", "",
                  f"`{cap['meta'].get('einsum', '')}`; P{cap['meta'].get('P')}, W{cap['meta'].get('W')}, "
                  f"{cap['flops'] / 1e6:.1f} MFLOP. 'eager' = expert formulation "
                  f"`{cap['meta'].get('expert_formulation')}` (p folded into the batch, channels-last "
                  "conv2d via oneDNN). W is a layer parameter, pre-packed once (not timed).", "",
                  "| formulation | time ms | GFLOP/s | % of machine sgemm | err vs f64 ref |",
                  "|---|---:|---:|---:|---:|"]
        for s, r in sorted(cap["systems"].items(), key=lambda kv: kv[1].get("median_ms") or 1e9):
            if r.get("gflops"):
                lines.append(f"| {s} | {r['median_ms']:.3f} | {r['gflops']:.1f} | "
                             f"{100 * r['gflops'] / sg:.0f}% | {fmt(r.get('err_vs_ref'), '.1e')} |")
    lines += ["", f"![speed relative to eager]({report.get('chart', 'chart.png')})", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_chart(path: str, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = report["main_systems"]
    wls = [w["workload"] for w in report["workloads"]]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(wls) + 2), 4.5))
    width = 0.8 / len(names)
    for i, s in enumerate(names):
        vals = [w["systems"].get(s, {}).get("speedup_vs_eager") or 0.0 for w in report["workloads"]]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(wls))]
        ax.bar(xs, [v if v > 0 else np.nan for v in vals], width, label=s)
    ax.set_yscale("log")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(wls)))
    ax.set_xticklabels(wls, rotation=30, ha="right")
    ax.set_ylabel("speed relative to PyTorch eager (x)")
    ax.set_title(f"{report['machine']['cpu_model']}, {report['machine']['threads']} threads "
                 f"({'quick' if report['quick'] else 'full'})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(report: dict, out: str, name: str) -> None:
    report["geomeans"] = geomeans(report)
    report["goals"] = evaluate_goals(report)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    write_markdown(os.path.join(out, f"{name}.md"), report)
    write_chart(os.path.join(out, report["chart"]), report)


def merge_reports(paths: list[str], out: str, name: str) -> int:
    """One report of the rows of several runs (a long suite run in parts on a loaded machine)."""
    reports = []
    for p in paths:
        with open(p) as f:
            reports.append(json.load(f))
    merged = dict(reports[0])
    merged["workloads"] = [w for r in reports for w in r["workloads"]]
    merged["main_systems"] = list(dict.fromkeys(s for r in reports for s in r["main_systems"]))
    merged["merged_from"] = [{"rows": ", ".join(w["workload"] for w in r["workloads"]), "date": r["date"],
                              "loadavg_start": r["machine"]["loadavg_start"], "loadavg_end": r["machine"]["loadavg_end"],
                              "sgemm_median_gflops": r["machine"]["sgemm"]["median_gflops"]} for r in reports]
    merged["machine"] = dict(reports[0]["machine"], sgemm_end=reports[-1]["machine"]["sgemm_end"],
                             loadavg_end=reports[-1]["machine"]["loadavg_end"])
    merged["chart"] = "chart.png" if name == "results" else f"{name}.png"
    write_report(merged, out, name)
    print(f"merged {len(reports)} runs into {out}/{name}.md, {name}.json")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats; skip big-model torch.compile")
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    ap.add_argument("--systems", default="", help="comma-separated systems (default: all registered)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument("--name", default="results", help="file stem: NAME.md, NAME.json (default: results)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="write the rows of earlier runs' JSON files as one report (no timing)")
    args = ap.parse_args(argv)
    if args.merge:
        return merge_reports(args.merge, args.out, args.name)

    torch.set_num_threads(THREADS)
    t_start = time.perf_counter()
    log = lambda s: print(s, flush=True)  # noqa: E731
    wanted = [n for n in args.only.split(",") if n] or [w.name for w in WORKLOADS]
    unknown = [n for n in wanted if n not in WORKLOADS_BY_NAME]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {list(WORKLOADS_BY_NAME)}")
    sys_wanted = [n for n in args.systems.split(",") if n] or list(SYSTEM_MODULES)
    if "eager" not in sys_wanted:
        sys_wanted.insert(0, "eager")
    systems, skipped = [], {}
    for n in sys_wanted:
        s, note = load_system(n)
        if s is None:
            print(f"NOTE: skipping system '{n}': {note}")
            skipped[n] = note
        else:
            systems.append(s)
    cfg = timing.QUICK if args.quick else timing.FULL
    log(f"measuring machine sgemm (2048^3, {THREADS} threads)...")
    sg = machine_sgemm_gflops()
    log(f"  {sg['median_gflops']:.1f} GFLOP/s")
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
        "timing": vars(cfg),
        "machine": {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count(), "threads": THREADS,
                    "platform": platform.platform(), "sgemm": sg, "loadavg_start": os.getloadavg(),
                    # OpenMP workers (superopt's kernels, torch) spin after each parallel region unless this is
                    # PASSIVE; on an oversubscribed machine that decides superopt's times (see results)
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")},
        "versions": versions(systems),
        "skipped_systems": skipped,
        "main_systems": [s.name for s in systems],
        "workloads": [],
        "chart": "chart.png" if args.name == "results" else f"{args.name}.png",
    }
    for name in wanted:
        log(f"== {name}")
        report["workloads"].append(run_workload(WORKLOADS_BY_NAME[name], systems, args.quick, cfg, log))
    report["machine"]["sgemm_end"] = machine_sgemm_gflops()
    report["machine"]["loadavg_end"] = os.getloadavg()
    report["total_seconds"] = time.perf_counter() - t_start
    write_report(report, args.out, args.name)
    log(f"done in {report['total_seconds']:.0f}s; wrote {args.out}/{args.name}.md, {args.name}.json, "
        f"{report['chart']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
