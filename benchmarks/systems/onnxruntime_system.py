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
        from superopt.cli_artifact import _ort_session

        data = instance.onnx_bytes()  # export time is not part of the session-creation time
        # the side-by-side onnxruntime session (superopt.cli_artifact): workers spin within a run and stop when it returns.
        # Left spinning after a run, a worker takes a core from whoever is timed next; with spinning off
        # altogether onnxruntime itself runs slower than on its defaults, so it spins only within a run
        t0 = time.perf_counter()
        sess = _ort_session(data, THREADS)
        dt = time.perf_counter() - t0
        feeds = {i.name: x.detach().numpy()
                 for i, x in zip(sess.get_inputs(), instance.inputs, strict=True)}
        out_name = [sess.get_outputs()[0].name]

        def fn():
            return sess.run(out_name, feeds)[0]

        return fn, dt


SYSTEM = OnnxRuntime()
