"""Zero measurements: the cost model's schedule picks against the default heuristic, end to end.

    python benchmarks/zero_shot.py [--models resnet50,squeezenet,inception_v1] [--blocks ffn_block,..]
                                   [--cost-model PATH] [--quick]

For each light model of the onnx wheel (seeded weights), and each block of ``benchmarks/workloads.py``
(``--blocks``, default: the transformer and conv blocks of ``benchmarks/run.py``), three programs side by
side in one run:
superopt with the default heuristic's schedules, superopt with the schedules the cost model picks
without measuring anything (``OptimizeConfig(cost_model=...)``: the model keeps the default unless it
expects another schedule to be faster), and onnxruntime. Both superopt programs are verified against
the reference interpreter; all three are timed in alternation (medians). Writes
``benchmarks/results/zero_shot.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
if sys.path[0] != REPO:  # first: this folder's search.py would hide the search package
    sys.path.insert(0, REPO)

from benchmarks.machine import describe_machine, machine_line  # noqa: E402
from benchmarks.timing import FULL, QUICK, time_alternating  # noqa: E402

RESULTS = Path(__file__).parent / "results"


BLOCKS = "ffn_block,llama_mlp,attention,conv_bn_relu,softmax"


def _load(name: str, block: bool) -> tuple[bytes, dict]:
    """(ONNX model bytes, inputs by name) of a light model (seeded weights) or a benchmark block."""
    if block:
        import onnx

        from benchmarks.workloads import WORKLOADS_BY_NAME

        inst = WORKLOADS_BY_NAME[name].build()
        data = inst.onnx_bytes()
        names = [i.name for i in onnx.load_from_string(data).graph.input]
        return data, {n: t.detach().numpy() for n, t in zip(names, inst.inputs, strict=True)}
    from superopt.frontends.light_models import light_model_inputs, randomized_light_model

    model = randomized_light_model(name)
    return model.SerializeToString(), light_model_inputs(model)


def compare(name: str, cost_model: str, threads: int, quick: bool, block: bool = False) -> dict:
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session

    model, feed = _load(name, block)
    x = list(feed.values())
    default = optimize(model, OptimizeConfig(threads=threads, cost_model=None))
    t0 = time.perf_counter()
    zero = optimize(model, OptimizeConfig(threads=threads, cost_model=cost_model))
    zero_s = time.perf_counter() - t0
    sess = _ort_session(model, threads)
    timings = time_alternating({"default": lambda: default(*x), "zero-shot": lambda: zero(*x),
                                "onnxruntime": lambda: sess.run(None, feed)}, QUICK if quick else FULL)
    ms = {k: v.median_s * 1e3 for k, v in timings.items()}
    return {"model": name, "ms": ms, "zero_shot_vs_default": ms["default"] / ms["zero-shot"],
            "zero_shot_vs_onnxruntime": ms["onnxruntime"] / ms["zero-shot"],
            "kernels_picked_by_model": f"{zero.report.from_model} of {zero.report.compute_nodes}",
            "optimize_s": zero_s, "max_rel_error": zero.report.max_error}


def write(rows: list[dict], meta: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "zero_shot.json").write_text(json.dumps({**meta, "models": rows}, indent=1))
    lines = [f"# Zero measurements: cost-model picks vs default schedules ({meta['when_utc']}, {meta['threads']} "
             f"threads, model {meta['cost_model']})", "", machine_line(meta["machine"]), "",
             "| model | default ms | zero-shot ms | onnxruntime ms | zero-shot vs default | zero-shot vs onnxruntime | "
             "kernels picked by the model | optimize s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {ms['default']:.2f} | {ms['zero-shot']:.2f} | {ms['onnxruntime']:.2f} | "
                     f"{r['zero_shot_vs_default']:.2f}x | {r['zero_shot_vs_onnxruntime']:.2f}x | "
                     f"{r['kernels_picked_by_model']} | {r['optimize_s']:.1f} |")
    lines += ["", "Ratios > 1: zero-shot is faster. All programs verified against the reference interpreter; "
              "timed in alternation (medians)."]
    (RESULTS / "zero_shot.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,squeezenet,inception_v1")
    ap.add_argument("--blocks", default=BLOCKS, help="blocks of benchmarks/workloads.py ('' for none)")
    ap.add_argument("--cost-model", default="pretrained")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    todo = [(n, False) for n in args.models.split(",") if n] + [(n, True) for n in args.blocks.split(",") if n]
    for name, block in todo:
        rows.append(compare(name, args.cost_model, args.threads, args.quick, block))
        print(f"{name}: {rows[-1]['ms']}", flush=True)
    write(rows, {"when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
                 "cost_model": args.cost_model, "machine": describe_machine(args.threads)})


if __name__ == "__main__":
    main()
