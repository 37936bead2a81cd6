"""The GPU runtime interface: one device behind one of three Python bindings, chosen automatically.

    dev = require_gpu()              # GpuDevice, or GpuUnavailable naming the missing piece
    dev.binding                      # "pycuda" | "cuda-bindings" | "cupy"
    dev.target                       # Target(kind="cuda") read from the device
    mod = dev.load(cubin_path); fn = mod.function("k_0")
    buf = dev.alloc(nbytes); dev.upload(buf, array); dev.download(array, buf)
    dev.launch(fn, grid, block, [buf, ...]); dev.synchronize()
    dev.time_ms(lambda: ..., repeat=20)  # CUDA events around each call, median

Bindings are tried in the order of :data:`BINDINGS` (pycuda where it imports, then NVIDIA's
``cuda-bindings``, then CuPy); ``require_gpu(binding=...)`` picks one, or ``emulator``: the CPU stand-in
of ``_emulator.py`` (g++-emulated kernels, host memory) that runs this whole interface without a GPU.
Without a driver or a device the error is one line naming what is missing (``GpuUnavailable: no CUDA driver (libcuda.so.1) ...``).
"""

from __future__ import annotations

import ctypes
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from superopt.target import GpuSpec, Target, cuda_target

BINDINGS = ("pycuda", "cuda-bindings", "cupy")


class GpuUnavailable(RuntimeError):
    """No usable GPU: the message names the missing piece (driver, device, or Python binding)."""


@dataclass
class DeviceBuffer:
    """``nbytes`` of device memory at ``ptr``; ``owner`` keeps the binding's allocation alive."""

    ptr: int
    nbytes: int
    owner: Any = None


class Binding(Protocol):
    """What each binding module provides (see ``_pycuda.py``, ``_bindings.py``, ``_cupy.py``)."""

    name: str

    def spec(self) -> GpuSpec: ...
    def load(self, image: bytes, sources: Sequence | None = None) -> Any: ...
    def function(self, module: Any, name: str) -> Any: ...
    def alloc(self, nbytes: int) -> DeviceBuffer: ...
    def upload(self, dst: DeviceBuffer, host_ptr: int, nbytes: int) -> None: ...
    def download(self, host_ptr: int, src: DeviceBuffer, nbytes: int) -> None: ...
    def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shared: int,
               args: Sequence[DeviceBuffer]) -> None: ...
    def synchronize(self) -> None: ...
    def event_pair_ms(self, fn: Callable[[], None]) -> float: ...


class Module:
    def __init__(self, device: GpuDevice, handle: Any) -> None:
        self.device, self.handle = device, handle
        self._fns: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        if name not in self._fns:
            self._fns[name] = self.device.binding_impl.function(self.handle, name)
        return self._fns[name]


class GpuDevice:
    """Device 0 through one binding; every call is synchronous unless it says otherwise."""

    def __init__(self, impl: Binding) -> None:
        self.binding_impl = impl
        self.binding: str = impl.name
        self.spec: GpuSpec = impl.spec()
        self.target: Target = cuda_target(self.spec)

    @property
    def needs_cubin(self) -> bool:
        """False for the CPU emulator, which loads the CUDA sources themselves."""
        return getattr(self.binding_impl, "needs_cubin", True)

    def load(self, image: bytes | os.PathLike | str, sources: Sequence | None = None) -> Module:
        """A module from a cubin (or PTX) image; ``sources`` (CudaSource) for the emulator binding."""
        data = image if isinstance(image, bytes) else open(image, "rb").read()
        return Module(self, self.binding_impl.load(data, sources))

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return self.binding_impl.alloc(max(int(nbytes), 1))

    def upload(self, dst: DeviceBuffer, array) -> None:
        import numpy as np

        a = np.ascontiguousarray(array)
        if a.nbytes > dst.nbytes:
            raise ValueError(f"upload of {a.nbytes} bytes into a buffer of {dst.nbytes}")
        self.binding_impl.upload(dst, a.ctypes.data, a.nbytes)

    def download(self, array, src: DeviceBuffer) -> None:
        if not array.flags.c_contiguous or array.nbytes > src.nbytes:
            raise ValueError("download needs a contiguous host array no larger than the buffer")
        self.binding_impl.download(array.ctypes.data, src, array.nbytes)

    def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[DeviceBuffer],
               shared: int = 0) -> None:
        """Queue one launch (asynchronous); :meth:`synchronize` waits for it."""
        self.binding_impl.launch(fn, tuple(grid), tuple(block), shared, args)

    def synchronize(self) -> None:
        self.binding_impl.synchronize()

    def time_ms(self, fn: Callable[[], None], repeat: int = 10, warmup: int = 2) -> dict:
        """Median and minimum of ``repeat`` runs of ``fn`` (which queues launches), each between two CUDA events."""
        for _ in range(warmup):
            fn()
        self.synchronize()
        times = [self.binding_impl.event_pair_ms(fn) for _ in range(repeat)]
        return {"median_ms": statistics.median(times), "min_ms": min(times), "repeat": repeat}


def _driver_present() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpuUnavailable(f"no CUDA driver (libcuda.so.1): {e}; run on a machine with an NVIDIA GPU and its "
                             "driver") from None


def _open(name: str) -> Binding:
    if name == "pycuda":
        from superopt.runtime.gpu import _pycuda as mod
    elif name == "cuda-bindings":
        from superopt.runtime.gpu import _bindings as mod  # type: ignore[no-redef]
    elif name == "cupy":
        from superopt.runtime.gpu import _cupy as mod  # type: ignore[no-redef]
    elif name == "emulator":
        from superopt.runtime.gpu import _emulator as mod  # type: ignore[no-redef]
    else:
        raise GpuUnavailable(f"unknown GPU binding {name!r} (bindings: {', '.join(BINDINGS)})")
    return mod.open_binding()


_DEVICES: dict[str, GpuDevice] = {}  # binding name (or "auto") -> the device opened through it


def require_gpu(binding: str | None = None) -> GpuDevice:
    """The GPU (device 0) through the first binding that works, opened once per process and binding.

    ``binding`` picks one of :data:`BINDINGS` (or ``emulator``). Raises
    :class:`GpuUnavailable` with a one-line reason: no driver, no device, or no binding that imports."""
    want = binding or None
    key = want or "auto"
    if key in _DEVICES:
        return _DEVICES[key]
    if want == "emulator":  # the CPU stand-in: no driver needed (tests, dry runs)
        _DEVICES[key] = GpuDevice(_open(want))
        return _DEVICES[key]
    _driver_present()
    reasons = []
    for name in ([want] if want else BINDINGS):
        try:
            dev = GpuDevice(_open(name))
        except ImportError as e:
            reasons.append(f"{name}: not installed ({e})")
            continue
        except GpuUnavailable:
            raise
        except Exception as e:  # a binding that imports but cannot open the device
            reasons.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        _DEVICES[key] = dev
        return dev
    raise GpuUnavailable("no usable CUDA binding: " + "; ".join(reasons) + " (install pycuda, cuda-bindings or "
                         "cupy-cuda13x)")


def gpu_status() -> str:
    """One line: the device and binding, or why there is none (for reports and skip reasons)."""
    try:
        dev = require_gpu()
    except GpuUnavailable as e:
        return f"GpuUnavailable: {e}"
    return f"{dev.spec.describe()} via {dev.binding}"
