"""Measure GPU schedules in isolated worker processes, with the CPU measurement's error codes.

    records = measure_gpu([(compute, trace), ...], GpuMeasureConfig())   # list[MeasureRecord], in order
    with GpuRunner(GpuMeasureConfig(binding=...), target) as runner:     # the Runner interface of
        results = runner.measure([MeasureInput(...), ...])              # superopt.measure.runner

A worker process (``python -m superopt.measure.gpu REQUEST RESULTS``) opens the GPU, lowers every
candidate for the device's target (``ILLEGAL_SCHEDULE``), compiles them in one nvcc run (one by one when the
batch fails: ``COMPILE_ERROR``), then runs each on the seeded inputs of the CPU measurement
(:func:`superopt.interp.inputs.random_kernel_inputs`) against the reference interpreter in float64
(``WRONG_ANSWER``; one reference per workload) and times it with CUDA events (``OK``), writing one result
line per candidate as it goes. A timed repeat is one event pair around enough back-to-back calls to last
``min_repeat_s``; run-time inputs the kernel packs are re-packed inside every call, constant ones once.
A candidate that kills its worker (an illegal address corrupts the CUDA context) is ``RUNTIME_ERROR``; one
that outlives its time is ``TIMEOUT``; the parent then starts a fresh worker for the candidates left.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from superopt.ir.compute import Compute
from superopt.schedule.primitives import Primitive

if TYPE_CHECKING:
    from superopt.measure.records import MeasureRecord
    from superopt.measure.service import MeasureInput, MeasureResult
    from superopt.target import Target


@dataclass(frozen=True)
class GpuMeasureConfig:
    binding: str | None = None  # None: automatic (pycuda, cuda-bindings, CuPy); or "emulator"
    repeats: int = 10
    warmup: int = 2
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0
    build_timeout_s: float = 300.0  # one worker's nvcc run
    run_timeout_s: float = 60.0  # one candidate: correctness run and timing
    min_repeat_s: float = 0.0  # calls per timed repeat: enough to last this long (0: one call per repeat)
    max_calls_per_repeat: int = 100


@dataclass(frozen=True)
class _Item:
    index: int
    compute: Compute
    trace: tuple[Primitive, ...]
    constants: tuple[str, ...] = ()  # inputs packed once, outside the timing
    slow_call_s: float | None = None  # a first call slower than this is reported with that call's time


def _run_workers(items: Sequence[_Item], config: GpuMeasureConfig) -> dict[int, dict]:
    """Result dict per item index (see the module docstring); a worker that cannot open the GPU gives every
    item its ``fatal`` result."""
    results: dict[int, dict] = {}
    by_index = {it.index: it for it in items}
    pending = [it.index for it in items]
    with tempfile.TemporaryDirectory(prefix="so_gpu_measure_") as tmp:
        while pending:
            req, out = Path(tmp) / "request.pkl", Path(tmp) / "results.jsonl"
            req.write_bytes(pickle.dumps(([by_index[i] for i in pending], config)))
            out.unlink(missing_ok=True)
            limit = config.build_timeout_s + config.run_timeout_s * len(pending)
            err = ""
            try:
                res = subprocess.run([sys.executable, "-m", "superopt.measure.gpu", str(req), str(out)],
                                     capture_output=True, text=True, timeout=limit)
                code, err = res.returncode, (res.stderr or "")[-2000:]
                timed_out = False
            except subprocess.TimeoutExpired:
                code, timed_out = None, True
            done = [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")] \
                if out.exists() else []
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
    return results


def measure_gpu(items: Sequence[tuple[Compute, Sequence[Primitive]]],
                config: GpuMeasureConfig | None = None) -> list[MeasureRecord]:
    """One MeasureRecord per (compute, trace), in order (see the module docstring); every input is a
    run-time input (its re-layout is timed)."""
    from superopt.ir.canonical import workload_key
    from superopt.measure.records import MeasureRecord

    config = config or GpuMeasureConfig()
    results = _run_workers([_Item(i, c, tuple(tr)) for i, (c, tr) in enumerate(items)], config)
    records = []
    for i, (c, tr) in enumerate(items):
        r = results[i]
        times = tuple(r.get("times_s", ()))
        records.append(MeasureRecord(str(c), c.digest(), tuple(tr), r.get("target", {}), r["code"], r.get("msg", ""),
                                     times_s=times, median_s=float(np.median(times)) if times else None,
                                     build_s=r.get("build_s", 0.0), constant_inputs=(), workload_key=workload_key(c)))
    return records


class GpuRunner:
    """The measurement-runner interface (:class:`superopt.measure.runner.Runner`) on the GPU: each
    ``measure`` call runs its candidates in fresh isolated worker processes (see the module docstring).

    ``target`` is the device's target the records will name; a worker that opens a device of another
    target is an error (its records would be mislabeled), as is a worker that cannot open the GPU at all
    (:class:`~superopt.runtime.gpu.device.GpuUnavailable`, one line)."""

    def __init__(self, config: GpuMeasureConfig, target: Target) -> None:
        if target.kind != "cuda":
            raise ValueError(f"GpuRunner measures on a cuda target, not {target.kind!r}")
        self.config = config
        self.target = target

    def measure(self, inputs: Sequence[MeasureInput], time_left_s: float | None = None) -> list[MeasureResult]:
        """``time_left_s``: the caller's budget. A GPU worker's own time limit bounds each call, so the budget
        is checked before the call: with none left every input is NOT_MEASURED."""
        from superopt.measure.service import ErrorCode, MeasureResult
        from superopt.runtime.gpu.device import GpuUnavailable

        inputs = list(inputs)
        if time_left_s is not None and time_left_s <= 0:
            return [MeasureResult(ErrorCode.NOT_MEASURED, error_msg="the time budget ended before it ran")
                    for _ in inputs]
        items = [_Item(i, inp.compute, tuple(inp.trace), tuple(sorted(inp.constants())), inp.slow_call_s)
                 for i, inp in enumerate(inputs)]
        if any(inp.source is not None for inp in inputs):
            raise ValueError("GpuRunner measures generated CUDA only (a MeasureInput has a hand-written source)")
        results = _run_workers(items, self.config) if items else {}
        from superopt.target import Target

        want = self.target.key()
        out = []
        for i in range(len(inputs)):
            r = results[i]
            if r.get("fatal"):
                raise GpuUnavailable(f"the GPU measurement worker could not open the GPU: {r.get('msg', '')}"
                                     .splitlines()[0])
            if r.get("target") is not None and Target.from_dict(r["target"]).key() != want:
                have, mine = Target.from_dict(r["target"]).to_dict(), self.target.to_dict()
                diff = sorted(k for k in mine if have.get(k) != mine[k])
                raise RuntimeError(f"the GPU measurement worker opened another device than the target (differs in "
                                   f"{', '.join(diff)}): its records would be mislabeled")
            times = [float(t) for t in r.get("times_s", ())]
            out.append(MeasureResult(ErrorCode[r["code"]], times, float(np.median(times)) if times else None,
                                     r.get("msg", ""), float(r.get("build_s", 0.0))))
        return out

    def close(self) -> None:
        pass  # workers live for one measure call

    def __enter__(self) -> GpuRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the worker ---------------------------------------------------------------------------------------------

def _time_candidate(dev, k, packs: tuple[str, ...], first_s: float, config: GpuMeasureConfig) -> list[float]:
    """Seconds per call of ``config.repeats`` event-timed repeats (after ``warmup``), each repeat enough calls
    to last ``min_repeat_s`` (as estimated from the first call)."""
    calls = 1
    if config.min_repeat_s > 0 and first_s > 0:
        calls = max(1, min(config.max_calls_per_repeat, math.ceil(config.min_repeat_s / first_s)))

    def run() -> None:
        for _ in range(calls):
            k.run(packs)

    times = [dev.binding_impl.event_pair_ms(run) / 1e3 / calls for _ in range(config.warmup + config.repeats)]
    return times[config.warmup:]


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
        put({"index": items[0].index, "code": "RUNTIME_ERROR", "msg": f"{type(e).__name__}: {e}", "fatal": True})
        return 3
    from superopt.interp import evaluate_compute
    from superopt.interp.inputs import random_kernel_inputs
    from superopt.interp.magnitude import compute_magnitudes
    from superopt.measure.worker import outputs_match
    from superopt.runtime.gpu.kernel import build_gpu_kernels_each
    from superopt.schedule.plan import lower

    target = dev.target
    tdict = target.to_dict()
    legal = []
    for it in items:
        try:
            lower(it.compute, it.trace, target)
            legal.append(it)
        except Exception as e:  # noqa: BLE001
            put({"index": it.index, "code": "ILLEGAL_SCHEDULE", "msg": f"{type(e).__name__}: {e}"[:2000],
                 "target": tdict})
    if not legal:
        return 0
    t0 = time.perf_counter()
    kernels, _ = build_gpu_kernels_each([(it.compute, it.trace) for it in legal], dev)
    build_s = (time.perf_counter() - t0) / max(len(legal), 1)
    refs: dict[str, tuple[list, list, list] | str] = {}  # workload digest -> (inputs, outputs, magnitudes)
    for it, k in zip(legal, kernels):
        c = it.compute
        base = {"index": it.index, "target": tdict, "build_s": build_s}
        if isinstance(k, Exception):
            put({**base, "code": "COMPILE_ERROR", "msg": f"{type(k).__name__}: {k}"[:2000]})
            continue
        try:
            d = c.digest()
            if d not in refs:
                try:
                    args = random_kernel_inputs(c, config.seed)
                    refs[d] = (args, [np.asarray(r) for r in evaluate_compute(c, args, np.float64)],
                               compute_magnitudes(c, args))
                except Exception as e:  # noqa: BLE001
                    refs[d] = f"reference interpreter failed: {type(e).__name__}: {e}"
            ref = refs[d]
            if isinstance(ref, str):
                put({**base, "code": "RUNTIME_ERROR", "msg": ref[:2000]})
                continue
            args, expected, magnitudes = ref
            t1 = time.perf_counter()
            got = k(*args)
            first = time.perf_counter() - t1
            ok, msg = outputs_match(got, expected, config.rtol, config.atol, magnitudes)
            if not ok:
                put({**base, "code": "WRONG_ANSWER", "msg": f"differs from the reference interpreter: {msg}"[:2000]})
                continue
            if it.slow_call_s is not None and first > it.slow_call_s:
                put({**base, "code": "OK", "times_s": [first], "msg": f"slow: one call timed ({first:.3g}s)"})
                continue
            packs = tuple(n for n in k.raw if n not in it.constants)  # run-time inputs: re-packed every call
            put({**base, "code": "OK", "times_s": _time_candidate(dev, k, packs, first, config)})
        except Exception as e:  # noqa: BLE001
            put({**base, "code": "RUNTIME_ERROR", "msg": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"})
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1]), Path(sys.argv[2])))
