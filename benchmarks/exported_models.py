"""Real models exported from PyTorch: superopt (fallback nodes included) vs onnxruntime, side by side.

    python benchmarks/exported_models.py [--models unet,gpt_block,detection_head,lstm_tagger] [--threads 2]
                                         [--cost-model pretrained|PATH|none] [--db PATH] [--quick]

Each model of :mod:`superopt.testing.exported_models` (built from code, exported with
``torch.onnx.export(dynamo=True)``) is optimized (verified against the reference interpreter; nodes
with no native lowering run through the ONNX fallback, listed per model), checked against onnxruntime
(max relative error), and then both are timed in alternation (medians) with the same thread count.
Writes ``benchmarks/results/exported_models.md`` and ``.json``. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
if sys.path[0] != REPO:  # first: this script's folder holds a search.py that would hide the search package
    sys.path.insert(0, REPO)

from benchmarks.machine import describe_machine, machine_line  # noqa: E402
from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def compare(name: str, threads: int, cost_model: str | None, db: str | None, quick: bool) -> dict:
    from superopt.api import OptimizeConfig, optimize
    from superopt.frontends.onnx_fallback import summarize
    from superopt.testing.exported_models import export_model, max_rel_error, ort_session

    model, feed = export_model(name)
    t0 = time.perf_counter()
    prog = optimize(model, feed, OptimizeConfig(threads=threads, cost_model=cost_model, database=db))
    optimize_s = time.perf_counter() - t0
    sess = ort_session(model, threads)
    err = max(max_rel_error(g, w) for g, w in zip(prog(**feed), sess.run(None, feed)))
    timings = time_alternating({"superopt": lambda: prog(**feed), "onnxruntime": lambda: sess.run(None, feed)},
                               QUICK if quick else FULL)
    ms = {k: v.median_s * 1e3 for k, v in timings.items()}
    return {"model": name, "ms": ms, "vs_onnxruntime": ms["onnxruntime"] / ms["superopt"],
            "max_rel_error_vs_onnxruntime": err, "optimize_s": optimize_s,
            "fallbacks": summarize(prog.report.fallbacks) or "none", "kernels": prog.report.kernels}


def write(rows: list[dict], meta: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "exported_models.json").write_text(json.dumps({**meta, "models": rows}, indent=1))
    lines = [f"# Exported PyTorch models vs onnxruntime ({meta['when_utc']}, {meta['threads']} threads, cost model "
             f"{meta['cost_model']}, database {meta['database']})", "", machine_line(meta["machine"]), "",
             "| model | superopt ms | onnxruntime ms | speed vs onnxruntime | max rel. error | kernels | fallback nodes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {ms['superopt']:.3f} | {ms['onnxruntime']:.3f} | {r['vs_onnxruntime']:.2f}x | "
                     f"{r['max_rel_error_vs_onnxruntime']:.1e} | {r['kernels']} | {r['fallbacks']} |")
    lines += ["", "Speed > 1: superopt is faster. Timed in alternation (medians), fallback nodes included in superopt's "
              "time; every program verified against the reference interpreter and compared with onnxruntime."]
    (RESULTS / "exported_models.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    from superopt.testing.exported_models import MODELS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cost-model", default="pretrained", help="pretrained, a model file, or none")
    ap.add_argument("--db", default=None, help="a tuning database to take schedules from")
    ap.add_argument("--quick", action="store_true", help="fewer timing rounds (a smoke run, not a measurement)")
    args = ap.parse_args()
    cost_model = None if args.cost_model == "none" else args.cost_model
    rows = []
    for name in args.models.split(","):
        rows.append(compare(name, args.threads, cost_model, args.db, args.quick))
        print(f"{name}: {rows[-1]['ms']} ({rows[-1]['fallbacks']})", flush=True)
    write(rows, {"when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
                 "cost_model": args.cost_model, "database": args.db, "machine": describe_machine(args.threads)})


if __name__ == "__main__":
    main()
