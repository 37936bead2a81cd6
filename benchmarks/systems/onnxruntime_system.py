"""onnxruntime CPU EP: intra_op 2, inter_op 1, ORT_ENABLE_ALL. prepare time = session creation."""

from __future__ import annotations

import time

from benchmarks.systems.base import THREADS, System


class OnnxRuntime(System):
    name = "onnxruntime"
    description = "onnxruntime CPUExecutionProvider, ORT_ENABLE_ALL, intra_op=2, inter_op=1"

    def available(self):
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            return False, f"onnxruntime not importable: {e}"
        return True, ""

    def versions(self):
        import onnx
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}

    def prepare(self, instance, quick=False):
        import onnxruntime as ort

        data = instance.onnx_bytes()  # export time is not part of the session-creation time
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        # onnxruntime's pool workers busy-wait between runs by default; in one process with other systems
        # on 2 cores, a spinning worker halves whoever is timed next (superopt and torch measured 2x slower
        # with a live session). They spin within a run (between its ops) and stop when it returns: with
        # spinning off altogether onnxruntime ran resnet50 6% and squeezenet 34% slower than alone on its
        # defaults; this way it runs within 1-2% of that (Xeon, 2 threads)
        so.add_session_config_entry("session.force_spinning_stop", "1")
        t0 = time.perf_counter()
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        dt = time.perf_counter() - t0
        feeds = {i.name: x.detach().numpy()
                 for i, x in zip(sess.get_inputs(), instance.inputs, strict=True)}
        out_name = [sess.get_outputs()[0].name]

        def fn():
            return sess.run(out_name, feeds)[0]

        return fn, dt


SYSTEM = OnnxRuntime()
