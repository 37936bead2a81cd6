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
  indices).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from superopt.schedule.primitives import GPU_AXES

if TYPE_CHECKING:
    from superopt.schedule.plan import KernelPlan

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
    from superopt.loopnest.shared_copies import check_shared
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
