"""Measure GPU schedules in isolated worker processes, with the CPU measurement's error codes.

    records = measure_gpu([(compute, trace), ...], GpuMeasureConfig())   # list[MeasureRecord], in order

A worker process (``python -m superopt.runtime.gpu.measure REQUEST RESULTS``) opens the GPU, lowers every
candidate for the device's target (``ILLEGAL_SCHEDULE``), compiles them in one nvcc run (one by one when the
batch fails: ``COMPILE_ERROR``), then runs each on seeded inputs against the reference interpreter
(``WRONG_ANSWER``) and times it with CUDA events (``OK``), writing one result line per candidate as it goes.
A candidate that kills its worker (an illegal address corrupts the CUDA context) is ``RUNTIME_ERROR``; one
that outlives its time is ``TIMEOUT``; the parent then starts a fresh worker for the candidates left.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from superopt.ir.compute import Compute
from superopt.schedule.primitives import Primitive


@dataclass(frozen=True)
class GpuMeasureConfig:
    binding: str | None = None  # None: automatic (pycuda, cuda-bindings, CuPy)
    repeats: int = 10
    warmup: int = 2
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0
    build_timeout_s: float = 300.0  # one worker's nvcc run
    run_timeout_s: float = 60.0  # one candidate: correctness run and timing


def measure_gpu(items: Sequence[tuple[Compute, Sequence[Primitive]]], config: GpuMeasureConfig | None = None):
    """One MeasureRecord per (compute, trace), in order (see the module docstring)."""
    from superopt.measure.records import MeasureRecord

    config = config or GpuMeasureConfig()
    results: dict[int, dict] = {}
    pending = list(range(len(items)))
    with tempfile.TemporaryDirectory(prefix="so_gpu_measure_") as tmp:
        while pending:
            req, out = Path(tmp) / "request.pkl", Path(tmp) / "results.jsonl"
            req.write_bytes(pickle.dumps(([(i, items[i][0], tuple(items[i][1])) for i in pending], config)))
            out.unlink(missing_ok=True)
            limit = config.build_timeout_s + config.run_timeout_s * len(pending)
            err = ""
            try:
                res = subprocess.run([sys.executable, "-m", "superopt.runtime.gpu.measure", str(req), str(out)],
                                     capture_output=True, text=True, timeout=limit)
                code, err = res.returncode, (res.stderr or "")[-2000:]
                timed_out = False
            except subprocess.TimeoutExpired:
                code, timed_out = None, True
            done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
            fatal = next((r for r in done if r.get("fatal")), None)
            if fatal is not None:  # the worker could not open the GPU: every candidate fails alike
                for i in pending:
                    results[i] = {**fatal, "index": i}
                break
            for r in done:
                results[r["index"]] = r
            pending = [i for i in pending if i not in results]
            if pending and (code != 0 or timed_out):  # the next candidate took its worker down
                culprit = pending.pop(0)
                results[culprit] = {"index": culprit, "code": "TIMEOUT" if timed_out else "RUNTIME_ERROR",
                                    "msg": "worker timed out" if timed_out else f"worker died (exit {code}): {err}"}
            elif pending:  # a clean exit that skipped candidates: a bug in the worker
                for i in pending:
                    results[i] = {"index": i, "code": "RUNTIME_ERROR", "msg": "the worker did not report it"}
                pending = []
    records = []
    for i, (c, tr) in enumerate(items):
        r = results[i]
        from superopt.ir.canonical import workload_key

        times = tuple(r.get("times_s", ()))
        records.append(MeasureRecord(str(c), c.digest(), tuple(tr), r.get("target", {}), r["code"], r.get("msg", ""),
                                     times_s=times, median_s=float(np.median(times)) if times else None,
                                     build_s=r.get("build_s", 0.0), constant_inputs=(), workload_key=workload_key(c)))
    return records


# ---- the worker ---------------------------------------------------------------------------------------------

def _worker(request: Path, results: Path) -> int:
    items, config = pickle.loads(request.read_bytes())
    out = results.open("a")

    def put(rec: dict) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    try:
        from superopt.runtime.gpu import require_gpu

        dev = require_gpu(config.binding)
    except Exception as e:  # noqa: BLE001 (no GPU: every candidate gets the same answer)
        put({"index": items[0][0], "code": "RUNTIME_ERROR", "msg": f"{type(e).__name__}: {e}", "fatal": True})
        return 3
    from superopt.codegen.lower import lower
    from superopt.interp import evaluate_compute
    from superopt.runtime.gpu.kernel import build_gpu_kernels_each

    target = dev.target
    tdict = target.to_dict()
    legal = []
    for i, c, tr in items:
        try:
            lower(c, tr, target)
            legal.append((i, c, tr))
        except Exception as e:  # noqa: BLE001
            put({"index": i, "code": "ILLEGAL_SCHEDULE", "msg": f"{type(e).__name__}: {e}"[:2000], "target": tdict})
    t0 = time.perf_counter()
    kernels, _ = build_gpu_kernels_each([(c, tr) for _, c, tr in legal], dev)
    build_s = (time.perf_counter() - t0) / max(len(legal), 1)
    rng = np.random.default_rng(config.seed)
    for (i, c, _), k in zip(legal, kernels):
        base = {"index": i, "target": tdict, "build_s": build_s}
        if isinstance(k, Exception):
            put({**base, "code": "COMPILE_ERROR", "msg": f"{type(k).__name__}: {k}"[:2000]})
            continue
        try:
            args = [rng.standard_normal(c.type_of[n].shape).astype(c.type_of[n].np_dtype) for n in c.inputs]
            got = k(*args)
            refs = evaluate_compute(c, args, np.float64)
            bad = [o for o, g, r in zip(c.outputs, got, refs)
                   if not np.allclose(g, r, rtol=config.rtol, atol=config.atol, equal_nan=True)]
            if bad:
                put({**base, "code": "WRONG_ANSWER", "msg": f"outputs {bad} differ from the reference interpreter"})
                continue
            packs = tuple(k.raw)  # every input is a run-time input here: its re-layout is timed too
            times = [dev.binding_impl.event_pair_ms(lambda k=k, packs=packs: k.run(packs)) / 1e3
                     for _ in range(config.warmup + config.repeats)]
            put({**base, "code": "OK", "times_s": times[config.warmup:]})
        except Exception as e:  # noqa: BLE001
            put({**base, "code": "RUNTIME_ERROR", "msg": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"})
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1]), Path(sys.argv[2])))
