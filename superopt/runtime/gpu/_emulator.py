"""A CPU stand-in for a GPU binding (``binding="emulator"``): modules are the g++ emulation of the CUDA
source (blocks and threads as loops), device memory is host memory, events are wall-clock times.

It runs the whole GPU runtime path (buffers, packs on the device, launch order, timing calls) on a
machine without a GPU, for tests and dry runs of ``benchmarks/gpu_check.py``; its times mean nothing.
Its device is an H200 by its limits but not by its name (:data:`EMULATED`), so the records it writes
never share a target key with a real H200's.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from superopt.runtime.gpu.device import DeviceBuffer
from superopt.target import H200, GpuSpec

EMULATED = replace(H200, name="CPU emulator of an NVIDIA H200")


class EmulatorBinding:
    name = "emulator"
    needs_cubin = False

    def spec(self) -> GpuSpec:
        return EMULATED

    def load(self, image: bytes, sources=None):
        from superopt.runtime.gpu.emulate import compile_emulation

        if not sources:
            raise ValueError("the emulator binding loads CUDA sources, not a cubin")
        return compile_emulation(list(sources))

    def function(self, module, name: str):
        fn = getattr(module, f"so_launch_{name}")
        fn.restype = None
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint)]
        return fn

    def alloc(self, nbytes: int) -> DeviceBuffer:
        mem = np.empty(nbytes, np.uint8)
        return DeviceBuffer(mem.ctypes.data, nbytes, mem)

    def upload(self, dst: DeviceBuffer, host_ptr: int, nbytes: int) -> None:
        ctypes.memmove(dst.ptr, host_ptr, nbytes)

    def download(self, host_ptr: int, src: DeviceBuffer, nbytes: int) -> None:
        ctypes.memmove(host_ptr, src.ptr, nbytes)

    def launch(self, fn, grid, block, shared: int, args: Sequence[DeviceBuffer]) -> None:
        ptrs = (ctypes.c_void_p * len(args))(*[b.ptr for b in args])
        dims = (ctypes.c_uint * 6)(*grid, *block)
        fn(ptrs, dims)

    def synchronize(self) -> None:
        pass

    def event_pair_ms(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def open_binding() -> EmulatorBinding:
    return EmulatorBinding()
