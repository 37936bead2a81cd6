"""Shared-memory staging (``CacheRead``) of a CUDA loop nest: the step that puts the copies into the tree built
by :func:`superopt.loopnest.build_loopnest`. The box each copy covers and its legality are part of the plan's
check (:mod:`superopt.schedule.cuda_legality`).

For ``CacheRead(stage, T, at)`` (``at`` a reduction loop of a root stage, every thread loop enclosing it):
per axis of ``T`` the stage reads ``T`` at ``lin`` (an affine function of loop variables); ``origin`` is
``lin`` with the variables of the loops inside ``at`` and of the thread loops set to 0, and the box spans the
rest (``lin - origin`` over those loops' extents). Inside ``at``, before its body: the copy and a barrier;
after its body: a barrier (the next copy overwrites the box); reads of ``T`` inside read the box.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from superopt.ir.expr import flat_offset
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
from superopt.schedule.cuda_legality import SharedBox, shared_box

if TYPE_CHECKING:
    from superopt.schedule.kernel_plan import KernelPlan


def _swap_loads(value, box: SharedBox):
    if isinstance(value, Load) and isinstance(value.source, BufferAccess) and value.source.buffer == box.tensor:
        return replace(value, source=BufferAccess(box.buffer, FlatIndex(flat_offset(box.local, box.shape).simplify()), box.dtype))
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
