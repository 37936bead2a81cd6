"""Rewrite the README's results section from a benchmark run: ``python benchmarks/update_readme.py``.

Reads ``benchmarks/results/results.json`` (written by ``run.py``) and replaces the text between the
``<!-- results:begin -->`` and ``<!-- results:end -->`` markers of README.md with the summary table,
the goal count and the chart of that run, so the README always shows one run, with its date and machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.goals import evaluate_goals  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def results_section(report: dict, results_name: str = "results") -> str:
    m = report["machine"]
    rows = []
    for w in report["workloads"]:
        s = w["systems"]

        def speed(name: str, s=s) -> str:
            r = s.get(name, {})
            return f"{r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else r.get("status", "-")

        def versus(peer: str, w=w) -> str:
            r = w.get(f"superopt_vs_{peer}")
            return "-" if r is None else f"{r:.2f}x"

        label = w["workload"] + (" (eager = expert formulation)" if w["workload"] == "capsule_votes" else "")
        if w.get("output_flag"):
            label += f" **(output flagged: {w['output_flag']})**"
        rows.append(f"| {label} | {s['eager']['median_ms']:.3f} | {speed('torch.compile')} | "
                    f"{speed('onnxruntime')} | {speed('openvino')} | {speed('superopt')} | "
                    f"{versus('onnxruntime')} | {versus('openvino')} |")
    goals = report.get("goals") or evaluate_goals(report)
    missed = [f"{g['goal']} on {g['workload']} "
              f"({'n/a' if g['ratio'] is None else format(g['ratio'], '.2f')}"
              f"{', output flagged: ' + g['flagged'] if g.get('flagged') else ''})" for g in goals if not g["met"]]
    mode = "full setting: 21 alternating rounds" if not report["quick"] else "--quick"
    return "\n".join([
        f"Measured {report['date'][:10]} on {m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m['threads']} "
        f"threads per system; `benchmarks/run.py`, {mode}). Speed relative to PyTorch eager, higher is better, "
        "and superopt's speed over each peer (the peer's time / superopt's time). OpenVINO runs float32 with the "
        "LATENCY hint at batch 1 and the THROUGHPUT hint on the `_b16` rows; superopt uses its default schedules "
        "and the shipped cost model (no tuning) and verifies every program first.",
        "",
        "| workload | eager ms | torch.compile | onnxruntime | OpenVINO | superopt | superopt / onnxruntime "
        "| superopt / OpenVINO |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"{sum(g['met'] for g in goals)} of {len(goals)} goals met in this run"
        + (f"; not met: {'; '.join(missed)}." if missed else ".")
        + " Goals, errors, GFLOP/s and the capsule formulations: "
        f"[benchmarks/results/{results_name}.md](benchmarks/results/{results_name}.md).",
        "",
        f"![speed relative to PyTorch eager](benchmarks/results/{report.get('chart', 'chart.png')})",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "results.json"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--print", action="store_true", help="print the section instead of writing the README")
    args = ap.parse_args(argv)
    report = json.loads(Path(args.results).read_text())
    if args.print:
        print(results_section(report, Path(args.results).stem))
        return 0
    readme = Path(args.readme)
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{results_section(report, Path(args.results).stem)}\n{END}{tail}")
    print(f"updated {readme} from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
