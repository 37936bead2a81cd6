"""Features of a CUDA kernel for cost models and datasets: launch shape, register tile, shared memory,
an occupancy estimate, work and traffic. Read off the plan and the printed launches (nothing re-derived
from the CUDA text). A dict of plain numbers, one per kernel (all launches of a compute together).

:func:`access_features` adds how the kernel's global-memory accesses map onto warps, from the loop nest:
for each access under a ``thread_x`` loop, its stride along that loop (0: one address per warp, a
broadcast; 1: consecutive addresses, coalesced; more: scattered), and the 32-byte sectors a warp's
request touches, summed over every execution (a DRAM/L2 transaction estimate)."""

from __future__ import annotations

import math

from superopt.codegen.cuda_emit import CudaSource
from superopt.ir.flops import flop_count
from superopt.loopnest import LoopNest, accesses
from superopt.schedule.cuda_legality import REGISTER_OVERHEAD
from superopt.schedule.kernel_plan import KernelPlan
from superopt.target import Target

GPU_FEATURE_VERSION = 1
SECTOR_BYTES = 32  # the unit of a global-memory transaction


def occupancy(threads: int, registers: int, shared_bytes: int, target: Target) -> float:
    """Resident threads per SM over the SM's maximum, from the block's threads, registers and shared memory."""
    gpu = target.gpu
    if gpu is None or threads <= 0:
        return 0.0
    warps = math.ceil(threads / gpu.warp_size) * gpu.warp_size
    limits = [gpu.max_threads_per_sm // warps, gpu.registers_per_sm // max(1, registers * warps), 32]
    if shared_bytes:
        limits.append(gpu.shared_memory_per_sm // shared_bytes)
    return min(limits) * threads / gpu.max_threads_per_sm


def gpu_features(plan: KernelPlan, source: CudaSource, target: Target) -> dict[str, float]:
    """Launch-weighted features of one compute's kernels on ``target`` (a ``kind='cuda'`` target)."""
    c = plan.compute
    flops = float(flop_count(c))
    io_bytes = sum(c.type_of[n].nbytes for n in (*c.inputs, *c.outputs))
    main = max(source.launches, key=lambda ln: math.prod(ln.grid) * ln.threads)
    tiles = [math.prod(lp.extent for lp in s.tile_loops()) for s in plan.stages.values() if s.stmt.reduce != "="]
    tile = max(tiles, default=1)
    regs = tile + REGISTER_OVERHEAD
    blocks = math.prod(main.grid)
    gpu = target.gpu
    waves = blocks / (gpu.sm_count * max(1, int(occupancy(main.threads, regs, main.shared_bytes, target)
                                                     * gpu.max_threads_per_sm / max(main.threads, 1)))) if gpu else 0.0
    return {
        "version": GPU_FEATURE_VERSION,
        "launches": len(source.launches),
        "grid_x": main.grid[0], "grid_y": main.grid[1], "grid_z": main.grid[2],
        "block_x": main.block[0], "block_y": main.block[1], "block_z": main.block[2],
        "threads_per_block": main.threads,
        "blocks": blocks,
        "total_threads": blocks * main.threads,
        "register_tile": tile,
        "registers_estimate": regs,
        "shared_bytes": main.shared_bytes,
        "occupancy": occupancy(main.threads, regs, main.shared_bytes, target),
        "waves": waves,
        "flops": flops,
        "io_bytes": float(io_bytes),
        "arithmetic_intensity": flops / max(io_bytes, 1),
        "workspace_bytes": float(sum(source.workspace)),
        "packs": len(source.pack_launches),
    }


def access_features(plan: KernelPlan, nest: LoopNest, target: Target) -> dict[str, float]:
    """Warp-level view of the global-memory accesses of ``nest`` (see the module docstring):
    ``sectors`` (32-byte sectors all warps' requests touch), ``requests`` (warp-wide loads and stores),
    the shares of requests that are coalesced, broadcast or scattered, and ``bound_outside`` (requests of
    accesses under no ``thread_x`` loop: each thread issues its own)."""
    warp = target.gpu.warp_size if target.gpu else 32
    sizes = {name: t.np_dtype.itemsize for name, t in plan.types.items()}
    sectors = requests = coalesced = broadcast = scattered = outside = 0.0
    for a in accesses(nest):
        buf = a.access.buffer
        if buf not in sizes:  # a local, shared or register buffer: not global memory
            continue
        item = sizes[buf]
        execs = math.prod(lp.extent for lp in a.loops)
        tx = next((lp for lp in a.loops if lp.kind == "thread_x"), None)
        if tx is None:
            outside += execs
            requests += execs
            sectors += execs
            continue
        lanes = min(warp, tx.extent)
        reqs = execs / lanes
        stride = a.access.stride(tx.var)
        if stride == 0:
            broadcast += reqs
            per = 1.0
        elif stride is not None and abs(stride) == 1:
            coalesced += reqs
            per = math.ceil(lanes * item / SECTOR_BYTES)
        else:
            scattered += reqs
            span = lanes * abs(stride) * item if stride is not None else lanes * SECTOR_BYTES
            per = float(min(lanes, math.ceil(span / SECTOR_BYTES)))
        requests += reqs
        sectors += reqs * per
    total = max(requests, 1.0)
    return {"sectors": sectors, "requests": requests, "coalesced_share": coalesced / total,
            "broadcast_share": broadcast / total, "scattered_share": scattered / total,
            "bound_outside": outside, "sector_bytes": sectors * SECTOR_BYTES}
