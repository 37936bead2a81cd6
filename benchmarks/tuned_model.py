"""A tuned model against its default schedules and onnxruntime, side by side in one run.

    python benchmarks/tuned_model.py --export resnet50 /tmp/resnet50.onnx   # light model, seeded weights
    superopt tune /tmp/resnet50.onnx --time 15m --db /tmp/resnet50_db.jsonl
    python benchmarks/tuned_model.py /tmp/resnet50.onnx --db /tmp/resnet50_db.jsonl

Both superopt programs are verified against the reference interpreter (``optimize``), and the tuned
one is also compared with onnxruntime's output; all three are timed in alternation (medians).
Writes ``benchmarks/results/tuned_<model>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def export(name: str, path: str) -> None:
    from superopt.testing.light_models import randomized_light_model

    onnx.save(randomized_light_model(name), path)
    print(f"wrote {path}")


def compare(model_path: str, db: str, threads: int, quick: bool) -> dict:
    import onnxruntime as ort

    from superopt.api import OptimizeConfig, optimize
    from superopt.testing.light_models import light_model_inputs

    model = onnx.load(model_path)
    feed = light_model_inputs(model)
    tuned = optimize(model, OptimizeConfig(threads=threads, database=db, cost_model=None))
    default = optimize(model, OptimizeConfig(threads=threads, cost_model=None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so)
    x = list(feed.values())
    ref = sess.run(None, feed)[0]
    got = tuned(*x)[0]
    timings = time_alternating({"superopt_tuned": lambda: tuned(*x), "superopt_default": lambda: default(*x),
                                "onnxruntime": lambda: sess.run(None, feed)}, QUICK if quick else FULL)
    ms = {k: v.median_s * 1e3 for k, v in timings.items()}
    return {
        "model": Path(model_path).stem, "threads": threads, "when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "ms": ms, "tuned_vs_onnxruntime": ms["onnxruntime"] / ms["superopt_tuned"],
        "default_vs_onnxruntime": ms["onnxruntime"] / ms["superopt_default"],
        "tuned_vs_default": ms["superopt_default"] / ms["superopt_tuned"],
        "kernels_from_database": f"{tuned.report.from_database} of {tuned.report.compute_nodes}",
        "max_rel_error_vs_reference": tuned.report.max_error,
        "max_abs_diff_vs_onnxruntime": float(np.abs(got - ref).max()),
    }


def write(res: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    name = res["model"]
    (RESULTS / f"tuned_{name}.json").write_text(json.dumps(res, indent=1))
    ms = res["ms"]
    lines = [f"# {name}: tuned vs default vs onnxruntime ({res['when_utc']}, {res['threads']} threads)", "",
             "| system | median ms | vs onnxruntime |", "|---|---:|---:|"]
    for k in ("superopt_tuned", "superopt_default", "onnxruntime"):
        lines.append(f"| {k} | {ms[k]:.2f} | {ms['onnxruntime'] / ms[k]:.2f}x |")
    lines += ["", f"Kernels from the tuning database: {res['kernels_from_database']}; tuned vs default "
              f"{res['tuned_vs_default']:.2f}x; max relative error vs the reference "
              f"{res['max_rel_error_vs_reference']:.1e}, max |diff| vs onnxruntime {res['max_abs_diff_vs_onnxruntime']:.1e}."]
    (RESULTS / f"tuned_{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--export", nargs=2, metavar=("LIGHT_MODEL", "PATH"))
    ap.add_argument("--db", default="superopt_tuning.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.export:
        export(*args.export)
        return
    if not args.model:
        ap.error("give a model path (or --export NAME PATH)")
    write(compare(args.model, args.db, args.threads, args.quick))


if __name__ == "__main__":
    main()
