"""Peer inference engines timed beside superopt: OpenVINO (an optional extra), and a check for outputs that
say nothing (all zeros, one constant, not finite), which a benchmark flags so a fast result of that kind
cannot pass as a win.

OpenVINO runs float32 (``INFERENCE_PRECISION_HINT f32``: on CPUs with bf16 or f16 units its default would
drop precision) on the same thread count as the others. Batch-1 rows use the LATENCY hint. Batched rows
use the THROUGHPUT hint as OpenVINO means it: the batch is split over the number of infer requests it asks
for, which run concurrently on its streams; one synchronous request of the whole batch would run on one
stream, a fraction of the threads.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

OPENVINO_MISSING = "openvino is not installed (pip install 'superopt[bench]' or pip install openvino); " \
                   "timing without it"


def openvino_available() -> tuple[bool, str]:
    """(True, "") when ``import openvino`` works, else (False, a one-line reason)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False, OPENVINO_MISSING
    return True, ""


def openvino_version() -> str:
    import openvino

    return str(openvino.__version__).split("-", 1)[0]


def output_flag(y: np.ndarray) -> str | None:
    """Why an output tells little about correctness, or None: "all zeros", "constant", "constant but for N of
    M elements" (a saturated softmax: one class 1.0, the rest 0), "not finite", "empty".

    Such an output (random weights through a ReLU that kills everything, logits so large the softmax is
    one-hot) agrees with a reference that is itself degenerate, and a program that skips the work would
    pass."""
    a = np.asarray(y, dtype=np.float64).ravel()
    if a.size == 0:
        return "empty"
    if not np.all(np.isfinite(a)):
        return "not finite"
    if not np.any(a):
        return "all zeros"
    scale = float(np.max(np.abs(a)))
    odd = int(np.count_nonzero(np.abs(a - np.median(a)) > 1e-6 * scale))
    if odd == 0:
        return "constant"
    if odd <= a.size // 1000:
        return f"constant but for {odd} of {a.size} elements"
    return None


@dataclass(frozen=True)
class OpenVinoRunner:
    """One compiled OpenVINO model: ``run()`` computes the output of the feeds given at construction."""

    run: Callable[[], np.ndarray]
    hint: str
    requests: int
    note: str


def _split_requests(compiled, batch: int) -> int:
    try:
        n = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    except Exception:  # noqa: BLE001 - an older plug-in without the property: one request
        return 1
    return n if n > 1 and batch % n == 0 else 1


def openvino_runner(model_bytes: bytes, feeds: list[np.ndarray], threads: int, batched: bool) -> OpenVinoRunner:
    """Compile the ONNX model for OpenVINO's CPU plug-in; ``feeds`` are the inputs in the model's order.

    ``batched``: THROUGHPUT hint, the leading (batch) axis split over OpenVINO's optimal number of infer
    requests when it divides the batch and the model reshapes to the smaller batch; else LATENCY."""
    import openvino as ov

    core = ov.Core()
    model = _read(core, model_bytes)
    cfg = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
           "PERFORMANCE_HINT": "THROUGHPUT" if batched else "LATENCY"}
    feeds = [np.ascontiguousarray(x, dtype=np.float32) for x in feeds]
    compiled = core.compile_model(model, "CPU", cfg)
    batch = int(feeds[0].shape[0]) if feeds and feeds[0].ndim else 1
    n = _split_requests(compiled, batch) if batched else 1
    note = ""
    if n > 1:
        try:
            model.reshape({p.get_any_name(): [batch // n, *x.shape[1:]]
                           for p, x in zip(model.inputs, feeds, strict=True)})
            compiled = core.compile_model(model, "CPU", cfg)
        except Exception as err:  # noqa: BLE001 - a model with the batch baked into a constant
            note = f"one request of the whole batch (reshape to batch {batch // n} failed: {type(err).__name__})"
            compiled, n = core.compile_model(_read(core, model_bytes), "CPU", cfg), 1
    if n == 1:
        req = compiled.create_infer_request()

        def run_one() -> np.ndarray:
            req.infer(feeds)
            return req.get_output_tensor(0).data

        return OpenVinoRunner(run_one, cfg["PERFORMANCE_HINT"], 1, note)
    parts = [[x[i * (batch // n):(i + 1) * (batch // n)] for x in feeds] for i in range(n)]
    queue = ov.AsyncInferQueue(compiled, n)
    out_shape = (batch, *tuple(compiled.outputs[0].get_shape())[1:])
    out = np.empty(out_shape, np.float32)
    step = batch // n

    def collect(request, i) -> None:
        out[i * step:(i + 1) * step] = request.get_output_tensor(0).data

    queue.set_callback(collect)

    def run_split() -> np.ndarray:
        for i, p in enumerate(parts):
            queue.start_async(p, i)
        queue.wait_all()
        return out

    return OpenVinoRunner(run_split, cfg["PERFORMANCE_HINT"], n, f"{n} infer requests of batch {step}")


def _read(core, model_bytes: bytes):
    with tempfile.TemporaryDirectory() as tmp:  # read_model takes a path for ONNX in every version
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(model_bytes)
        return core.read_model(path)
