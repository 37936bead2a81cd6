"""PyTorch eager (no_grad, 2 threads)."""

from __future__ import annotations

import time

import torch

from benchmarks.systems.base import System


def eager_fn(module, inputs):
    def fn():
        with torch.no_grad():
            return module(*inputs)

    return fn


class TorchEager(System):
    name = "eager"
    description = "PyTorch eager, torch.no_grad()"

    def versions(self):
        return {"torch": torch.__version__}

    def prepare(self, instance, quick=False):
        t0 = time.perf_counter()
        fn = eager_fn(instance.module, instance.inputs)
        fn()
        return fn, time.perf_counter() - t0


SYSTEM = TorchEager()
