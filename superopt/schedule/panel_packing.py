"""Where a contraction packs its run-time column operand: a panel at a time inside the kernel (``PackAt``), or
whole before it.

A whole packed copy of an 8 MiB operand is written out to the shared cache before the kernel starts, then read
back from there; a panel packed by the thread that reads it stays in that core's L2 between its copy and its
reads (GETT, BLIS). The default packs inside the kernel where a loop's box is a panel that fits in half the L2
(the rows of the tiles and the output share the rest) and no thread copies more than the whole operand; the
outermost such loop (the fewest, largest boxes). The knob ``<stage>.pack_at`` lets the search turn it off.
"""

from __future__ import annotations

import math

from superopt.ir.compute import Compute
from superopt.ir.expr import DivMod
from superopt.schedule.kernel_plan import KernelPlan, PackLayout, ScheduleError, Stage
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.pack_box import pack_box
from superopt.schedule.plan import lower
from superopt.schedule.primitives import Pack, PackAt, Primitive
from superopt.target import Target

PANEL_L2_SHARE = 0.5  # of the L2 a box may take


def panel_loop(plan: KernelPlan, s: Stage, tensor: str) -> tuple[str, bool] | None:
    """The loop of ``s`` whose boxes of ``tensor`` may be packed inside the kernel, and whether the default packs
    them there; or None: the outermost loop outside the accumulator whose box fits :data:`PANEL_L2_SHARE` of the
    L2, where each thread copies at most the whole packed operand over the call. Not by default where the box is
    read through a fused loop's div/mod (a panel of fused columns): 150 random contractions of seed 73 changed
    16 programs that way, 0.77-1.18x, geomean 0.99x, so it is left to the search."""
    target = plan.target
    lay = plan.packs[tensor]
    itemsize = plan.types[tensor].np_dtype.itemsize
    whole = math.prod(lay.shape)
    line = max(1, target.cache_line_bytes // itemsize)
    par = next((i for i, lp in enumerate(s.loops) if lp.parallel), None)
    stop = s.index_of(s.acc_at) if s.acc_at is not None else len(s.loops)
    for k, lp in enumerate(s.loops[:stop]):
        try:
            box = pack_box(plan, s, tensor, lp.name)
        except ScheduleError:
            continue
        if box.size * itemsize > PANEL_L2_SHARE * target.l2_bytes \
                or _rereads_lines(lay, box.shape, line, target.l2_bytes, target.cache_line_bytes):
            continue
        boxes = math.prod(x.extent for x in s.loops[: k + 1])  # (each iteration at or outside it packs a box)
        shared = par is not None and par <= k  # (at or inside the parallel loop: the threads share the boxes)
        if box.size * boxes / (target.threads if shared else 1) <= whole:
            fused = any(isinstance(a, DivMod) for loc in box.local for a, _ in loc.terms)
            return lp.name, not fused
    return None


def _rereads_lines(lay: PackLayout, shape: tuple[int, ...], line: int, l2_bytes: int, line_bytes: int) -> bool:
    """Whether boxes of ``shape`` take fewer elements of each source line than the line holds, and touch so many
    lines that they have left half the L2 before the next box reads them again (25 boxes, each one element of 154080
    source lines of a 25-element run: every line read 16 times from memory, 0.84x). Boxes of a few lines each
    read them again from the cache."""
    last = len(lay.src_shape) - 1
    axis = max(j for j, src in enumerate(lay.axis_sources) if src == last)  # (of a split one, its inner part)
    if shape[axis] >= min(lay.src_shape[last], line):
        return False
    return math.prod(shape) // shape[axis] * line_bytes > l2_bytes / 2


def with_panel_packing(compute: Compute, trace: list[Primitive], target: Target, stages: set[str],
                       consts: frozenset[str], kn: KnobRecorder) -> list[Primitive]:
    """``trace`` with a ``PackAt`` for each run-time column operand (a packed input split into panels) of the
    register-tiled ``stages`` where :func:`panel_loop` finds a loop, unless knob ``<stage>.pack_at`` is off."""
    if target.kind != "cpu":
        return trace
    panels = [p for p in trace if isinstance(p, Pack) and p.split_axis >= 0 and p.stage not in consts]
    if not panels:
        return trace
    try:
        plan = lower(compute, trace, target)
    except ScheduleError:
        return trace
    out = list(trace)
    for name in sorted(stages):
        s = plan.stages.get(name)
        if s is None:
            continue
        for p in panels:
            if p.stage not in s.stmt.inputs():
                continue
            found = panel_loop(plan, s, p.stage)
            use = kn.get(f"{name}.pack_at", found is not None and found[1],
                         (False, True) if found is not None else (False,))
            if use and found is not None:
                out.append(PackAt(name, p.stage, found[0]))
    return out
