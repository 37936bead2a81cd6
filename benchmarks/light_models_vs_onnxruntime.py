"""All nine onnx "light" models (seeded random weights): superopt reference interpreter vs onnxruntime.

Prints the max abs / rel error of each model's output. Usage: python benchmarks/light_models_vs_onnxruntime.py
[--float32] [model ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from superopt.frontends.light_models import LIGHT_MODELS, compare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*", default=list(LIGHT_MODELS))
    ap.add_argument("--float32", action="store_true", help="evaluate in float32 instead of float64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dtype = np.float32 if args.float32 else np.float64
    cols = ("max_abs_err", "max_rel_err", "max|out|", "allclose", "sec")
    print(f"{'model':14s} " + " ".join(f"{c:>12s}" for c in cols))
    for name in args.models:
        t = time.time()
        r = compare(name, args.seed, dtype)
        print(
            f"{name:14s} {r['max_abs']:12.3e} {r['max_rel']:12.3e} {r['max_out']:12.3g} "
            f"{str(r['allclose']):>12s} {time.time() - t:12.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
