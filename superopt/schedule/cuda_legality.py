"""Legality of a schedule on a CUDA target: bound loops and the device's limits.

Called by :func:`superopt.schedule.plan.lower` on every plan; raises only ``ScheduleError``. On a CPU
target the only rule is that no loop is bound to a GPU axis. On a ``kind='cuda'`` target:

- a bound loop (``Bind``) is a spatial loop of a root stage, one per grid axis in a stage (each root
  stage is its own launch, so the stages of a kernel may bind the same axes differently), or a reduction
  loop bound to ``thread_x`` whose scalar accumulator the block then all-reduces (warp shuffles), in a root
  stage or in one computed at a consumer's loop (a row of softmax per block) that no thread loop encloses;
- block and grid extents stay within the device's per-axis limits, threads per block within
  ``max_threads_per_block`` and registers (tile + a fixed overhead, per thread) within the register file;
- no ``Parallel`` or ``Vectorize`` (OpenMP / SIMD have no meaning inside a CUDA thread);
- local (per-thread) buffers within ``max_local_bytes_per_thread``, tensors below 2^31 elements (int
  indices);
- every ``CacheRead`` box (the part of an input a block stages in shared memory) fits the block's shared memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from superopt.ir.expr import Affine, box_split
from superopt.schedule.primitives import GPU_AXES

if TYPE_CHECKING:
    from superopt.schedule.kernel_plan import KernelPlan, Stage

# registers a thread needs besides its accumulator tile (indices, pointers, loaded operands): an estimate
REGISTER_OVERHEAD = 32


def bound_loops(plan: KernelPlan, stage: str) -> dict[str, tuple[str, int]]:
    """Axis -> (loop name, extent) of the loops of ``stage`` bound to GPU axes."""
    return {lp.bind: (lp.name, lp.extent) for lp in plan.stages[stage].loops if lp.bind}


def threads_per_block(plan: KernelPlan, stage: str) -> int:
    return math.prod(n for axis, (_, n) in bound_loops(plan, stage).items() if axis.startswith("thread"))


def _root_of(plan: KernelPlan, s):
    while s.attach is not None:
        s = plan.stages[s.attach[0]]
    return s


def _check_block_reduction(plan: KernelPlan, s, lp, prim: str) -> None:
    """A reduction loop bound to ``thread_x``: each thread accumulates a share, then the block all-reduces
    (ThreadReduce). Every thread must reach that all-reduce, and only one scalar accumulator is combined."""
    from superopt.schedule.plan import ScheduleError

    if lp.bind != "thread_x":
        raise ScheduleError(f"{prim}: a reduction loop binds only to thread_x (a block all-reduces it)")
    if s.stmt.reduce not in ("+=", "*=", "max=", "min=") or plan.types[s.name].dtype == "bool":
        raise ScheduleError(f"{prim}: no block all-reduce for {s.stmt.reduce!r} into {plan.types[s.name].dtype} "
                            "(warp shuffles move 32/64-bit numbers)")
    at = s.acc_at
    if at is None or s.partial or s.tile_loops() or s.index_of(at) > s.index_of(lp.name):
        raise ScheduleError(f"{prim}: a reduction spread over threads needs one scalar accumulator holding the "
                            "whole reduction, above the bound loop")
    others = [x.name for x in s.loops if x.bind and x.bind.startswith("thread") and x is not lp]
    if others:
        raise ScheduleError(f"{prim}: loops {others} are bound to threads as well (the all-reduce needs the whole "
                            "block)")
    root = s
    while root.attach is not None:
        root = plan.stages[root.attach[0]]
    launch = [x for x in plan.stages.values() if x is root or _root_of(plan, x) is root]
    wide = [f"{x.name}.{lp2.name}" for x in launch for lp2 in x.loops if lp2.bind in ("thread_y", "thread_z")]
    if wide:
        raise ScheduleError(f"{prim}: loops {wide} of the same launch bind thread_y/z (the all-reduce spans "
                            "blockDim.x only)")
    if s.attach is not None:
        cons = plan.stages[s.attach[0]]
        names = [x.name for x in cons.loops]
        outer = cons.loops[: names.index(s.attach[1]) + 1] if s.attach[1] in names else []
        if any(x.bind and x.bind.startswith("thread") for x in outer):
            raise ScheduleError(f"{prim}: {cons.name}'s loops around it are bound to threads (the all-reduce needs "
                                "the whole block)")


def check_gpu_plan(plan: KernelPlan) -> None:
    from superopt.schedule.plan import ScheduleError

    gpu = plan.target.gpu if plan.target.kind == "cuda" else None
    check_shared(plan)
    for s in plan.stages.values():
        seen: dict[str, str] = {}
        for lp in s.loops:
            if not lp.bind:
                continue
            prim = f"Bind({s.name}, {lp.name}, {lp.bind})"
            if gpu is None:
                raise ScheduleError(f"{prim}: loops bind to GPU axes only on a CUDA target (target kind "
                                    f"{plan.target.kind!r})")
            if lp.bind not in GPU_AXES:
                raise ScheduleError(f"{prim}: unknown axis {lp.bind!r} (axes: {', '.join(GPU_AXES)})")
            if lp.reduce:
                _check_block_reduction(plan, s, lp, prim)
            elif s.attach is not None:
                raise ScheduleError(f"{prim}: a stage computed at another's loop runs inside one thread (only its "
                                    "reduction loop may spread over the block's threads)")
            if lp.bind in seen:
                raise ScheduleError(f"{prim}: axis {lp.bind} is already bound to loop {seen[lp.bind]!r}")
            seen[lp.bind] = lp.name
            axis = "xyz".index(lp.bind[-1])
            limit = (gpu.max_block_dims if lp.bind.startswith("thread") else gpu.max_grid_dims)[axis]
            if lp.extent > limit:
                raise ScheduleError(f"{prim}: extent {lp.extent} exceeds the device's limit of {limit} on {lp.bind}")
    if gpu is None:
        return
    for s in plan.stages.values():
        for lp in s.loops:
            if lp.parallel or lp.vector:
                what = "Parallel" if lp.parallel else "Vectorize"
                raise ScheduleError(f"{what}({s.name}, {lp.name}): not on a CUDA target (bind loops to blocks and "
                                    "threads instead)")
        threads = threads_per_block(plan, s.name)
        if threads > gpu.max_threads_per_block:
            raise ScheduleError(f"Bind({s.name}): {threads} threads per block exceed the device's "
                                f"{gpu.max_threads_per_block}")
        tile = math.prod(lp.extent for lp in s.tile_loops()) if s.stmt.reduce != "=" else 1
        regs = tile * (2 if plan.types[s.name].dtype in ("float64", "int64") else 1) + REGISTER_OVERHEAD
        if regs > gpu.max_registers_per_thread:
            raise ScheduleError(f"CacheWrite({s.name}): a tile of {tile} elements needs about {regs} registers per "
                                f"thread (the device allows {gpu.max_registers_per_thread})")
        if regs * threads > gpu.registers_per_block:
            raise ScheduleError(f"Bind({s.name}): {threads} threads x ~{regs} registers exceed the "
                                f"{gpu.registers_per_block} registers of a block")
        if s.attach is not None:
            size = math.prod(n for d, n in zip(s.stmt.out_dims, s.stmt.out_shape) if d not in s.bound)
            nbytes = size * plan.types[s.name].np_dtype.itemsize
            if nbytes > gpu.max_local_bytes_per_thread:
                raise ScheduleError(f"ComputeAt({s.name}): a per-thread buffer of {nbytes} bytes exceeds the "
                                    f"device's {gpu.max_local_bytes_per_thread} bytes of local memory per thread")
    for name, t in plan.types.items():
        if t.size >= 2**31:
            raise ScheduleError(f"tensor {name!r} has {t.size} elements: CUDA kernels index with 32-bit ints")


@dataclass(frozen=True)
class SharedBox:
    tensor: str
    at: str
    shape: tuple[int, ...]
    origin: tuple[Affine, ...]
    local: tuple[Affine, ...]  # per axis: the index into the box (over the inner and thread loops)
    checked: bool  # the box may reach past the tensor (tails): the copy checks its bounds
    dtype: str
    nbytes: int
    src_shape: tuple[int, ...]

    @property
    def buffer(self) -> str:
        return f"so_sh_{self.tensor}"


def shared_box(plan: KernelPlan, s: Stage, tensor: str, at: str) -> SharedBox:
    """The box of ``tensor`` that ``CacheRead(s, tensor, at)`` copies; ScheduleError when it cannot."""
    from superopt.schedule.plan import ScheduleError

    prim = f"CacheRead({s.name}, {tensor}, {at})"
    if plan.target.kind != "cuda":
        raise ScheduleError(f"{prim}: shared memory only on a CUDA target")
    if s.attach is not None or s.epilogue_of is not None:
        raise ScheduleError(f"{prim}: only a root stage stages its inputs in shared memory")
    if tensor not in plan.compute.inputs or tensor in plan.packs or tensor in s.stmt.pad_value:
        raise ScheduleError(f"{prim}: {tensor!r} must be an unpacked, unpadded kernel input")
    indices = {a.index for a in s.stmt.expr.accesses() if a.tensor == tensor}
    if len(indices) != 1:
        raise ScheduleError(f"{prim}: {s.name} reads {tensor!r} {'nowhere' if not indices else 'at several indices'}")
    names = [lp.name for lp in s.loops]
    k = names.index(at)
    if not s.loops[k].reduce:
        raise ScheduleError(f"{prim}: the copy sits in a reduction loop (each of its iterations reads a new box)")
    threads = [lp for lp in s.loops if lp.bind and lp.bind.startswith("thread")]
    if any(names.index(lp.name) > k for lp in threads) or any(lp.reduce for lp in threads):
        raise ScheduleError(f"{prim}: every thread loop must be a spatial loop enclosing {at!r} (all threads copy)")
    tailed = {v for e, _ in s.tails for v in e.vars()}
    if any(lp.name in tailed for lp in threads):
        raise ScheduleError(f"{prim}: a thread loop has a tail: threads past it would miss the barriers")
    inner = {lp.name for lp in s.loops[k + 1:]} | {lp.name for lp in threads}
    extents = {lp.name: lp.extent for lp in s.loops}
    shape, origin, local = [], [], []
    checked = False
    (index,) = indices
    t = plan.types[tensor]
    for ix, n in zip(index, t.shape):
        lin = ix.substitute({d: s.dims[d] for d in ix.vars()}).simplify()
        if any(not isinstance(a, str) for a, _ in lin.terms):
            raise ScheduleError(f"{prim}: {tensor!r} is indexed through a fused loop (div/mod)")
        org, loc, span = box_split(lin, inner, extents)
        glo, ghi = lin.bounds(extents)
        checked = checked or glo < 0 or ghi >= n
        shape.append(span)
        origin.append(org)
        local.append(loc)
    nbytes = math.prod(shape) * t.np_dtype.itemsize
    return SharedBox(tensor, at, tuple(shape), tuple(origin), tuple(local), checked, t.dtype, nbytes, t.shape)


def check_shared(plan: KernelPlan) -> None:
    """Legality of every CacheRead of the plan: the boxes, and their total within the block's shared memory."""
    from superopt.schedule.plan import ScheduleError

    for s in plan.stages.values():
        if not s.cache_reads:
            continue
        total = sum(shared_box(plan, s, t, at).nbytes for t, at in s.cache_reads)
        if len({t for t, _ in s.cache_reads}) != len(s.cache_reads):
            raise ScheduleError(f"CacheRead({s.name}): an input is staged twice")
        limit = plan.target.gpu.shared_memory_per_block
        if total > limit:
            raise ScheduleError(f"CacheRead({s.name}): {total} bytes of shared memory exceed the block's {limit}")
