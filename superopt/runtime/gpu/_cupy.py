"""The GPU binding over CuPy: ``cupy.cuda.function.Module`` for cubins, CuPy's allocator and events."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from superopt.runtime.gpu._spec import spec_from
from superopt.runtime.gpu.device import DeviceBuffer
from superopt.target import GpuSpec

# cudaDeviceProp fields for the driver attribute names of _spec.ATTRIBUTES
_PROPS = {"MULTIPROCESSOR_COUNT": "multiProcessorCount", "COMPUTE_CAPABILITY_MAJOR": "major",
          "COMPUTE_CAPABILITY_MINOR": "minor", "MAX_SHARED_MEMORY_PER_BLOCK": "sharedMemPerBlock",
          "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": "sharedMemPerBlockOptin",
          "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": "sharedMemPerMultiprocessor",
          "MAX_THREADS_PER_BLOCK": "maxThreadsPerBlock", "MAX_THREADS_PER_MULTIPROCESSOR": "maxThreadsPerMultiProcessor",
          "MAX_REGISTERS_PER_BLOCK": "regsPerBlock", "MAX_REGISTERS_PER_MULTIPROCESSOR": "regsPerMultiprocessor",
          "WARP_SIZE": "warpSize"}


class CupyBinding:
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        cupy.cuda.Device(0).use()

    def spec(self) -> GpuSpec:
        p = self.cp.cuda.runtime.getDeviceProperties(0)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])

        try:  # the runtime's attributes by name ('MaxSharedMemoryPerBlockOptin'...), matched case-blind
            attrs = {str(n).replace("_", "").lower(): v for n, v in self.cp.cuda.Device(0).attributes.items()}
        except Exception:  # noqa: BLE001 (older CuPy: the properties below)
            attrs = {}

        def attr(k: str) -> int:
            key = k.replace("_", "").lower()
            if key in attrs:
                return int(attrs[key])
            if k in _PROPS:
                return int(p[_PROPS[k]])
            axis = "XYZ".index(k[-1])
            return int(p["maxThreadsDim" if "BLOCK" in k else "maxGridSize"][axis])

        return spec_from(name, int(p["totalGlobalMem"]), attr)

    def load(self, image: bytes, sources=None):
        mod = self.cp.cuda.function.Module()
        mod.load(image)
        return mod

    def function(self, module, name: str):
        return module.get_function(name)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        mem = self.cp.cuda.alloc(nbytes)
        return DeviceBuffer(int(mem.ptr), nbytes, mem)

    def upload(self, dst: DeviceBuffer, host_ptr: int, nbytes: int) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpy(dst.ptr, host_ptr, nbytes, rt.memcpyHostToDevice)

    def download(self, host_ptr: int, src: DeviceBuffer, nbytes: int) -> None:
        rt = self.cp.cuda.runtime
        rt.memcpy(host_ptr, src.ptr, nbytes, rt.memcpyDeviceToHost)

    def launch(self, fn, grid, block, shared: int, args: Sequence[DeviceBuffer]) -> None:
        mp = self.cp.cuda.MemoryPointer
        fn(tuple(grid), tuple(block), tuple(b.owner if isinstance(b.owner, mp) else np.uint64(b.ptr) for b in args),
           shared_mem=shared)

    def synchronize(self) -> None:
        self.cp.cuda.Device(0).synchronize()

    def event_pair_ms(self, fn: Callable[[], None]) -> float:
        a, b = self.cp.cuda.Event(), self.cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        return float(self.cp.cuda.get_elapsed_time(a, b))


def open_binding() -> CupyBinding:
    return CupyBinding()
