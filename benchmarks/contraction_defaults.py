"""The default contraction schedules of this checkout against another's, on seeded random contractions the
rules were not written from: which kernels change, and how fast each changed one runs against the other.

    python benchmarks/contraction_defaults.py --baseline CHECKOUT [--seed 7] [--random 40] [--threads 2]
                                              [--rounds 7] [--out benchmarks/results] [--name contraction_defaults]

A rule of the default schedule is written from the cases at hand; this checks it where it was not. Each
checkout compiles the same random contractions (``benchmarks/contraction_cases.py``,
``random_contractions(--random, --seed)``) as a user does (``superopt.op``: the graph passes, then the default
schedules), in a fresh process with that checkout on the path, and hands back each op's program: its graph (a
layout move such as merged output dims reshapes a kernel's compute) and its kernels' schedules. The contractions
whose kernels differ are run here, both programs on the same seeded inputs, checked against each other, and timed
in alternating blocks (``superopt.measure.timing``, medians). Reports each changed case's speed-up (the
baseline's time over this checkout's), their geomean, and the wins and losses beyond ``--tie`` apart.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (run in a fresh process with a checkout on the path: argv = seed, count, output file, threads)
_CHILD = r"""
import pickle, sys
import numpy as np
import superopt
from benchmarks.contraction_cases import random_contractions
from superopt.schedule.primitives import trace_to_json

seed, count, out, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cases = {}
for case in random_contractions(count, seed, max_bytes=16 << 20):
    prog = superopt.op(case.text, threads=threads, verify=False).program(*[np.zeros(s, np.float32)
                                                                          for s in case.shapes])
    cases[case.name] = {"text": case.text, "shapes": [list(s) for s in case.shapes], "graph": prog.executor.graph,
                        "traces": {n: trace_to_json(t) for n, t in sorted(prog.executor.traces.items())}}
pickle.dump(cases, open(out, "wb"))
"""


def default_kernels(code: Path, seed: int, count: int, threads: int, out: Path) -> dict:
    """``code``'s program of each random contraction: name -> text, shapes, graph, traces (node -> JSON)."""
    import pickle

    subprocess.run([sys.executable, "-c", _CHILD, str(seed), str(count), str(out), str(threads)], cwd=code,
                   check=True, env=dict(os.environ, PYTHONPATH=str(code)))
    with open(out, "rb") as f:
        return pickle.load(f)


def time_pair(shapes: list[list[int]], programs: dict[str, tuple], threads: int, rounds: int) -> dict:
    """Both programs (which -> graph, node -> trace JSON) run on the same seeded inputs of the op's ``shapes``,
    checked against each other and timed in alternating blocks: medians in seconds and the largest difference
    relative to the largest output."""
    import numpy as np

    from superopt.measure.timing import TimingConfig, time_alternating
    from superopt.runtime.executor import ExecutorConfig, GraphExecutor
    from superopt.schedule.primitives import trace_from_json

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    runs, outs = {}, {}
    for which, (graph, traces) in programs.items():
        feed = dict(zip(graph.inputs, arrays, strict=True))
        ex = GraphExecutor(graph, {n: list(trace_from_json(t)) for n, t in traces.items()}, ExecutorConfig(threads))
        outs[which] = np.asarray(next(iter(ex(feed).values())))
        runs[which] = lambda ex=ex, feed=feed: ex(feed)
    ref = outs["baseline"]
    err = float(np.abs(outs["this"] - ref).max() / max(float(np.abs(ref).max()), 1e-30))
    timed = time_alternating(runs, TimingConfig(warmup_calls=2, rounds=rounds, min_sample_s=0.1, settle_calls=1))
    return {"baseline_s": timed["baseline"].median_s, "this_s": timed["this"].median_s, "max_rel_diff": err}


def _kernels(case: dict) -> list[tuple[str, str]]:
    """A program's kernels as its computes and schedules, in the order of its nodes (names aside)."""
    return [(n.op.digest(), case["traces"][n.name]) for n in case["graph"].nodes if n.name in case["traces"]]


def render(result: dict) -> str:
    lines = ["# Default contraction schedules against another checkout's, on random contractions", "",
             f"CPU: {result['cpu']}; {result['threads']} threads. `random_contractions({result['random']}, "
             f"{result['seed']})` of `benchmarks/contraction_cases.py`, each compiled as `superopt.op` does by this checkout "
             f"and by {result['baseline_name']}; each contraction whose kernel (compute or schedule) differs timed as "
             "one program each, in "
             f"{result['rounds']} alternating rounds of blocks (medians). Speed-up: the baseline's time over this "
             "checkout's.", "",
             f"{len(result['changed'])} of {result['random']} kernels differ.", "",
             "| case | contraction | baseline ms | this ms | speed-up |", "|---|---|---:|---:|---:|"]
    for name, r in result["changed"].items():
        lines.append(f"| {name} | `{r['text']}` {' x '.join('x'.join(map(str, s)) for s in r['shapes'])} "
                     f"| {r['baseline_s'] * 1e3:.3f} | {r['this_s'] * 1e3:.3f} | {r['speedup']:.2f}x |")
    s = result["summary"]
    lines += ["", f"Geomean {s['geomean']:.2f}x over the changed cases: {s['wins']} faster by more than "
              f"{result['tie']:.0%}, {s['losses']} slower by more than that, {s['ties']} within it. Every pair agreed "
              f"within {s['max_rel_diff']:.1e} of the largest output."]
    return "\n".join(lines) + "\n"


def ab_arguments(ap: argparse.ArgumentParser, *, seed: int | None, random: int | None, name: str | None) -> None:
    """The options of a before/after benchmark on random contractions (this one and ``default_rules.py``)."""
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--random", type=int, default=random)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tie", type=float, default=0.03, help="speed-ups within this of 1 count as ties")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--name", default=name)


def ab_summary(speedups: list[float], tie: float) -> dict:
    """The geomean of the changed cases' speed-ups, and the wins and losses beyond ``tie`` apart."""
    return {"geomean": math.exp(sum(math.log(u) for u in speedups) / len(speedups)) if speedups else 1.0,
            "wins": sum(u > 1 + tie for u in speedups), "losses": sum(u < 1 - tie for u in speedups),
            "ties": sum(abs(u - 1) <= tie for u in speedups)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the checkout whose default schedules are the before")
    ap.add_argument("--baseline-name", default="the --baseline checkout", help="what the before is, for the table")
    ab_arguments(ap, seed=7, random=40, name="contraction_defaults")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import tempfile

    from benchmarks.machine import cpu_model, write_result

    baseline = Path(args.baseline).resolve()
    with tempfile.TemporaryDirectory(prefix="superopt-defaults-") as tmp:
        before = default_kernels(baseline, args.seed, args.random, args.threads, Path(tmp) / "before.pickle")
        after = default_kernels(REPO, args.seed, args.random, args.threads, Path(tmp) / "after.pickle")
    result: dict = {"cpu": cpu_model(), "threads": args.threads, "seed": args.seed, "random": args.random,
                    "rounds": args.rounds, "tie": args.tie, "baseline_name": args.baseline_name,
                    "changed": {}}
    for name, case in after.items():
        old = before[name]
        if _kernels(old) == _kernels(case):
            continue
        r = time_pair(case["shapes"], {"baseline": (old["graph"], old["traces"]),
                                       "this": (case["graph"], case["traces"])}, args.threads, args.rounds)
        r |= {"text": case["text"], "shapes": case["shapes"], "speedup": r["baseline_s"] / r["this_s"]}
        result["changed"][name] = r
        print(f"{name:12s} {case['text']:48s} {r['speedup']:.2f}x", flush=True)
    result["summary"] = ab_summary([r["speedup"] for r in result["changed"].values()], args.tie) | {
        "max_rel_diff": max((r["max_rel_diff"] for r in result["changed"].values()), default=0.0)}
    write_result(args.out, args.name, result, render(result))
    print(render(result))


if __name__ == "__main__":
    main()
