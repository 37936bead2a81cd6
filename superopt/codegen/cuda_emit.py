"""Print a :class:`~superopt.loopnest.LoopNest` as CUDA C++: the same tree the C printer walks.

Each root stage of the nest is one ``__global__`` kernel (stages need a grid-wide barrier between
them, which is a kernel boundary); a root-level fill of a partial reduction's output is a kernel of its
own as well. Every kernel of a source takes the same arguments: the nest's params (inputs, then outputs)
and then its workspace buffers, as device pointers, so one argument array serves every launch.

Loop kinds ``block_x``... ``thread_z`` print as ``const int v = blockIdx.x;`` (``threadIdx.x``...), with
the loop's tail bound as a guard; the launch's grid and block extents are the extents of those loops.
``unrolled`` loops print ``#pragma unroll``. Statements, values and indices are spelled by the C
printer's functions (:mod:`superopt.codegen.c_emit`); :data:`CUDA_PRELUDE` defines the helpers they call.

:func:`emulation_source` wraps a source in a C++ shim that runs every launch's blocks and threads as
plain loops (the kernels have no barriers or shared memory, so a sequential run is exact): gcc can then
check the CUDA text against the reference interpreter on a machine without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from superopt.codegen.c_emit import _CPrinter, c_combine, c_linear, c_ref, c_value, ctype
from superopt.ir.types import DTYPES
from superopt.loopnest import Alloc, CombineLanes, Fill, Loop, LoopNest, Node, PackNest, Scope, StageNest, build_loopnest
from superopt.loopnest.gpu import Barrier, SharedLoad, ThreadReduce
from superopt.loopnest.loop import GPU_LOOP_KINDS
from superopt.schedule.kernel_plan import KernelPlan, PackLayout

__all__ = ["CUDA_PRELUDE", "EMULATION_PRELUDE", "CudaSource", "Launch", "emit_cuda", "emulation_source", "print_cuda"]

FILL_THREADS = 256  # threads per block of the element-wise helper kernels (fills, packs)
ALIGNMENT = 16  # bytes every kernel argument is aligned to (cudaMalloc gives 256)

_BUILTIN = {"block_x": "blockIdx.x", "block_y": "blockIdx.y", "block_z": "blockIdx.z",
            "thread_x": "threadIdx.x", "thread_y": "threadIdx.y", "thread_z": "threadIdx.z"}

CUDA_PRELUDE = r"""#include <math.h>
#include <stdint.h>
#define SO_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SO_MIN(a, b) ((a) < (b) ? (a) : (b))
__device__ __forceinline__ float so_maxf(float a, float b) { return a != a ? a : (a > b ? a : b); }
__device__ __forceinline__ float so_minf(float a, float b) { return a != a ? a : (a < b ? a : b); }
__device__ __forceinline__ double so_max(double a, double b) { return a != a ? a : (a > b ? a : b); }
__device__ __forceinline__ double so_min(double a, double b) { return a != a ? a : (a < b ? a : b); }
__device__ __forceinline__ float so_expf(float x) { return expf(x); }
__device__ __forceinline__ float so_erff(float x) { return erff(x); }
__device__ __forceinline__ float so_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double so_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/* the C printer's spellings of pow with a literal exponent (c_emit._POW_BY_ROOTS); the GPU's powf is no libm call */
__device__ __forceinline__ float so_squaref(float x) { return x * x; }
__device__ __forceinline__ float so_pow_halff(float x) { return powf(x, 0.5f); }
__device__ __forceinline__ float so_pow_quarterf(float x) { return powf(x, 0.25f); }
__device__ __forceinline__ float so_pow_three_quartersf(float x) { return powf(x, 0.75f); }
__device__ __forceinline__ float so_pow_three_halvesf(float x) { return powf(x, 1.5f); }
__device__ __forceinline__ float so_pow_minus_halff(float x) { return powf(x, -0.5f); }
__device__ __forceinline__ float so_pow_minus_three_quartersf(float x) { return powf(x, -0.75f); }
__device__ __forceinline__ float so_modf(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ double so_mod(double a, double b) {
    double r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ int64_t so_modl(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ int64_t so_fmodl(int64_t a, int64_t b) { return b == 0 ? 0 : a % b; }
__device__ __forceinline__ int32_t so_shl32(int32_t a, int32_t b) { return (uint32_t)b < 32 ? (int32_t)((uint32_t)a << b) : 0; }
__device__ __forceinline__ int64_t so_shl64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? (int64_t)((uint64_t)a << b) : 0; }
__device__ __forceinline__ int32_t so_shr32(int32_t a, int32_t b) { return (uint32_t)b < 32 ? a >> b : (a < 0 ? -1 : 0); }
__device__ __forceinline__ int64_t so_shr64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? a >> b : (a < 0 ? -1 : 0); }
"""

# A C++ stand-in for the CUDA built-ins the printed kernels use, compiled with g++ (-std=c++20 -pthread) ahead
# of CUDA_PRELUDE: a launch runs its blocks one after another; a block's threads run as loops, or, when the
# launch synchronizes, as OS threads meeting at a barrier (__syncthreads; shuffles through an exchange array;
# __shared__ arrays are statics, shared by the block's threads, one block at a time).
EMULATION_PRELUDE = r"""#include <math.h>
#include <stdint.h>
#include <string.h>
#include <barrier>
#include <cmath>
#include <thread>
#include <vector>
using std::isinf;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
struct so_dim3 { unsigned x, y, z; };
static so_dim3 blockIdx, blockDim, gridDim;
static thread_local so_dim3 threadIdx;
static std::barrier<> *so_bar = nullptr;  /* a block's threads, when a launch synchronizes */
static uint64_t so_xchg[1024];
static inline void __syncthreads() { so_bar->arrive_and_wait(); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    so_xchg[t] = b;
    __syncthreads();
    const uint64_t o = so_xchg[t ^ (unsigned)lane_mask];
    __syncthreads();
    T r;
    memcpy(&r, &o, sizeof r);
    return r;
}
"""


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel<<<grid, block>>>(args...)``; ``shared_bytes``: the static shared memory
    the kernel declares (no dynamic shared memory is requested)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    barriers: bool = False  # the block's threads synchronize (__syncthreads, warp shuffles)

    @property
    def threads(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class CudaSource:
    """CUDA text of one lowered kernel: ``launches`` run in order, each with the arguments ``params``
    (inputs, outputs: name, dtype) then one buffer per ``workspace`` entry (bytes), each aligned to
    :data:`ALIGNMENT` bytes. ``packs``: input name ->
    layout; ``pack_launches``: input name -> the launch of ``NAME_pack_T(const T *src, T *dst)``."""

    name: str
    code: str  # kernels without the prelude
    launches: tuple[Launch, ...]
    params: tuple[tuple[str, str], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    workspace: tuple[int, ...]
    packs: dict[str, PackLayout]
    pack_launches: dict[str, Launch]
    arg_types: tuple[str, ...]  # C type of each kernel argument, in order (e.g. "const float *")

    def full_source(self) -> str:
        return CUDA_PRELUDE + "\n" + self.code


def _launch_dims(nodes: tuple[Node, ...]) -> tuple[tuple[int, int, int], tuple[int, int, int], bool]:
    """Grid and block extents of the loops bound in ``nodes`` (1 on unbound axes), and whether the block's
    threads synchronize. A block that all-reduces (ThreadReduce) has whole warps: x rounded up to 32 (the
    extra threads, guarded out of every loop, add the reduction's identity)."""
    ext: dict[str, int] = {}
    barriers = reduces = False

    def go(n: Node) -> None:
        nonlocal barriers, reduces
        reduces = reduces or isinstance(n, ThreadReduce)
        barriers = barriers or isinstance(n, (ThreadReduce, Barrier))
        if isinstance(n, Loop) and n.kind in GPU_LOOP_KINDS:
            ext[n.kind] = max(ext.get(n.kind, 1), n.extent)
        if isinstance(n, (StageNest, Scope, Loop)):
            for c in n.body:
                go(c)

    for n in nodes:
        go(n)
    grid = tuple(ext.get(f"block_{a}", 1) for a in "xyz")
    block = [ext.get(f"thread_{a}", 1) for a in "xyz"]
    if reduces:  # (never for shared-memory copies: their barriers sit inside the thread loops, unguarded)
        block[0] = -(-block[0] // 32) * 32
    return grid, tuple(block), barriers  # type: ignore[return-value]


class _CudaPrinter(_CPrinter):
    """The C printer's statements and values, with CUDA loops, allocations and kernel signatures."""

    def __init__(self, grid: tuple[int, int, int] = (1, 1, 1), block: tuple[int, int, int] = (1, 1, 1)) -> None:
        super().__init__()
        self.launch = {**{f"block_{a}": n for a, n in zip("xyz", grid)}, **{f"thread_{a}": n for a, n in zip("xyz", block)}}

    def thread_reduce(self, n: ThreadReduce) -> None:
        """Butterfly shuffles within each warp, then the warps' partials through shared memory."""
        ct, t = ctype(n.dtype), c_ref(n.target)
        comb = c_combine(n.op, "so_v", "{}", n.dtype)
        for text in (f"{{  /* all-reduce {t} ({n.op}) across the block's threads */",
                     f"    __shared__ {ct} so_red[32];",
                     f"    {ct} so_v = {t};",
                     "    for (int so_o = 16; so_o > 0; so_o >>= 1) "
                     f"so_v = {comb.format('__shfl_xor_sync(0xffffffffu, so_v, so_o)')};",
                     "    if (blockDim.x > 32) {",
                     "        if ((threadIdx.x & 31) == 0) so_red[threadIdx.x >> 5] = so_v;",
                     "        __syncthreads();",
                     "        so_v = so_red[0];",
                     f"        for (int so_w = 1; so_w < (int)(blockDim.x >> 5); ++so_w) so_v = {comb.format('so_red[so_w]')};",
                     "        __syncthreads();",
                     "    }",
                     f"    {t} = so_v;",
                     "}"):
            self.line(text)

    def shared_load(self, n: SharedLoad) -> None:
        """The block's threads copy the box, consecutive threads consecutive elements (coalesced)."""
        axes = [f"so_a{d}" for d in range(len(n.shape))]
        self.line(f"{{  /* {n.tensor} -> shared memory {list(n.shape)} */")
        self.ind += 1
        self.line("const int so_nt = blockDim.x * blockDim.y * blockDim.z;")
        self.line("for (int so_f = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); "
                  f"so_f < {n.size}; so_f += so_nt) {{")
        self.ind += 1
        self.line("int so_r = so_f;")
        for d in reversed(range(len(n.shape))):
            self.line(f"const int {axes[d]} = ({c_linear(n.origin[d])}) + so_r % {n.shape[d]}; so_r /= {n.shape[d]};")
        flat, stride = [], 1
        for d in reversed(range(len(n.shape))):
            flat.append(f"{stride}*{axes[d]}" if stride != 1 else axes[d])
            stride *= n.src_shape[d]
        src = f"{n.tensor}[{' + '.join(reversed(flat))}]"
        if n.checked:
            cond = " && ".join(f"{a} >= 0 && {a} < {m}" for a, m in zip(axes, n.src_shape))
            src = f"({cond}) ? {src} : ({ctype(n.dtype)})0"
        self.line(f"{n.buffer}[so_f] = {src};")
        self.ind -= 1
        self.line("}")
        self.ind -= 1
        self.line("}")

    def node(self, n: Node) -> None:
        if isinstance(n, StageNest):
            self.line(f"/* {n.text} */")
            self.nodes(n.body)
        elif isinstance(n, Fill):
            self.line(f"for (int {n.var} = 0; {n.var} < {n.size}; ++{n.var}) {n.buffer}[{n.var}] = {c_value(n.value)};")
        elif isinstance(n, ThreadReduce):
            self.thread_reduce(n)
        elif isinstance(n, SharedLoad):
            self.shared_load(n)
        elif isinstance(n, Barrier):
            self.line("__syncthreads();")
        elif isinstance(n, CombineLanes):
            t = c_ref(n.target)
            self.line(f"for (int {n.var} = 0; {n.var} < {n.lanes}; ++{n.var}) {t} = {t} {n.op} {n.source}[{n.var}];")
        else:
            super().node(n)

    def alloc(self, a: Alloc) -> None:
        ct = ctype(a.dtype)
        if a.kind == "register":
            self.line(f"{ct} {a.name} = {c_value(a.init)};")
        elif a.kind == "flag":
            self.line(f"int {a.name} = {c_value(a.init)};")
        elif a.kind == "workspace":
            raise AssertionError("workspace buffers are kernel arguments")
        else:  # a register tile or a per-thread local buffer
            self.line(f"{ct} {a.name}[{a.size}];")

    def loop(self, lp: Loop) -> None:
        bound = str(lp.extent)
        for t in lp.tail:
            bound = f"SO_MIN({bound}, {t.limit} - ({c_linear(t.offset)}))"
        v = lp.var
        if lp.kind in GPU_LOOP_KINDS:
            guarded = bool(lp.tail) or lp.extent < self.launch[lp.kind]  # a launch wider than this loop
            self.line(f"{{ const int {v} = {_BUILTIN[lp.kind]};")
            if guarded:
                self.line(f"if ({v} < {bound}) {{")
            self.ind += 1
            self.nodes(lp.body)
            self.ind -= 1
            self.line("} }" if guarded else "}")
            return
        if lp.kind == "unrolled":
            self.line("#pragma unroll")
        self.line(f"for (int {v} = 0; {v} < {bound}; ++{v}) {{")
        self.ind += 1
        self.nodes(lp.body)
        self.ind -= 1
        self.line("}")

    def signature(self, nest: LoopNest, name: str) -> str:
        return f'extern "C" __global__ void {name}({", ".join(f"{t}so_arg_{n}" for t, n in _arg_types(nest))})'

    def kernel_of(self, nest: LoopNest, name: str, nodes: tuple[Node, ...]) -> str:
        self.lines = [self.signature(nest, name) + " {"]
        self.ind = 1
        for t, n in _arg_types(nest):  # every buffer is 16-byte aligned: adjacent loads may merge into float4s
            self.line(f"{t}__restrict__ {n} = ({t})__builtin_assume_aligned(so_arg_{n}, {ALIGNMENT});")
        for sl in _shared_loads(nodes):
            self.line(f"__shared__ {ctype(sl.dtype)} {sl.buffer}[{sl.size}];")
        self.nodes(nodes)
        self.lines.append("}")
        return "\n".join(self.lines)


def _shared_loads(nodes) -> list[SharedLoad]:
    out: dict[str, SharedLoad] = {}

    def go(n) -> None:
        if isinstance(n, SharedLoad):
            out.setdefault(n.buffer, n)
        if isinstance(n, (StageNest, Scope, Loop)):
            for c in n.body:
                go(c)

    for n in nodes:
        go(n)
    return list(out.values())


def _arg_types(nest: LoopNest) -> list[tuple[str, str]]:
    """(C pointer type, name) of every kernel argument."""
    out = [(f"{'const ' if p.is_input else ''}{ctype(p.dtype)} *", p.name) for p in nest.params]
    out += [(f"{ctype(a.dtype)} *", a.name) for a in nest.workspace]
    return out


def _param_decls(nest: LoopNest) -> list[str]:
    return [f"{t}__restrict__ {n}" for t, n in _arg_types(nest)]


def _fill_kernel(nest: LoopNest, name: str, f: Fill) -> tuple[str, Launch]:
    body = (f"    const int {f.var} = blockIdx.x * {FILL_THREADS} + threadIdx.x;\n"
            f"    if ({f.var} < {f.size}) {f.buffer}[{f.var}] = {c_value(f.value)};")
    sig = f'extern "C" __global__ void {name}({", ".join(_param_decls(nest))})'
    return f"{sig} {{\n{body}\n}}", Launch(name, (math.ceil(f.size / FILL_THREADS), 1, 1), (FILL_THREADS, 1, 1))


def _pack_kernel(p: PackNest, name: str) -> tuple[str, Launch]:
    ct = ctype(p.dtype)
    total = math.prod(n for _, n in p.loops)
    lines = [f'extern "C" __global__ void {name}_pack_{p.tensor}(const {ct} *__restrict__ src, {ct} *__restrict__ dst) {{',
             f"    const int so_flat = blockIdx.x * {FILL_THREADS} + threadIdx.x;",
             f"    if (so_flat >= {total}) return;",
             "    int so_rest = so_flat;"]
    for v, n in reversed(p.loops):
        lines.append(f"    const int {v} = so_rest % {n}; so_rest /= {n};")

    def axis(ix) -> str:
        return ix if isinstance(ix, str) else f"({ix.outer} * {ix.factor} + {ix.inner})"

    flat_src = "0"
    for ix, n in zip(p.src_index, p.src_shape):
        flat_src = f"({flat_src}) * {n} + {axis(ix)}"
    if p.in_range is not None:
        ix, lim = p.in_range
        lines.append(f"    dst[so_flat] = ({axis(ix)} < {lim}) ? src[{flat_src}] : 0;")
    else:
        lines.append(f"    dst[so_flat] = src[{flat_src}];")
    lines.append("}")
    return "\n".join(lines), Launch(f"{name}_pack_{p.tensor}", (math.ceil(total / FILL_THREADS), 1, 1),
                                    (FILL_THREADS, 1, 1))


def print_cuda(nest: LoopNest, name: str = "kernel") -> tuple[str, tuple[Launch, ...], dict[str, Launch]]:
    """CUDA text of ``nest``: kernels ``NAME_0``, ``NAME_1``... (launched in that order) and pack kernels
    ``NAME_pack_T``; returns (text, launches, pack launches by input)."""
    parts: list[str] = []
    launches: list[Launch] = []

    def flush(stage: StageNest, group: list[Node]) -> None:
        if group:
            kname = f"{name}_{len(launches)}"
            grid, block, barriers = _launch_dims(tuple(group))
            parts.append(f"/* {stage.text} */\n" + _CudaPrinter(grid, block).kernel_of(nest, kname, tuple(group)))
            shared = sum(sl.size * int(np.dtype(DTYPES[sl.dtype][0]).itemsize) for sl in _shared_loads(tuple(group)))
            launches.append(Launch(kname, grid, block, shared, barriers))
            group.clear()

    for stage in nest.body:
        group: list[Node] = []
        for n in stage.body:
            if isinstance(n, Fill):  # a root-level fill must finish on every block before any accumulates
                flush(stage, group)
                text, launch = _fill_kernel(nest, f"{name}_{len(launches)}", n)
                parts.append(text)
                launches.append(launch)
            else:
                group.append(n)
        flush(stage, group)
    pack_launches = {}
    for p in nest.packs:
        text, launch = _pack_kernel(p, name)
        parts.append(text)
        pack_launches[p.tensor] = launch
    return "\n\n".join(parts) + "\n", tuple(launches), pack_launches


def emit_cuda(plan: KernelPlan | LoopNest, name: str = "kernel") -> CudaSource:
    """CUDA source of a lowered kernel (a KernelPlan is built into its loop nest first)."""
    if isinstance(plan, KernelPlan):
        from superopt.loopnest.shared_copies import with_shared_copies

        nest = with_shared_copies(build_loopnest(plan), plan)  # CacheRead copies (GPU shared memory) in place
    else:
        nest = plan
    code, launches, pack_launches = print_cuda(nest, name)
    return CudaSource(name, code, launches, tuple((p.name, p.dtype) for p in nest.params), nest.inputs, nest.outputs,
                      nest.workspace_bytes, nest.layouts, pack_launches, tuple(t for t, _ in _arg_types(nest)))


def emulation_source(sources: list[CudaSource]) -> str:
    """C++ for g++: the kernels of ``sources``; per launched kernel ``void so_launch_K(void **args, const unsigned
    *dims)`` running its blocks and threads as loops (dims: grid x, y, z then block x, y, z); per source
    ``void NAME_emulate(void **args)`` running its launches in order (args: the launch arguments), and
    ``void NAME_emulate_pack_T(const void *src, void *dst)`` per packed input."""
    out = [EMULATION_PRELUDE, CUDA_PRELUDE]
    for src in sources:
        out.append(src.code)
        lines = []
        cast = ", ".join(f"({t})args[{i}]" for i, t in enumerate(src.arg_types))
        for ln in src.launches:
            lines.append(_launcher(ln.kernel, f"{ln.kernel}({cast});", ln.barriers))
        for t, ln in src.pack_launches.items():
            ct = ctype(dict(src.params)[t])
            lines.append(_launcher(ln.kernel, f"{ln.kernel}((const {ct} *)args[0], ({ct} *)args[1]);"))
        lines.append(f'extern "C" void {src.name}_emulate(void **args) {{')
        for ln in src.launches:
            lines.append(f"    {{ const unsigned d[6] = {{{', '.join(f'{x}u' for x in (*ln.grid, *ln.block))}}}; "
                         f"so_launch_{ln.kernel}(args, d); }}")
        lines.append("}")
        for t, ln in src.pack_launches.items():
            lines.append(f'extern "C" void {src.name}_emulate_pack_{t}(const void *src, void *dst) {{')
            lines.append("    void *args[2] = {(void *)src, dst};")
            lines.append(f"    const unsigned d[6] = {{{', '.join(f'{x}u' for x in (*ln.grid, *ln.block))}}}; "
                         f"so_launch_{ln.kernel}(args, d);")
            lines.append("}")
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"


def _launcher(kernel: str, call: str, threaded: bool = False) -> str:
    head = (f'extern "C" void so_launch_{kernel}(void **args, const unsigned *d) {{\n'
            "    gridDim = so_dim3{d[0], d[1], d[2]}; blockDim = so_dim3{d[3], d[4], d[5]};\n"
            "    for (unsigned bz = 0; bz < d[2]; ++bz) for (unsigned by = 0; by < d[1]; ++by) "
            "for (unsigned bx = 0; bx < d[0]; ++bx) {\n"
            "        blockIdx = so_dim3{bx, by, bz};\n")
    threads = ("for (unsigned tz = 0; tz < d[5]; ++tz) for (unsigned ty = 0; ty < d[4]; ++ty) "
               "for (unsigned tx = 0; tx < d[3]; ++tx)")
    if not threaded:
        return head + f"        {threads} {{ threadIdx = so_dim3{{tx, ty, tz}}; {call} }}\n    }}\n}}"
    return (head + "        std::barrier<> bar(d[3] * d[4] * d[5]);\n        so_bar = &bar;\n"
            "        std::vector<std::thread> ts;\n"
            f"        {threads}\n"
            f"            ts.emplace_back([=] {{ threadIdx = so_dim3{{tx, ty, tz}}; {call} }});\n"
            "        for (auto &t : ts) t.join();\n        so_bar = nullptr;\n    }\n}")
