"""Rewrite the README's results section from a benchmark run: ``python benchmarks/update_readme.py``.

Reads ``benchmarks/results/results.json`` (written by ``run.py``) and replaces the text between the
``<!-- results:begin -->`` and ``<!-- results:end -->`` markers of README.md with the summary table,
the chart and the goal table of that run, so the README always shows one run, with its date and machine.
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
    goal_rows = [f"| {g['goal'].split(': ', 1)[1]} | {g['workload']} | {g['baseline']} | "
                 f"{'n/a' if g['ratio'] is None else format(g['ratio'], '.2f')}"
                 f"{' (output flagged: ' + g['flagged'] + ')' if g.get('flagged') else ''} | "
                 f"{'met' if g['met'] else '**not met**'} |" for g in goals]
    mode = "full setting: 21 alternating rounds of >= 0.2 s samples" if not report["quick"] else "--quick"
    return "\n".join([
        f"`benchmarks/run.py` ({mode}), run {report['date'][:16].replace('T', ' ')} UTC on "
        f"{m['cpu_model']} with {m['logical_cpus']} logical CPUs, {m['threads']} threads per system; machine "
        f"sgemm probe {m['sgemm']['median_gflops']:.0f} GFLOP/s at the start and "
        f"{m['sgemm_end']['median_gflops']:.0f} at the end, load average {m['loadavg_start'][0]:.1f} -> "
        f"{m['loadavg_end'][0]:.1f}. Full table with errors, GFLOP/s, prepare times and the capsule "
        f"formulations: `benchmarks/results/{results_name}.md`. Speed relative to PyTorch eager (higher is "
        "better), and superopt's speed over each peer (the peer's time / superopt's time); OpenVINO runs float32 "
        "with the LATENCY hint at batch 1 and the THROUGHPUT hint on the `_b16` rows; superopt uses its default "
        "schedules (no search budget) and verifies every program first:",
        "",
        "| workload | eager ms | torch.compile | onnxruntime | OpenVINO | superopt | superopt / onnxruntime "
        "| superopt / OpenVINO |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"![speed relative to PyTorch eager](benchmarks/results/{report.get('chart', 'chart.png')})",
        "",
        "### Performance goals (from issues 3 and 4) next to the measured ratios",
        "",
        f"Ratio = baseline time / superopt time in the same run (>= target is met); "
        f"{sum(g['met'] for g in goals)} of {len(goals)} met.",
        "",
        "| goal | workload | baseline | ratio | verdict |",
        "|---|---|---|---:|---|",
        *goal_rows,
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
