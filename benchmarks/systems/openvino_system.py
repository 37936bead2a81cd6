"""OpenVINO CPU plug-in: float32, 2 threads, LATENCY hint at batch 1, THROUGHPUT for batched rows.

prepare time = reading the ONNX model and compiling it (``superopt.measure.peers.openvino_runner``).
"""

from __future__ import annotations

import time

from benchmarks.systems.base import THREADS, System
from superopt.measure.peers import openvino_available, openvino_runner, openvino_version


class OpenVino(System):
    name = "openvino"
    description = "OpenVINO CPU, f32, INFERENCE_NUM_THREADS=2, LATENCY hint (THROUGHPUT for batched rows)"

    def available(self):
        return openvino_available()

    def versions(self):
        return {"openvino": openvino_version()}

    def prepare(self, instance, quick=False):
        data = instance.onnx_bytes()  # export time is not part of the compile time
        feeds = [x.detach().numpy() for x in instance.inputs]
        t0 = time.perf_counter()
        runner = openvino_runner(data, feeds, THREADS, batched=instance.meta.get("batch", 1) > 1)
        runner.run()
        dt = time.perf_counter() - t0
        self.last_note = f"{runner.hint}" + (f", {runner.note}" if runner.note else "")
        return runner.run, dt


SYSTEM = OpenVino()
