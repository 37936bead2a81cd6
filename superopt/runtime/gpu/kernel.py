"""Compiled CUDA kernels on a device: upload inputs (packing on the device), run the launches, download.

    kernels = build_gpu_kernels([(compute, trace), ...], require_gpu())   # one nvcc start, one module
    outs = kernels[0](*inputs)                                            # numpy in, numpy out
    kernels[0].upload(*inputs); kernels[0].time()                         # CUDA-event timing of the launches
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from superopt.codegen.cuda_emit import CudaSource, emit_cuda
from superopt.ir.compute import Compute
from superopt.runtime.gpu.device import DeviceBuffer, GpuDevice, Module
from superopt.runtime.gpu.nvcc import NvccConfig, compile_cuda, translation_unit
from superopt.schedule.plan import lower
from superopt.schedule.primitives import Primitive


class GpuKernel:
    """One compute's launches on ``device``, with its device buffers allocated once (not reentrant)."""

    def __init__(self, device: GpuDevice, module: Module, source: CudaSource, compute: Compute) -> None:
        self.device, self.source, self.compute = device, source, compute
        self.fns = [(module.function(ln.kernel), ln) for ln in source.launches]
        self.pack_fns = {t: (module.function(ln.kernel), ln) for t, ln in source.pack_launches.items()}
        c = compute
        self.inputs: list[DeviceBuffer] = []
        self.raw: dict[str, DeviceBuffer] = {}
        for name in c.inputs:
            t = c.type_of[name]
            if name in source.packs:
                self.raw[name] = device.alloc(t.nbytes)
                self.inputs.append(device.alloc(int(np.prod(source.packs[name].shape)) * t.np_dtype.itemsize))
            else:
                self.inputs.append(device.alloc(t.nbytes))
        self.outputs = [device.alloc(c.type_of[o].nbytes) for o in c.outputs]
        self.workspace = [device.alloc(n) for n in source.workspace]
        self.args = self.inputs + self.outputs + self.workspace

    def upload(self, *inputs: np.ndarray) -> None:
        c = self.compute
        if len(inputs) != len(c.inputs):
            raise ValueError(f"kernel takes {len(c.inputs)} inputs, got {len(inputs)}")
        for name, buf, x in zip(c.inputs, self.inputs, inputs):
            t = c.type_of[name]
            a = np.ascontiguousarray(x, dtype=t.np_dtype)
            if a.shape != t.shape:
                raise ValueError(f"input {name!r} has shape {a.shape} but the kernel expects {t.shape}")
            if name in self.raw:
                self.device.upload(self.raw[name], a)
                self.pack(name)
            else:
                self.device.upload(buf, a)

    def pack(self, name: str) -> None:
        """Queue the re-layout of input ``name`` from its uploaded copy (asynchronous)."""
        fn, ln = self.pack_fns[name]
        self.device.launch(fn, ln.grid, ln.block, [self.raw[name], self.inputs[self.compute.inputs.index(name)]])

    def run(self, packs: tuple[str, ...] = ()) -> None:
        """Queue the launches (asynchronous), after re-packing the inputs ``packs`` (run-time inputs)."""
        for name in packs:
            self.pack(name)
        for fn, ln in self.fns:
            self.device.launch(fn, ln.grid, ln.block, self.args)  # shared memory is static (declared in the kernel)

    def download(self) -> list[np.ndarray]:
        self.device.synchronize()
        outs = []
        for o, buf in zip(self.compute.outputs, self.outputs):
            t = self.compute.type_of[o]
            a = np.empty(t.shape, t.np_dtype)
            self.device.download(a, buf)
            outs.append(a)
        return outs

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        self.upload(*inputs)
        self.run()
        return self.download()

    def time(self, repeat: int = 10, warmup: int = 2, packs: tuple[str, ...] | None = None) -> dict:
        """CUDA-event time of one run of the launches (inputs already uploaded): median and min in ms.
        ``packs``: inputs whose re-layout is timed too (None: every packed input, as if none were constant)."""
        packs = tuple(self.raw) if packs is None else packs
        return self.device.time_ms(lambda: self.run(packs), repeat, warmup)


def build_gpu_kernels(items: Sequence[tuple[Compute, Sequence[Primitive]]], device: GpuDevice,
                      config: NvccConfig | None = None) -> list[GpuKernel]:
    """Lower for ``device.target``, print as CUDA, compile all in one nvcc start, load one module."""
    target = device.target
    sources = [emit_cuda(lower(c, tr, target), f"k{i}") for i, (c, tr) in enumerate(items)]
    config = config or NvccConfig(arch=device.spec.arch)
    image = compile_cuda(translation_unit(sources), "cubin", config) if device.needs_cubin else b""
    module = device.load(image, sources)
    return [GpuKernel(device, module, s, c) for s, (c, _) in zip(sources, items)]


def build_gpu_kernels_each(items: Sequence[tuple[Compute, Sequence[Primitive]]], device: GpuDevice,
                           config: NvccConfig | None = None) -> tuple[list[GpuKernel | Exception], str | None]:
    """``build_gpu_kernels`` for all ``items`` in one nvcc start; when that fails, each item alone, so one
    kernel nvcc rejects costs only itself. Returns a kernel or the item's exception per item, and the
    batch build's error (None when the batch built)."""
    try:
        return list(build_gpu_kernels(items, device, config)), None
    except Exception as e:  # noqa: BLE001 - find the items nvcc rejects
        batch_error = f"{type(e).__name__}: {e}"
    out: list[GpuKernel | Exception] = []
    for item in items:
        try:
            out.append(build_gpu_kernels([item], device, config)[0])
        except Exception as e:  # noqa: BLE001
            out.append(e)
    return out, batch_error
