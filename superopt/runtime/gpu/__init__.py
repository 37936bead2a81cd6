"""The GPU runtime: nvcc compilation, a device behind pycuda / cuda-bindings / CuPy, kernels, emulation.

``require_gpu()`` is what a caller asking for ``target="cuda"`` calls first: it returns the
:class:`GpuDevice` (``.target`` is the device's Target, ``.binding`` the binding used) or raises
:class:`GpuUnavailable` with one line naming the missing piece.
"""

from superopt.runtime.gpu.device import BINDINGS, DeviceBuffer, GpuDevice, GpuUnavailable, gpu_status, require_gpu

__all__ = ["BINDINGS", "DeviceBuffer", "GpuDevice", "GpuUnavailable", "gpu_status", "require_gpu"]
