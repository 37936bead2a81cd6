"""Shared-memory staging (``CacheRead``) of a CUDA loop nest: the box each copy covers, its legality, and
the step that puts the copies into the tree built by :func:`superopt.loopnest.build_loopnest`.

For ``CacheRead(stage, T, at)`` (``at`` a reduction loop of a root stage, every thread loop enclosing it):
per axis of ``T`` the stage reads ``T`` at ``lin`` (an affine function of loop variables); ``origin`` is
``lin`` with the variables of the loops inside ``at`` and of the thread loops set to 0, and the box spans the
rest (``lin - origin`` over those loops' extents). Inside ``at``, before its body: the copy and a barrier;
after its body: a barrier (the next copy overwrites the box); reads of ``T`` inside read the box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from superopt.ir.expr import Affine
from superopt.loopnest import (
    Accumulate,
    Assign,
    BufferAccess,
    Epilogue,
    FlatIndex,
    Guard,
    Load,
    Loop,
    LoopNest,
    Op,
    Scope,
    StageNest,
)
from superopt.loopnest.gpu import Barrier, SharedLoad

if TYPE_CHECKING:
    from superopt.schedule.plan import KernelPlan, Stage


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
        org = lin.substitute({v: Affine.of({}, 0) for v in lin.vars() & inner}).simplify()
        loc = (lin + org.scale(-1)).simplify()
        lo, hi = loc.bounds(extents)
        org, loc = (org + Affine.of({}, lo)).simplify(), (loc + Affine.of({}, -lo)).simplify()
        glo, ghi = lin.bounds(extents)
        checked = checked or glo < 0 or ghi >= n
        shape.append(hi - lo + 1)
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


def _flat(parts: tuple[Affine, ...], shape: tuple[int, ...]) -> Affine:
    out, stride = Affine.of(), 1
    for part, n in reversed(list(zip(parts, shape))):
        out = out + part.scale(stride)
        stride *= n
    return out.simplify()


def _swap_loads(value, box: SharedBox):
    if isinstance(value, Load) and isinstance(value.source, BufferAccess) and value.source.buffer == box.tensor:
        return replace(value, source=BufferAccess(box.buffer, FlatIndex(_flat(box.local, box.shape)), box.dtype))
    if isinstance(value, Op):
        return replace(value, args=tuple(_swap_loads(a, box) for a in value.args))
    return value


def _swap_node(n, box: SharedBox):
    if isinstance(n, (Assign, Accumulate)):
        return replace(n, value=_swap_loads(n.value, box))
    if isinstance(n, (Loop, Scope, StageNest)):
        return replace(n, body=tuple(_swap_node(c, box) for c in n.body))
    if isinstance(n, (Guard, Epilogue)):
        return replace(n, body=_swap_node(n.body, box))
    return n


def _stage_in(n, stage: str, boxes: list[SharedBox]):
    if isinstance(n, Loop) and n.stage == stage and any(b.at == n.var for b in boxes):
        here = [b for b in boxes if b.at == n.var]
        body = tuple(n.body)
        for b in here:
            body = tuple(_swap_node(c, b) for c in body)
        copies = tuple(SharedLoad(b.buffer, b.tensor, b.dtype, b.shape, b.origin, b.src_shape, b.checked) for b in here)
        return replace(n, body=(*copies, Barrier(), *body, Barrier()))
    if isinstance(n, (Loop, Scope, StageNest)):
        return replace(n, body=tuple(_stage_in(c, stage, boxes) for c in n.body))
    return n


def with_shared_copies(nest: LoopNest, plan: KernelPlan) -> LoopNest:
    """``nest`` with the CacheRead copies of ``plan`` in place (the nest itself when there are none)."""
    body = list(nest.body)
    for s in plan.stages.values():
        if not s.cache_reads:
            continue
        boxes = [shared_box(plan, s, t, at) for t, at in s.cache_reads]
        body = [_stage_in(st, s.name, boxes) if st.stage == s.name else st for st in body]
    return replace(nest, body=tuple(body))
