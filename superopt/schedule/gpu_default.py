"""GPU sketches and the default GPU schedule: loops bound to blocks and threads, reductions per thread.

Sketches (most aggressive first; the first that lowers legally is the default):

- ``gpu-rowwise``: a row-wise op (softmax, layer/RMS norm: an elementwise final stage over row reductions):
  one row per block, the row's elements over the block's threads (``threads``); each reduction computed
  at the row loop, its last reduction dim spread over the same threads and all-reduced with warp shuffles
  (and shared memory across warps); elementwise temporaries inlined (recomputed, never stored).

- ``gpu-tiled``: a two-operand contraction (``O[...] += A[...] * B[...]``) as an SSSRRSRS-like
  multi-level tiling. The output dims are fused into a column loop N (a suffix of the output dims,
  contiguous in memory) and a row loop M (the rest); each is split into block x register x thread
  (``n = n_blk*(Tn*Rn) + n_reg*Tn + n_thr``: the threads of a warp touch consecutive columns, so loads of
  the column operand and stores coalesce). Loop order: blocks (``block_y``, ``block_x``), threads
  (``thread_y``, ``thread_x``), the reductions, then the Rm x Rn register tile (CacheWrite, unrolled).
  Elementwise consumers reading the contraction at its own index run at the tile's write-back (Epilogue).
- ``gpu-simple``: every stage with its output dims fused and split into blocks of ``threads`` threads,
  its reductions serial per thread (a scalar accumulator).

Knobs (named ``<stage>.<role>`` as on the CPU): ``tm``, ``tn`` (threads), ``rm``, ``rn`` (register tile),
``blocked`` (a thread's register tile is r adjacent elements instead of every t-th: its loads can merge into
float4s, the kernel's pointers being 16-byte aligned), ``pack_rows`` (with ``blocked``: the operand read along
the row loop packed with that dim innermost, on the device, so its loads merge too), ``k_unroll`` (the
innermost reduction split and unrolled), ``shared`` (both operands staged in shared memory per block and
``k_unroll`` reduction steps: CacheRead; legal when no thread loop has a tail and nothing is fused),
``n_min`` (how many columns the column loop gathers), ``threads`` (gpu-simple). Elementwise temporaries
are inlined into their consumers (never stored), except padded copies that feed a window.
"""

from __future__ import annotations

from superopt.ir.compute import Compute
from superopt.ir.expr import product_accesses
from superopt.ir.statement import Statement
from superopt.schedule.elementwise import inlinable
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import (
    Bind,
    CacheRead,
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    Pack,
    Primitive,
    Reorder,
    Split,
    Unroll,
)
from superopt.target import Target

GPU_ROWWISE, GPU_TILED, GPU_SIMPLE = "gpu-rowwise", "gpu-tiled", "gpu-simple"


def gpu_sketch_names(compute: Compute, target: Target) -> list[str]:
    """The GPU sketches that apply to ``compute``, most aggressive first."""
    tiled = any(st.reduce == "+=" and len(set(product_accesses(st.expr) or [])) == 2 and st.out_dims
                for st in compute.statements)
    stmts = list(compute.statements)
    final = stmts[-1]
    temps = [st for st in stmts if st.out not in compute.outputs]
    rowwise = (len(compute.outputs) == 1 and final.reduce == "=" and len(final.out_dims) >= 2 and not tiled
               and any(t.reduce != "=" for t in temps))
    return ([GPU_ROWWISE] if rowwise else []) + ([GPU_TILED] if tiled else []) + [GPU_SIMPLE]


def rowwise_gpu_schedule(compute: Compute, target: Target, knobs: KnobRecorder | None = None) -> list[Primitive]:
    """A row per block (softmax, norms): the final elementwise stage's row dims over blocks, its last dim over
    the block's threads; each row reduction computed at the row loop with its last reduction dim over the same
    threads and all-reduced (warp shuffles), elementwise temporaries inlined."""
    kn = knobs or KnobRecorder()
    stmts = list(compute.statements)
    final = stmts[-1]
    f, ext = final.out, dict(final.extent)
    rows, last = list(final.out_dims[:-1]), final.out_dims[-1]
    cap = target.gpu.max_threads_per_block if target.gpu else 1024
    ylimit = target.gpu.max_grid_dims[1] if target.gpu else 65535
    threads = min(cap, kn.get(f"{f}.threads", min(256, max(32, _pow2_at_least(ext[last], 1024))),
                              (32, 64, 128, 256, 512, 1024)))
    trace: list[Primitive] = []
    for st in stmts[:-1]:
        if st.out in compute.outputs:
            raise ValueError("a temporary is also an output")
        if st.reduce == "=":
            if st.padding:
                raise ValueError("a padded copy")
            trace.append(Inline(st.out))
            continue
        trace.append(ComputeAt(st.out, f, rows[-1]))
        rd = st.reduce_dims[-1]
        if st.extent[rd] > 1:
            order = [d for d, _ in st.extents if d != rd] + [rd]
            trace += [Reorder(st.out, tuple(order))]
            if st.extent[rd] > threads:
                trace += [Split(st.out, rd, threads), Bind(st.out, f"{rd}_i", "thread_x")]
            else:
                trace.append(Bind(st.out, rd, "thread_x"))
    prims: list[Primitive] = []
    if ext[last] > threads:
        prims += [Split(f, last, threads), Reorder(f, (*rows, f"{last}_o", f"{last}_i")), Bind(f, f"{last}_i", "thread_x")]
    else:
        prims.append(Bind(f, last, "thread_x"))
    axes = ["block_x", "block_y", "block_z"]
    for d in reversed(rows):  # the innermost row dims over blocks; the rest loop in each block
        axis = next((a for a in axes if ext[d] <= (2**31 - 1 if a == "block_x" else ylimit)), None)
        if axis is None:
            break
        axes.remove(axis)
        prims.append(Bind(f, d, axis))
    return trace + prims


def _pow2_at_least(n: int, cap: int) -> int:
    p = 1
    while p < n and p < cap:
        p *= 2
    return p


def _outer_blocks(s: str, dims: list[str], ext: dict[str, int], free_axes: list[str], gpu_limit: int
                  ) -> tuple[list[Primitive], list[str], list[str], list[Primitive]]:
    """Bind untouched outer output dims (outer first) to the free block axes (innermost dim on the first free
    axis), fusing adjacent pairs when there are more dims than axes; what is left runs serially, outermost.
    Returns (fuse prims, serial loops, block loops in order, bind prims)."""
    loops = [(d, ext[d]) for d in dims]
    prims: list[Primitive] = []
    i = 0
    while len(loops) > len(free_axes) and i + 1 < len(loops):  # fuse pairs of plain dims (a fused loop is never refused)
        (a, na), (b, nb) = loops[i], loops[i + 1]
        prims.append(Fuse(s, a, b))
        loops[i:i + 2] = [(f"{a}_{b}", na * nb)]
        i += 1
    serial: list[str] = []
    blocks: list[str] = []
    binds: list[Primitive] = []
    axes = list(free_axes)
    for name, n in reversed(loops):
        axis = next((a for a in axes if n <= (2**31 - 1 if a == "block_x" else gpu_limit)), None)
        if axis is None or n == 1:
            serial.insert(0, name)
            continue
        axes.remove(axis)
        blocks.insert(0, name)
        binds.append(Bind(s, name, axis))
    return prims, serial, blocks, binds


def simple_gpu_schedule(st: Statement, target: Target, knobs: KnobRecorder | None = None) -> list[Primitive]:
    """The innermost output dims over the threads of a block (x, then y), the rest over blocks; reductions
    serial in each thread."""
    kn = knobs or KnobRecorder()
    s, ext = st.out, dict(st.extent)
    dims = list(st.out_dims)
    prims: list[Primitive] = [Reorder(s, tuple(dims + list(st.reduce_dims)))] if st.reduce_dims else []
    if not dims:
        return prims  # a scalar: one thread
    cap = target.gpu.max_threads_per_block if target.gpu else 1024
    ylimit = target.gpu.max_grid_dims[1] if target.gpu else 65535
    threads = min(cap, kn.get(f"{s}.threads", 256, (32, 64, 128, 256, 512, 1024)))
    thread_loops: list[tuple[str, str]] = []
    block_parts: list[str] = []  # outer parts of split dims, innermost first
    splits: list[Primitive] = []
    budget = threads
    used = 0
    for d, axis in zip(reversed(dims), ("thread_x", "thread_y")):
        if budget < 2 or (axis == "thread_y" and ext[dims[-1]] >= threads):
            break
        used += 1
        if ext[d] > budget:
            splits.append(Split(s, d, budget))
            thread_loops.append((f"{d}_i", axis))
            block_parts.append(f"{d}_o")
            break
        thread_loops.append((d, axis))
        budget //= _pow2_at_least(ext[d], budget)
    rest = dims[:len(dims) - used]
    free = [a for a in ("block_x", "block_y", "block_z")][len(block_parts):]
    fprims, serial, blocks, binds = _outer_blocks(s, rest, ext, free, ylimit)
    binds += [Bind(s, b, ax) for b, ax in zip(block_parts, ("block_x", "block_y"))]
    order = serial + blocks + list(reversed(block_parts)) + [t for t, _ in reversed(thread_loops)] + list(st.reduce_dims)
    return prims + fprims + splits + [Reorder(s, tuple(order))] + binds + [Bind(s, t, a) for t, a in thread_loops]


def tiled_gpu_schedule(st: Statement, target: Target, knobs: KnobRecorder | None = None,
                       inputs: tuple[str, ...] = ()) -> list[Primitive]:
    """Blocks x threads x register tile for a two-operand contraction (see the module docstring)."""
    kn = knobs or KnobRecorder()
    s, ext = st.out, dict(st.extent)
    accs = product_accesses(st.expr)
    if st.reduce != "+=" or not accs or len(set(accs)) != 2 or not st.reduce_dims or not st.out_dims:
        raise ValueError("not a two-operand contraction")
    out = list(st.out_dims)
    ylimit = target.gpu.max_grid_dims[1] if target.gpu else 65535
    prims: list[Primitive] = [Reorder(s, tuple(out + list(st.reduce_dims)))]
    # the column loop N: the last output dim, fused with the one before when narrow (capsule's q: 4)
    n_min = kn.get(f"{s}.n_min", 16, (8, 16, 32, 64))
    groups: list[tuple[str, int, int]] = []  # (loop, extent, extent of its inner fused dim or 1)
    k = len(out)
    for _ in range(2):  # N, then M
        if k == 0:
            break
        d = out[k - 1]
        if ext[d] < n_min and k >= 2 and ext[out[k - 2]] > 1:
            prims.append(Fuse(s, out[k - 2], d))
            groups.append((f"{out[k - 2]}_{d}", ext[out[k - 2]] * ext[d], ext[d]))
            k -= 2
        else:
            groups.append((d, ext[d], 1))
            k -= 1
    rest = out[:k]
    (n_loop, n_ext, n_unit), m = groups[0], (groups[1] if len(groups) > 1 else None)
    m_ext = m[1] if m else 1
    # a large plain GEMM (both sides >= 1024, plain dims): 128 x 128 per block, 8 x 8 per thread, float4 loads
    # (the layout with the fewest loads per FMA in nvcc's PTX; not yet measured on a GPU); else smaller tiles
    big = n_ext >= 1024 and m_ext >= 1024 and n_unit == 1 and m is not None and m[2] == 1
    tn = kn.get(f"{s}.tn", 16 if big else min(32, _pow2_at_least(n_ext, 32)), (4, 8, 16, 32, 64))
    rn = kn.get(f"{s}.rn", 8 if big else 4 if n_ext >= 4 * tn else 1, (1, 2, 4, 8))
    tm = kn.get(f"{s}.tm", 16 if big else min(8, _pow2_at_least(m_ext, 8)), (1, 2, 4, 8, 16, 32))
    rm = kn.get(f"{s}.rm", 8 if big else 4 if m_ext >= 4 * tm else 1, (1, 2, 4, 8))
    blocked = kn.get(f"{s}.blocked", big, (False, True))
    blocks: list[tuple[str, str]] = []
    threads: list[str] = []
    regs: list[str] = []
    binds: list[Primitive] = []
    for loop, n, unit, t, r, ax in ((*(m or (None, 1, 1)), tm, rm, "y"), (n_loop, n_ext, n_unit, tn, rn, "x")):
        if loop is None:
            continue
        t = min(t, n)
        if unit > 1:  # a fused loop splits by multiples of its inner dim's extent
            t = max(unit, t // unit * unit)
        r = max(1, min(r, n // t))
        if n > t * r:
            prims.append(Split(s, loop, t * r))
            blocks.append((f"{loop}_o", f"block_{ax}"))
            inner = f"{loop}_i"
        else:
            inner = loop
            r = 1 if n <= t else r
        if r > 1 and n > t and blocked and not unit > 1:
            prims.append(Split(s, inner, r))  # each thread owns r adjacent elements: loads of 4 merge into a float4
            regs.append(f"{inner}_i")
            inner = f"{inner}_o"
        elif r > 1 and n > t:
            prims.append(Split(s, inner, t))  # element reg*t + thread: a warp touches consecutive elements
            regs.append(f"{inner}_o")
            inner = f"{inner}_i"
        threads.append(inner)
        binds.append(Bind(s, inner, f"thread_{ax}"))
    binds += [Bind(s, b, a) for b, a in blocks]
    free = [a for a in ("block_x", "block_y", "block_z") if a not in {a for _, a in blocks}]
    fprims, serial, outer_blocks, obinds = _outer_blocks(s, rest, ext, free, ylimit)
    red = list(st.reduce_dims)
    unroll = []
    rd = red[-1]
    k_unroll = kn.get(f"{s}.k_unroll", 1, (1, 2, 4, 8)) if ext[rd] >= 8 else 1
    shared = kn.get(f"{s}.shared", False, (False, True)) and len(red) == 1 and ext[rd] >= 16
    if shared and k_unroll == 1:
        k_unroll = 8  # a box of 8 reduction steps per copy (two barriers per copy)
    if k_unroll > 1:  # the innermost reduction unrolled: loads of several steps in flight at once
        prims.append(Split(s, rd, k_unroll))
        red = red[:-1] + [f"{rd}_o", f"{rd}_i"]
        unroll.append(Unroll(s, f"{rd}_i"))
    order = serial + outer_blocks + [b for b, _ in blocks] + threads + red + regs
    prims += fprims + [Reorder(s, tuple(order)), CacheWrite(s, red[0])]
    if shared:  # both operands staged in shared memory, a box per block and k_unroll reduction steps
        staged = sorted({a.tensor for a in accs if a.tensor in inputs})
        return prims + [Unroll(s, r) for r in regs] + unroll + binds + obinds + [CacheRead(s, t, red[0]) for t in staged]
    return (prims + [Unroll(s, r) for r in regs] + unroll + binds + obinds
            + _pack_rows(st, inputs, m, blocked, kn))


def _pack_rows(st: Statement, inputs: tuple[str, ...], m: tuple[str, int, int] | None, blocked: bool,
               kn: KnobRecorder) -> list[Primitive]:
    """With a blocked tile, the operand read along the row dim M (a plain dim of one input, e.g. sgemm's A[i,k])
    packed with M innermost: a thread's rm rows are then adjacent (float4 loads) instead of a row stride apart."""
    if m is None or not blocked or m[2] != 1:
        return []
    row = m[0]
    readers = [a for a in product_accesses(st.expr) or [] if any(row in ix.dims for ix in a.index)]
    if len(readers) != 1 or readers[0].tensor not in inputs:
        return []
    a = readers[0]
    axes = [ix.dims[0] if ix.is_plain_dim else None for ix in a.index]
    if None in axes or axes.count(row) != 1 or axes[-1] == row:
        return []
    perm = tuple(i for i, d in enumerate(axes) if d != row) + (axes.index(row),)
    return [Pack(a.tensor, perm)] if kn.get(f"{st.out}.pack_rows", True, (True, False)) else []


def build_gpu_sketch(compute: Compute, target: Target, consts: frozenset[str], sketch: str,
                     knobs: KnobRecorder | None = None) -> list[Primitive]:
    """The trace of GPU ``sketch`` with ``knobs`` (the heuristic's values where not overridden)."""
    if target.kind != "cuda":
        raise ValueError(f"GPU sketch {sketch!r} on a {target.kind!r} target")
    kn = knobs or KnobRecorder()
    if sketch == GPU_ROWWISE:
        return rowwise_gpu_schedule(compute, target, kn)
    stmts = list(compute.statements)
    trace: list[Primitive] = []
    inlined: set[str] = set()
    reads: dict[str, set[str]] = {}
    tiled: set[str] = set()
    for st in stmts:
        reads[st.out] = set().union(*(reads[i] if i in inlined else {i} for i in st.inputs()))
        if inlinable(st, stmts, compute.outputs):
            trace.append(Inline(st.out))
            inlined.add(st.out)
            continue
        if sketch == GPU_TILED and st.reduce == "+=":
            try:
                trace += tiled_gpu_schedule(st, target, kn, tuple(compute.inputs))
                tiled.add(st.out)
                continue
            except ValueError:
                pass
        producers = sorted(reads[st.out] & tiled)
        if sketch == GPU_TILED and st.reduce == "=" and len(producers) == 1:
            trace.append(Epilogue(st.out, producers[0]))
            continue
        trace += simple_gpu_schedule(st, target, kn)
    return trace


def gpu_default_schedule(compute: Compute, target: Target, constant_inputs: frozenset[str] | None = None
                         ) -> list[Primitive]:
    """The first GPU sketch that lowers legally on ``target`` (a ``kind='cuda'`` target)."""
    from superopt.schedule.plan import ScheduleError, lower

    consts = frozenset(compute.inputs) if constant_inputs is None else constant_inputs
    errors = []
    for sketch in gpu_sketch_names(compute, target):
        try:
            trace = build_gpu_sketch(compute, target, consts, sketch)
            lower(compute, trace, target)
            return trace
        except (ScheduleError, ValueError, KeyError) as e:
            errors.append(f"{sketch}: {e}")
    raise ScheduleError(f"no GPU sketch fits: {'; '.join(errors)}")
