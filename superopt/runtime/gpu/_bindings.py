"""The GPU binding over NVIDIA's ``cuda-bindings`` (``cuda.bindings.driver``): the driver API, primary context."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from superopt.runtime.gpu._spec import spec_from
from superopt.runtime.gpu.device import DeviceBuffer
from superopt.target import GpuSpec


class BindingsBinding:
    name = "cuda-bindings"

    def __init__(self) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        self._ok(cu.cuInit(0))
        self.dev = self._ok(cu.cuDeviceGet(0))
        self.ctx = self._ok(cu.cuDevicePrimaryCtxRetain(self.dev))  # the context torch and CuPy use too
        self._ok(cu.cuCtxSetCurrent(self.ctx))

    def _ok(self, res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            e, name = self.cu.cuGetErrorName(err)
            ok = e == self.cu.CUresult.CUDA_SUCCESS and isinstance(name, bytes)
            raise RuntimeError(f"CUDA driver error {name.decode() if ok else err}")
        return rest[0] if len(rest) == 1 else (tuple(rest) or None)

    def spec(self) -> GpuSpec:
        cu = self.cu
        name = self._ok(cu.cuDeviceGetName(256, self.dev)).split(b"\0", 1)[0].decode()
        mem = self._ok(cu.cuDeviceTotalMem(self.dev))

        def attr(k: str) -> int:
            return self._ok(cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{k}"), self.dev))

        return spec_from(name, mem, attr)

    def load(self, image: bytes, sources=None):
        return self._ok(self.cu.cuModuleLoadData(image))

    def function(self, module, name: str):
        return self._ok(self.cu.cuModuleGetFunction(module, name.encode()))

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = self._ok(self.cu.cuMemAlloc(nbytes))
        return DeviceBuffer(int(ptr), nbytes, _Freed(self, ptr))

    def upload(self, dst: DeviceBuffer, host_ptr: int, nbytes: int) -> None:
        self._ok(self.cu.cuMemcpyHtoD(dst.ptr, host_ptr, nbytes))

    def download(self, host_ptr: int, src: DeviceBuffer, nbytes: int) -> None:
        self._ok(self.cu.cuMemcpyDtoH(host_ptr, src.ptr, nbytes))

    def launch(self, fn, grid, block, shared: int, args: Sequence[DeviceBuffer]) -> None:
        values = [np.array([b.ptr], dtype=np.uint64) for b in args]  # each parameter's bytes
        params = np.array([v.ctypes.data for v in values], dtype=np.uint64)  # void *kernelParams[]
        self._ok(self.cu.cuLaunchKernel(fn, *grid, *block, shared, 0, params.ctypes.data, 0))

    def synchronize(self) -> None:
        self._ok(self.cu.cuCtxSynchronize())

    def event_pair_ms(self, fn: Callable[[], None]) -> float:
        cu = self.cu
        a = self._ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT))
        b = self._ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT))
        self._ok(cu.cuEventRecord(a, 0))
        fn()
        self._ok(cu.cuEventRecord(b, 0))
        self._ok(cu.cuEventSynchronize(b))
        ms = self._ok(cu.cuEventElapsedTime(a, b))
        cu.cuEventDestroy(a)
        cu.cuEventDestroy(b)
        return float(ms)


class _Freed:
    """Frees the allocation when the buffer is collected."""

    def __init__(self, binding: BindingsBinding, ptr) -> None:
        self.binding, self.ptr = binding, ptr

    def __del__(self) -> None:
        try:
            self.binding.cu.cuMemFree(self.ptr)
        except Exception:
            pass


def open_binding() -> BindingsBinding:
    return BindingsBinding()
