"""The GPU binding over pycuda (the default where it imports): the primary context of device 0."""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence

import numpy as np

from superopt.runtime.gpu._spec import spec_from
from superopt.runtime.gpu.device import DeviceBuffer
from superopt.target import GpuSpec


class PycudaBinding:
    name = "pycuda"

    def __init__(self) -> None:
        import pycuda.driver as drv

        self.drv = drv
        drv.init()
        self.dev = drv.Device(0)
        self.ctx = self.dev.retain_primary_context()
        self.ctx.push()
        atexit.register(self._pop)

    def _pop(self) -> None:
        try:
            self.ctx.pop()
        except Exception:
            pass

    def spec(self) -> GpuSpec:
        A = self.drv.device_attribute

        def attr(k: str) -> int:
            return self.dev.get_attribute(getattr(A, k))

        return spec_from(self.dev.name(), self.dev.total_memory(), attr)

    def load(self, image: bytes, sources=None):
        return self.drv.module_from_buffer(image)

    def function(self, module, name: str):
        return module.get_function(name)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        mem = self.drv.mem_alloc(nbytes)
        return DeviceBuffer(int(mem), nbytes, mem)

    def upload(self, dst: DeviceBuffer, host_ptr: int, nbytes: int) -> None:
        import ctypes

        self.drv.memcpy_htod(dst.ptr, (ctypes.c_char * nbytes).from_address(host_ptr))

    def download(self, host_ptr: int, src: DeviceBuffer, nbytes: int) -> None:
        import ctypes

        self.drv.memcpy_dtoh((ctypes.c_char * nbytes).from_address(host_ptr), src.ptr)

    def launch(self, fn, grid, block, shared: int, args: Sequence[DeviceBuffer]) -> None:
        fn(*[np.uintp(b.ptr) for b in args], grid=tuple(grid), block=tuple(block), shared=shared)

    def synchronize(self) -> None:
        self.drv.Context.synchronize()

    def event_pair_ms(self, fn: Callable[[], None]) -> float:
        a, b = self.drv.Event(), self.drv.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        return float(a.time_till(b))


def open_binding() -> PycudaBinding:
    return PycudaBinding()
