"""Run generated CUDA on the CPU: the kernels compiled with g++ under :data:`EMULATION_PRELUDE`, each
launch's blocks run in turn and their threads as loops (or as OS threads at a barrier when the launch
synchronizes: block all-reductions with warp shuffles). Tests check the CUDA text itself against the
reference interpreter on machines without a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from superopt.codegen.cuda_emit import CudaSource, emit_cuda, emulation_source
from superopt.ir.compute import Compute
from superopt.runtime.gpu.nvcc import default_cache_dir
from superopt.schedule.plan import lower
from superopt.schedule.primitives import Primitive
from superopt.target import Target, h200_target


class EmulationError(RuntimeError):
    """g++ rejected the emulated CUDA source (the source is attached)."""

    def __init__(self, message: str, source: str = "") -> None:
        super().__init__(message)
        self.source = source


def compile_emulation(sources: list[CudaSource], cache_dir: Path | None = None) -> ctypes.CDLL:
    """One shared library holding the emulated launches of every source (one g++ start)."""
    code = emulation_source(sources)
    cache = Path(cache_dir or default_cache_dir() / "emulation")
    cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"{hashlib.sha256(code.encode()).hexdigest()[:32]}.so"
    if not so.exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "emu.cpp"
            src.write_text(code)
            out = Path(tmp) / "emu.so"
            res = subprocess.run(["g++", "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w", str(src), "-o", str(out)],
                                 capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                raise EmulationError(f"g++ failed on emulated CUDA: {res.stderr.strip()[:3000]}", code)
            os.replace(out, so)
    return ctypes.CDLL(str(so))


class EmulatedKernel:
    """A compute's CUDA kernels run on the CPU; call with its inputs, returns its outputs."""

    def __init__(self, lib: ctypes.CDLL, source: CudaSource, compute: Compute) -> None:
        self.source, self.compute = source, compute
        self.fn = getattr(lib, f"{source.name}_emulate")
        self.fn.restype = None
        self.packs = {t: getattr(lib, f"{source.name}_emulate_pack_{t}") for t in source.pack_launches}

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        c = self.compute
        arrays = []
        for name, x in zip(c.inputs, inputs):
            a = np.ascontiguousarray(x, dtype=c.type_of[name].np_dtype)
            if name in self.packs:
                dst = np.empty(self.source.packs[name].shape, a.dtype)
                self.packs[name](ctypes.c_void_p(a.ctypes.data), ctypes.c_void_p(dst.ctypes.data))
                a = dst
            arrays.append(a)
        outs = [np.full(c.type_of[o].shape, np.nan if c.type_of[o].dtype.startswith("float") else 0,
                        c.type_of[o].np_dtype) for o in c.outputs]  # garbage-filled: every element must be written
        ws = [np.empty(max(n, 1), np.uint8) for n in self.source.workspace]
        ptrs = (ctypes.c_void_p * (len(arrays) + len(outs) + len(ws)))(*[a.ctypes.data for a in arrays + outs + ws])
        self.fn(ptrs)
        return outs


def emulate_kernels(items: Sequence[tuple[Compute, Sequence[Primitive]]], target: Target | None = None,
                    cache_dir: Path | None = None) -> list[EmulatedKernel]:
    """Lower, print as CUDA and build many kernels into one emulation library."""
    target = target or h200_target()
    sources = [emit_cuda(lower(c, tr, target), f"k{i}") for i, (c, tr) in enumerate(items)]
    lib = compile_emulation(sources, cache_dir)
    return [EmulatedKernel(lib, s, c) for s, (c, _) in zip(sources, items)]
