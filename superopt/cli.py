"""Command line: ``superopt optimize model.onnx`` and ``superopt demo``."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

CAPSULE = "V[n,y,x,o,p,q] += P[n,2*y+kh,2*x+kw,i,p,r] * W[kh,kw,i,o,r,q]"


def _median_time(fn, repeats: int) -> float:
    return _alternating_medians([fn], repeats)[0]


def _alternating_medians(fns, repeats: int) -> list[float]:
    """Median time of each function, timed in alternation (machine noise hits all alike)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            fn()  # settle: another runtime's worker threads may still be busy-waiting
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [float(np.median(ts)) for ts in times]


def cmd_optimize(args: argparse.Namespace) -> int:
    from superopt.api import OptimizeConfig, optimize, random_inputs

    prog = optimize(args.model, OptimizeConfig(threads=args.threads, verify=not args.no_verify))
    print(f"optimized {args.model}: {prog.report}")
    feed = random_inputs(prog.graph)
    t = _median_time(lambda: prog.executor(feed), args.repeat)
    print(f"median run time: {t * 1e3:.2f} ms ({args.threads} threads)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on an embedded default: the capsule votes op and squeezenet, verified and timed."""
    import onnxruntime as ort
    import torch

    from superopt.api import OptimizeConfig, optimize, optimize_op
    from superopt.testing.light_models import light_model_inputs, randomized_light_model

    torch.set_num_threads(args.threads)
    cfg = OptimizeConfig(threads=args.threads)
    print(f"[1/2] capsule votes, one line of index notation:\n      {CAPSULE}")
    prog = optimize_op(CAPSULE, {"P": (8, 15, 15, 32, 4, 4), "W": (3, 3, 32, 32, 4, 4)}, cfg)
    print(f"      {prog.report}")
    rng = np.random.default_rng(0)
    P = rng.standard_normal((8, 15, 15, 32, 4, 4)).astype(np.float32)
    W = rng.standard_normal((3, 3, 32, 32, 4, 4)).astype(np.float32)
    tp, tw = torch.from_numpy(P), torch.from_numpy(W)
    unfold = lambda: torch.einsum("nyxhwipr,hwiorq->nyxopq",  # noqa: E731
                                  tp.unfold(1, 3, 2).unfold(2, 3, 2).permute(0, 1, 2, 6, 7, 3, 4, 5), tw)
    ours, theirs = _alternating_medians([lambda: prog(P, W), unfold], 15)
    flops = 2 * 8 * 7 * 7 * 32 * 4 * 4 * 3 * 3 * 32 * 4
    err = float(np.abs(prog(P, W)[0] - unfold().numpy()).max())
    print(f"      superopt {ours * 1e3:.2f} ms ({flops / ours / 1e9:.1f} GFLOP/s) vs torch einsum "
          f"{theirs * 1e3:.2f} ms: {theirs / ours:.2f}x; max |diff| {err:.1e}")
    print("[2/2] squeezenet (onnx wheel, seeded random weights)")
    model = randomized_light_model("squeezenet")
    prog = optimize(model, cfg)
    print(f"      {prog.report}")
    feed = light_model_inputs(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # it would steal a core from us
    sess = ort.InferenceSession(model.SerializeToString(), so)
    ref = sess.run(None, feed)[0]
    x = list(feed.values())
    got = prog(*x)[0]
    ours, theirs = _alternating_medians([lambda: prog(*x), lambda: sess.run(None, feed)], 15)
    print(f"      superopt {ours * 1e3:.1f} ms vs onnxruntime {theirs * 1e3:.1f} ms: {theirs / ours:.2f}x; "
          f"max |diff| vs onnxruntime {float(np.abs(got - ref).max()):.1e}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superopt", description="search-based superoptimizer for tensor programs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("optimize", help="compile an ONNX model to verified C kernels and time it")
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--no-verify", action="store_true", help="skip the check against the reference interpreter")
    p.set_defaults(fn=cmd_optimize)
    d = sub.add_parser("demo", help="run the capsule votes op and squeezenet end to end")
    d.add_argument("--threads", type=int, default=2)
    d.set_defaults(fn=cmd_demo)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        print(f"superopt: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
