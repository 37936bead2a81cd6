"""A tuned model against its default schedules and onnxruntime, side by side in one run.

    python benchmarks/tuned_model.py --export resnet50 /tmp/resnet50.onnx   # light model, seeded weights
    superopt tune /tmp/resnet50.onnx --time 15m --db /tmp/resnet50_db.jsonl
    python benchmarks/tuned_model.py /tmp/resnet50.onnx --db /tmp/resnet50_db.jsonl

Both superopt programs are verified against the reference interpreter (``optimize``), and the tuned
one is also compared with onnxruntime's output; all three are timed in alternation (medians). In that one
process onnxruntime's workers spin within a run and stop when it returns (``session.force_spinning_stop``):
left spinning they take a core from whoever runs next, and with spinning off altogether onnxruntime ran
resnet50 6% and squeezenet 34% slower than alone on its defaults (superopt then read 1.03x and 1.34x where
separate processes read 0.97x and 1.02x).

With ``--per-process ROUNDS`` each system also runs alone in a process of its own, onnxruntime with its
defaults, the processes taken in turn (rotating order) for ROUNDS rounds, each timing ``--runs`` calls after a
warm-up (its median); the report adds the median over the rounds: the check on the in-process number.
Writes ``benchmarks/results/tuned_<model>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
if sys.path[0] != REPO:  # first: this folder's search.py would hide the search package
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from benchmarks.machine import describe_machine, machine_line  # noqa: E402
from benchmarks.timing import FULL, QUICK, TimingConfig, time_alternating  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def export(name: str, path: str) -> None:
    from superopt.frontends.light_models import randomized_light_model

    onnx.save(randomized_light_model(name), path)
    print(f"wrote {path}")


def compare(model_path: str, db: str, threads: int, quick: bool) -> dict:
    from superopt.api import OptimizeConfig, optimize
    from superopt.cli_artifact import _ort_session
    from superopt.frontends.light_models import light_model_inputs

    model = onnx.load(model_path)
    feed = light_model_inputs(model)
    tuned = optimize(model, OptimizeConfig(threads=threads, database=db, cost_model=None))
    default = optimize(model, OptimizeConfig(threads=threads, cost_model=None))
    sess = _ort_session(model.SerializeToString(), threads)  # spinning within a run only (module docstring)
    x = list(feed.values())
    ref = sess.run(None, feed)[0]
    got = tuned(*x)[0]
    timings = time_alternating({"superopt_tuned": lambda: tuned(*x), "superopt_default": lambda: default(*x),
                                "onnxruntime": lambda: sess.run(None, feed)}, QUICK if quick else FULL)
    ms = {k: v.median_s * 1e3 for k, v in timings.items()}
    return {
        "model": Path(model_path).stem, "threads": threads, "when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": describe_machine(threads),
        "ms": ms, "tuned_vs_onnxruntime": ms["onnxruntime"] / ms["superopt_tuned"],
        "default_vs_onnxruntime": ms["onnxruntime"] / ms["superopt_default"],
        "tuned_vs_default": ms["superopt_default"] / ms["superopt_tuned"],
        "kernels_from_database": f"{tuned.report.from_database} of {tuned.report.compute_nodes}",
        "max_rel_error_vs_reference": tuned.report.max_error,
        "max_abs_diff_vs_onnxruntime": float(np.abs(got - ref).max()),
    }


def _child(kind: str, path: str, inputs: str, runs: int, threads: int, out: str) -> None:
    """One system alone in this process: ``runs`` timed calls after a warm-up; prints the median seconds as
    JSON and saves the first output to ``out`` (the parent checks it)."""
    data = np.load(inputs)
    feed = {k: data[k] for k in data.files}
    if kind == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so)  # its defaults (spinning workers): nothing else runs here

        def call():
            return sess.run(None, feed)[0]
    else:
        import superopt

        prog = superopt.load(path, threads=threads)
        x = [feed[k] for k in data.files]

        def call():
            return prog(*x)[0]
    # one call per sample, no settle calls: nothing else runs in this process
    one = TimingConfig(warmup_calls=3, rounds=runs, min_sample_s=0.0, max_calls_per_sample=1, settle_calls=0)
    (res,) = time_alternating({kind: call}, one).values()
    np.save(out, np.asarray(call()))
    print(json.dumps({"median_s": res.median_s}))


def per_process(model_path: str, db: str | None, threads: int, rounds: int, runs: int) -> dict:
    """Each system alone in its own process, the processes alternated (see the module docstring)."""
    from superopt.api import OptimizeConfig, optimize
    from superopt.frontends.light_models import light_model_inputs

    model = onnx.load(model_path)
    feed = light_model_inputs(model)
    with tempfile.TemporaryDirectory(prefix="superopt_per_process_") as tmp:
        t = Path(tmp)
        np.savez(t / "inputs.npz", **feed)
        systems = {"onnxruntime": ("onnxruntime", str(Path(model_path).resolve()))}
        for name, database in (("superopt_tuned", db), ("superopt_default", None)):
            if name == "superopt_tuned" and db is None:
                continue
            prog = optimize(model, OptimizeConfig(threads=threads, database=database, cost_model=None))
            systems[name] = ("superopt", str(prog.save(t / name)))
        names = list(systems)
        medians: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                kind, path = systems[name]
                cmd = [sys.executable, __file__, "--child", kind, path, "--inputs", str(t / "inputs.npz"),
                       "--runs", str(runs), "--threads", str(threads), "--child-out", str(t / f"{name}.npy")]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                medians[name].append(json.loads(done.stdout.strip().splitlines()[-1])["median_s"])
        ref = np.load(t / "onnxruntime.npy")
        diff = {n: float(np.abs(np.load(t / f"{n}.npy") - ref).max()) for n in names if n != "onnxruntime"}
    ms = {n: float(np.median(v)) * 1e3 for n, v in medians.items()}
    return {"rounds": rounds, "runs": runs, "ms": ms, "ms_per_round": {n: [x * 1e3 for x in v] for n, v in medians.items()},
            "vs_onnxruntime": {n: ms["onnxruntime"] / ms[n] for n in names if n != "onnxruntime"},
            "max_abs_diff_vs_onnxruntime": diff}


def write(res: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    name = res["model"]
    (RESULTS / f"tuned_{name}.json").write_text(json.dumps(res, indent=1))
    ms = res["ms"]
    lines = [f"# {name}: tuned vs default vs onnxruntime ({res['when_utc']}, {res['threads']} threads)", "",
             machine_line(res["machine"]), "",
             "| system | median ms | vs onnxruntime |", "|---|---:|---:|"]
    for k in ("superopt_tuned", "superopt_default", "onnxruntime"):
        lines.append(f"| {k} | {ms[k]:.2f} | {ms['onnxruntime'] / ms[k]:.2f}x |")
    lines += ["", f"Kernels from the tuning database: {res['kernels_from_database']}; tuned vs default "
              f"{res['tuned_vs_default']:.2f}x; max relative error vs the reference "
              f"{res['max_rel_error_vs_reference']:.1e}, max |diff| vs onnxruntime {res['max_abs_diff_vs_onnxruntime']:.1e}."]
    pp = res.get("per_process")
    if pp:
        lines += ["", f"Each system alone in its own process, processes alternated ({pp['rounds']} rounds of "
                  f"{pp['runs']} calls each; median over the rounds, ms):", "",
                  "| system | median ms | per round | vs onnxruntime |", "|---|---:|---|---:|"]
        for k, v in pp["ms"].items():
            rounds = ", ".join(f"{x:.2f}" for x in pp["ms_per_round"][k])
            lines.append(f"| {k} | {v:.2f} | {rounds} | {pp['ms']['onnxruntime'] / v:.2f}x |")
        lines += ["", "max |diff| vs onnxruntime: " + ", ".join(f"{k} {v:.1e}" for k, v in
                                                              pp["max_abs_diff_vs_onnxruntime"].items()) + "."]
    (RESULTS / f"tuned_{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--export", nargs=2, metavar=("LIGHT_MODEL", "PATH"))
    ap.add_argument("--db", default="superopt_tuning.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--per-process", type=int, default=0, metavar="ROUNDS",
                    help="also time each system alone in its own process, ROUNDS rounds (see above)")
    ap.add_argument("--runs", type=int, default=40, help="--per-process: timed calls per process (median)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child, args.inputs, args.runs, args.threads, args.child_out)
        return
    if args.export:
        export(*args.export)
        return
    if not args.model:
        ap.error("give a model path (or --export NAME PATH)")
    if args.per_process < 0 or args.runs < 1:
        ap.error("--per-process takes a number of rounds >= 0 and --runs at least 1")
    res = compare(args.model, args.db, args.threads, args.quick)
    if args.per_process:
        res["per_process"] = per_process(args.model, args.db, args.threads, args.per_process, args.runs)
    write(res)


if __name__ == "__main__":
    main()
