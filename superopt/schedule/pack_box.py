"""The box that ``PackAt(stage, T, at)`` packs at each iteration of loop ``at``, and its legality.

Per axis of ``T``'s packed layout, the stage reads ``T`` at ``lin``, an affine function of the stage's loops (the
split axis of the layout: ``lin // factor`` and ``lin % factor``, which must split exactly over the loops, as in
``j_o`` and ``j_i`` of a split loop). ``origin`` is ``lin`` with the loops inside ``at`` at 0, ``local`` the rest;
the box spans ``local`` over those loops' extents. The copy takes each axis from ``origin`` for ``count``
elements: the box's extent, cut where the packed layout (or, along the split axis, the source) ends; the rest of
the box is zeros, as in the whole packed copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.ir.expr import Affine, box_split, exact_divmod
from superopt.schedule.kernel_plan import KernelPlan, ScheduleError, Stage


@dataclass(frozen=True)
class PackBox:
    tensor: str
    at: str
    shape: tuple[int, ...]  # per packed axis
    origin: tuple[Affine, ...]  # per packed axis: over the loops outside ``at`` (div/mod atoms of fused ones too)
    local: tuple[Affine, ...]  # per packed axis: the index into the box, over the loops inside ``at``
    cut: tuple[bool, ...]  # per packed axis: whether some box runs past where the data ends (a count, not a constant)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def pack_box(plan: KernelPlan, s: Stage, tensor: str, at: str) -> PackBox:
    """The box of ``tensor`` that ``PackAt(s, tensor, at)`` packs; ScheduleError where it cannot be packed there."""
    prim = f"PackAt({s.name}, {tensor}, {at})"
    lay = plan.packs.get(tensor)
    why = None
    names = [lp.name for lp in s.loops]
    if plan.target.kind != "cpu":
        why = "boxes are packed in a CPU thread's own buffer"
    elif lay is None or tensor not in plan.compute.inputs:
        why = f"{tensor!r} is not a packed kernel input (a Pack record lays it out)"
    elif s.attach is not None or s.epilogue_of is not None or s.reduce_epilogue_of is not None:
        why = "only a root stage packs its inputs"
    elif any(o is not s and tensor in o.stmt.inputs() for o in plan.stages.values()):
        why = f"another stage reads {tensor!r} too (it would read the unpacked input as if packed)"
    elif any(p.tensor == tensor for p in s.prefetches):
        why = f"{tensor!r} is prefetched (at its packed offsets)"
    elif at not in names:
        why = f"no loop {at!r} (loops: {names})"
    if why:
        raise ScheduleError(f"{prim}: {why}")
    k = names.index(at)
    if any(lp.vector or lp.unroll for lp in s.loops[: k + 1]):
        why = "the copy would sit in a vectorized or unrolled loop"
    indices = {a.index for a in s.stmt.expr.accesses() if a.tensor == tensor}
    if not why and len(indices) != 1:
        why = f"{s.name} reads {tensor!r} at several indices"
    if why:
        raise ScheduleError(f"{prim}: {why}")
    (index,) = indices
    extents = {lp.name: lp.extent for lp in s.loops}
    inner = set(names[k + 1:])
    lins = [ix.substitute({d: s.dims[d] for d in ix.vars()}).simplify() for ix in index]
    parts: list[Affine] = []
    for part in lay.map_index(lins):
        if isinstance(part, tuple):
            kind, lin, f = part
            q, r = exact_divmod(lin, f, extents)
            if q is None or r is None:
                raise ScheduleError(f"{prim}: the split axis (by {f}) is not read as a loop's blocks and their "
                                    "elements")
            part = q if kind == "div" else r
        parts.append(part)
    shape, origin, local, cut = [], [], [], []
    packed = lay.shape
    for axis, (lin, n) in enumerate(zip(parts, packed)):
        org, loc, span = box_split(lin, inner, extents)
        olo, ohi = org.bounds(extents)
        if olo < 0:
            raise ScheduleError(f"{prim}: the box would start before the packed layout's axis {axis}")
        shape.append(span)
        origin.append(org)
        local.append(loc)
        cut.append(ohi + span > n)
    if lay.split_axis >= 0:
        a = lay.split_axis + 1  # (the split's inner part; its outer part, the panel, is packed axis 0)
        if shape[0] != 1:
            raise ScheduleError(f"{prim}: the box spans {shape[0]} panels of the split axis (one panel a box)")
        src = lay.src_shape[lay.perm[lay.split_axis]]
        cut[a] = cut[a] or packed[0] * lay.factor != src  # (the last panel is cut where the source ends)
    return PackBox(tensor, at, tuple(shape), tuple(origin), tuple(local), tuple(cut))


def check_pack_boxes(plan: KernelPlan) -> None:
    """Legality of every PackAt of the plan (each input packed in one loop)."""
    for s in plan.stages.values():
        for tensor, at in s.pack_at.items():
            pack_box(plan, s, tensor, at)
