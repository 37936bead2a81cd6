"""torch.compile (Inductor, default mode). prepare time = compile + first call."""

from __future__ import annotations

import time

import torch

from benchmarks.systems.base import System


class TorchCompile(System):
    name = "torch.compile"
    description = "torch.compile(module) with the Inductor backend, default mode"

    def versions(self):
        return {"torch": torch.__version__}

    def skip_in_quick(self, instance):
        # hook kept for slow machines: big-model compiles took < 1 min each here, so nothing is skipped
        return False

    def prepare(self, instance, quick=False):
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        t0 = time.perf_counter()
        compiled = torch.compile(instance.module, backend="inductor")
        inputs = instance.inputs

        def fn():
            with torch.no_grad():
                return compiled(*inputs)

        fn()
        fn()  # make sure no recompilation happens inside the timed loop
        dt = time.perf_counter() - t0
        graphs = counters["stats"].get("unique_graphs", 0)
        breaks = sum(counters["graph_break"].values())
        self.last_note = f"graphs={graphs}, graph_breaks={breaks}"
        if graphs == 0:
            raise RuntimeError("dynamo captured no graph (fell back to eager)")
        return fn, dt


SYSTEM = TorchCompile()
