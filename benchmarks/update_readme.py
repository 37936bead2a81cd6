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


def results_section(report: dict) -> str:
    m = report["machine"]
    rows = []
    for w in report["workloads"]:
        s = w["systems"]

        def speed(name: str, s=s) -> str:
            r = s.get(name, {})
            return f"{r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else r.get("status", "-")

        label = w["workload"] + (" (eager = expert formulation)" if w["workload"] == "capsule_votes" else "")
        rows.append(f"| {label} | {s['eager']['median_ms']:.3f} | {speed('torch.compile')} | "
                    f"{speed('onnxruntime')} | {speed('superopt')} |")
    goals = report.get("goals") or evaluate_goals(report)
    missed = [f"{g['goal']} on {g['workload']} "
              f"({'n/a' if g['ratio'] is None else format(g['ratio'], '.2f')})" for g in goals if not g["met"]]
    mode = "full setting: 21 alternating rounds" if not report["quick"] else "--quick"
    return "\n".join([
        f"Measured {report['date'][:10]} on {m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m['threads']} "
        f"threads per system; `benchmarks/run.py`, {mode}). Speed relative to PyTorch eager, higher is better; "
        "superopt uses its default schedules and the shipped cost model (no tuning) and verifies every program first.",
        "",
        "| workload | eager ms | torch.compile | onnxruntime | superopt |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"{sum(g['met'] for g in goals)} of {len(goals)} goals met in this run"
        + (f"; not met: {'; '.join(missed)}." if missed else ".")
        + " Goals, errors, GFLOP/s and the capsule formulations: "
        "[benchmarks/results/results.md](benchmarks/results/results.md).",
        "",
        "![speed relative to PyTorch eager](benchmarks/results/chart.png)",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "results.json"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    args = ap.parse_args(argv)
    report = json.loads(Path(args.results).read_text())
    readme = Path(args.readme)
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{results_section(report)}\n{END}{tail}")
    print(f"updated {readme} from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
