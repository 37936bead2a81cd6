"""Build and call compiled kernels with numpy arrays."""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from superopt.codegen.c_emit import PARALLEL_FILL, PARALLEL_FOR, KernelSource, emit_c
from superopt.ir.compute import Compute
from superopt.phases import PhaseTimer, phase
from superopt.runtime.buffers import aligned_copy, aligned_empty, is_aligned
from superopt.runtime.compiler import CompilerConfig, compile_library, load_library
from superopt.schedule.plan import lower
from superopt.schedule.primitives import Primitive
from superopt.target import Target, host_target


class CompiledKernel:
    """A kernel in a loaded library. Call with the compute's inputs; returns its outputs."""

    def __init__(self, lib: ctypes.CDLL, source: KernelSource, compute: Compute) -> None:
        self.lib = lib
        self.source = source
        self.compute = compute
        self.fn = getattr(lib, source.name)
        self.fn.restype = None
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.pack_fns = {}
        for t in source.packs:
            f = getattr(lib, f"{source.name}_pack_{t}")
            f.restype = None
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            self.pack_fns[t] = f
        self.prepacked: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # scratch buffers for the kernel's stored temporaries, allocated once (a kernel is not reentrant)
        self._workspace = [aligned_empty(max(n, 1), np.uint8) for n in source.workspace]
        self._n = len(compute.inputs) + len(compute.outputs) + len(self._workspace)

    @property
    def storage(self) -> tuple[tuple[str, str, int], ...]:
        """Every buffer of the kernel as (kind, local tensor, bytes): ``workspace`` (the scratch arrays
        above, allocated once) and ``local`` (a stage's buffer on each thread's stack, per call)."""
        return self.source.storage

    def set_threads(self, n: int) -> None:
        self.lib.so_set_threads(ctypes.c_int(n))

    def pack(self, name: str, arr: np.ndarray) -> np.ndarray:
        return self.pack_into(name, arr, aligned_empty(self.source.packs[name].shape,
                                                       self.compute.type_of[name].np_dtype))

    def pack_into(self, name: str, arr: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Pack input ``name`` into ``dst`` (an array of the packed layout's shape); returns ``dst``."""
        src = np.ascontiguousarray(arr, dtype=dst.dtype)
        self.pack_fns[name](src.ctypes.data, dst.ctypes.data)
        return dst

    @property
    def pack_callers(self) -> dict[str, str]:
        """Input name -> the C function (from :func:`pack_caller_source`) that packs it with the kernels'
        calling convention: ``args[0]`` the input, ``args[1]`` the packed buffer."""
        return {t: pack_caller_name(self.source.name, t) for t in self.source.packs}

    def prepack(self, name: str, arr: np.ndarray) -> None:
        """Pack a constant input once; later calls passing this same array skip the packing."""
        self.prepacked[name] = (arr, self.pack(name, arr))

    def prepare_inputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self.compute.inputs):
            raise ValueError(f"kernel takes {len(self.compute.inputs)} inputs, got {len(inputs)}")
        out = []
        for name, x in zip(self.compute.inputs, inputs):
            t = self.compute.type_of[name]
            if tuple(np.shape(x)) != t.shape:
                raise ValueError(f"input {name!r} has shape {np.shape(x)} but the kernel expects {t.shape}")
            if name in self.pack_fns:
                pre = self.prepacked.get(name)
                out.append(pre[1] if pre is not None and pre[0] is x else self.pack(name, x))
            else:
                a = np.ascontiguousarray(x, dtype=t.np_dtype)
                # on a cache line, as the executor's buffers and constants are: a kernel timed here must take
                # the time it takes in the graph (a blocked conv's weights at numpy's 16-byte offsets split
                # every vector load over two lines)
                out.append(a if not a.nbytes or is_aligned(a) else aligned_copy(a))
        return out

    def run_raw(self, arrays: Sequence[np.ndarray]) -> None:
        """Call with already prepared inputs followed by output buffers (no checks, no copies)."""
        ptrs = (ctypes.c_void_p * self._n)(*[a.ctypes.data for a in arrays], *[w.ctypes.data for w in self._workspace])
        self.fn(ptrs)

    def __call__(self, *inputs: np.ndarray, out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        ins = self.prepare_inputs(inputs)
        outs = list(out) if out is not None else [
            aligned_empty(self.compute.type_of[o].shape, self.compute.type_of[o].np_dtype) for o in self.compute.outputs]
        self.run_raw(ins + outs)
        return outs


def kernel_name(compute: Compute, trace: Sequence[Primitive], index: int = 0) -> str:
    import hashlib

    from superopt.schedule.primitives import trace_to_json

    h = hashlib.sha256((compute.digest() + trace_to_json(trace)).encode()).hexdigest()[:12]
    return f"k{index}_{h}"


def pack_caller_name(kernel: str, tensor: str) -> str:
    return f"{kernel}_packcall_{tensor}"


def pack_caller_source(source: KernelSource) -> str:
    """For each input the kernel packs: ``void NAME_packcall_T(void **args)`` calling ``NAME_pack_T(args[0],
    args[1])``, so that a chain (runtime/chain.py) can pack a run-time input right before the kernel."""
    # (with the pack routine's prototype: the library may compile the caller in another translation unit)
    return "".join(f"void {source.name}_pack_{t}(const void *src_, void *dst_);\n"
                   f"void {pack_caller_name(source.name, t)}(void **args) {{ {source.name}_pack_{t}(args[0], args[1]); }}\n"
                   for t in source.packs)


# what one output element costs next to one iteration point: an iteration point is a lane of a vector FMA (about
# 1/32 of a cycle); an element written, with what it reads, moves 8 bytes or more through the caches (about a
# cycle). Weighted so, a layout conversion of 64 x 56 x 56 floats (200k points, all of them memory traffic)
# counts as the work it is, where by points alone it ranked with a conv of a few hundred kiloflops
WRITE_WEIGHT = 8


def kernel_work(compute: Compute) -> int:
    """Iteration points of all the compute's statements (reduction dimensions included), plus
    :data:`WRITE_WEIGHT` per element each statement writes: a measure of a kernel's time on one core that
    sees memory-bound copies as well as reductions."""
    total = 0
    for st in compute.statements:
        points = math.prod(e for _, e in st.extents)
        written = math.prod(e for d, e in st.extents if d not in st.reduce_dims)
        total += points + WRITE_WEIGHT * written
    return total


def without_parallel_regions(source: KernelSource) -> KernelSource:
    """``source`` with its OpenMP parallel loops printed as plain loops (fills keep ``omp simd``): a tiny
    kernel then pays no parallel-region fork and join (about 1-2 us with 2 threads, more than it runs)."""
    code = source.code.replace(PARALLEL_FILL, "#pragma omp simd").replace(PARALLEL_FOR + "\n", "")
    return dataclasses.replace(source, code=code)


def build_library(items: Sequence[tuple[Compute, Sequence[Primitive]]], config: CompilerConfig | None = None,
                  threads: int | None = None, target: Target | None = None,
                  extra_sources: Sequence[str] | Callable[[list[KernelSource]], list[str]] = (),
                  serial_below: int = 0, phases: PhaseTimer | None = None,
                  sources: Sequence[KernelSource] | None = None,
                  deadline: float | None = None) -> tuple[ctypes.CDLL, list[CompiledKernel]]:
    """Lower, emit and compile many kernels, plus ``extra_sources`` (C functions the caller looks up itself;
    or a function of the kernels' sources that returns them), into ONE shared library (one compiler start),
    for ``target`` (None: this machine with ``threads`` threads). A kernel whose :func:`kernel_work` is
    under ``serial_below`` is compiled without parallel regions. ``phases``: charged ``codegen`` (lower and
    print) and ``compile`` (the C compiler, the library's load); counts ``kernels_compiled``. ``sources``:
    the items' sources printed before by this function with the same arguments (nothing is lowered).
    ``deadline`` (``time.monotonic()``): the compiler stops there (``CompileDeadline``)."""
    target = target or host_target(threads or 1)
    with phase(phases, "codegen"):
        if sources is None or len(sources) != len(items):
            sources = [emit_c(lower(c, tr, target), kernel_name(c, tr, i)) for i, (c, tr) in enumerate(items)]
            sources = [without_parallel_regions(s) if kernel_work(c) < serial_below else s
                       for s, (c, _) in zip(sources, items)]
        sources = list(sources)
        extra = extra_sources(sources) if callable(extra_sources) else list(extra_sources)
    built = phases.counts.get("sources_compiled", 0) if phases is not None else 0
    path = compile_library([s.code for s in sources] + extra, config, target, phases, deadline)
    if phases is not None and phases.counts.get("sources_compiled", 0) > built:
        # (the kernels' sources and the extra ones are compiled alike: at most the kernels are counted)
        phases.add("kernels_compiled", min(len(items), phases.counts["sources_compiled"] - built))
    with phase(phases, "compile"):
        lib = load_library(path)
    kernels = [CompiledKernel(lib, s, c) for s, (c, _) in zip(sources, items)]
    if threads is not None:
        lib.so_set_threads(ctypes.c_int(threads))
    return lib, kernels


def build_kernels(items: Sequence[tuple[Compute, Sequence[Primitive]]], config: CompilerConfig | None = None,
                  threads: int | None = None, target: Target | None = None) -> list[CompiledKernel]:
    """Lower, emit and compile many kernels into ONE shared library (one compiler start), for
    ``target`` (None: this machine with ``threads`` threads)."""
    return build_library(items, config, threads, target)[1]


def build_kernel(compute: Compute, trace: Sequence[Primitive] = (), config: CompilerConfig | None = None,
                 threads: int | None = None, target: Target | None = None) -> CompiledKernel:
    return build_kernels([(compute, trace)], config, threads, target)[0]
