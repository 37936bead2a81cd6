"""Chained reductions over a contraction's result: store it once, or recompute it tile by tile per pass.

EM routing reduces the votes ``V`` of a windowed contraction twice: ``N[b,o,p] += R * V`` (folded into
``V``'s write-back by ``ReduceEpilogue``), then ``D[b,o,p] += R * (V - MU)^2`` with ``MU = N / Rs``. ``D``
reads ``MU``, computed after ``V``, so it cannot be folded into ``V``'s write-back: either ``V`` is stored
once and read again (materialize: ``|V|`` written and read, the buffer the size of ``V``), or a copy of the
contraction is computed after ``MU`` with ``D`` folded into the copy's write-back (the ``Recompute``
record: ``V``'s flops twice, tiles of ``V`` only in registers). :func:`prefer_recompute` picks by a roofline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, map_expr, product_accesses
from superopt.ir.statement import Statement
from superopt.schedule.primitives import Recompute, recompute_name

# flops a core retires per byte of DRAM traffic it gets, for the roofline choice (AVX2 FMA cores against
# one DDR channel's share): a target may state its own as extra fact "flops_per_byte"
DEFAULT_FLOPS_PER_BYTE = 16.0


def flops_per_byte(target) -> float:
    """The target's stated balance (extra fact ``flops_per_byte``), else :data:`DEFAULT_FLOPS_PER_BYTE`."""
    stated = dict(target.extra).get("flops_per_byte")
    return float(stated) if stated is not None else DEFAULT_FLOPS_PER_BYTE


class RecomputeError(ValueError):
    """The Recompute record does not fit the statements (raised as a ScheduleError by the planner)."""


def _is_contraction(st: Statement) -> bool:
    accs = product_accesses(st.expr)
    return st.reduce == "+=" and bool(accs) and len(accs) == 2 and accs[0] != accs[1] and bool(st.reduce_dims)


def chained_reductions(compute: Compute) -> dict[str, str]:
    """Reduction -> the contraction it reads at the contraction's own index, for the reductions that also
    read a stage computed after that contraction (so ``ReduceEpilogue`` cannot fold them into it)."""
    from superopt.schedule.plan_check import reduce_epilogue_dims

    stmts = list(compute.statements)
    order = {s.out: k for k, s in enumerate(stmts)}
    out: dict[str, str] = {}
    for p in stmts:
        if not _is_contraction(p) or p.out in compute.outputs:
            continue
        for c in stmts[order[p.out] + 1:]:
            if c.reduce != "+=" or c.padding or p.out not in c.inputs() or reduce_epilogue_dims(c, p) is None:
                continue
            if any(order.get(t, -1) > order[p.out] for t in c.inputs() if t != p.out):
                out[c.out] = p.out
    return out


def apply_recompute(statements: Sequence[Statement], prim: Recompute, outputs: Sequence[str]) -> list[Statement]:
    """The statements with a copy of contraction ``prim.stage`` placed just before ``prim.consumer``, which
    reads the copy instead."""
    prod = next((s for s in statements if s.out == prim.stage), None)
    cons = next((s for s in statements if s.out == prim.consumer), None)
    if prod is None or cons is None:
        raise RecomputeError(f"{prim}: no stage {prim.stage if prod is None else prim.consumer!r}")
    if not _is_contraction(prod):
        raise RecomputeError(f"{prim}: {prim.stage} is not a two-operand contraction")
    if prod.out in outputs:
        raise RecomputeError(f"{prim}: {prim.stage} is a kernel output")
    if prim.stage not in cons.inputs():
        raise RecomputeError(f"{prim}: {prim.consumer} does not read {prim.stage}")
    name = recompute_name(prim.stage, prim.consumer)
    if any(s.out == name for s in statements):
        raise RecomputeError(f"{prim}: {prim.stage} is already recomputed for {prim.consumer}")
    copy = Statement(name, prod.out_dims, prod.reduce, prod.expr, prod.extents, prod.padding)

    def rename(e):
        return Access(name, e.index) if isinstance(e, Access) and e.tensor == prim.stage else e

    reader = Statement(cons.out, cons.out_dims, cons.reduce, map_expr(cons.expr, rename), cons.extents, cons.padding)
    out: list[Statement] = []
    for s in statements:
        if s is cons:
            out += [copy, reader]
        else:
            out.append(s)
    return out


def with_recomputes(compute: Compute, prims: Sequence[Recompute]) -> Compute:
    """``compute`` with the statements ``prims`` make (the copies typed as their originals)."""
    stmts = list(compute.statements)
    types = dict(compute.types)
    for p in prims:
        stmts = apply_recompute(stmts, p, compute.outputs)
        types[recompute_name(p.stage, p.consumer)] = types[p.stage]
    return Compute(compute.inputs, compute.outputs, tuple(stmts), tuple(types.items()))


def prefer_recompute(compute: Compute, producer: str, flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE) -> bool:
    """Whether recomputing contraction ``producer`` costs less than storing it and reading it back: its flops
    (two per term) at ``flops_per_byte`` against writing and reading it once (4-byte elements). Compute
    that fits the caches stays stored."""
    st = next(s for s in compute.statements if s.out == producer)
    elements = math.prod(st.out_shape)
    terms = math.prod(st.extent[d] for d in st.reduce_dims)
    itemsize = compute.type_of[producer].np_dtype.itemsize
    return 2 * terms * elements <= flops_per_byte * 2 * itemsize * elements


def recompute_records(compute: Compute, flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE,
                      choose=None) -> list[Recompute]:
    """The Recompute records the default takes: one per chained reduction whose contraction costs less to
    recompute than to store (``choose(consumer, default) -> bool`` may override each, e.g. a search knob)."""
    out = []
    for consumer, producer in chained_reductions(compute).items():
        default = prefer_recompute(compute, producer, flops_per_byte)
        if choose(consumer, default) if choose is not None else default:
            out.append(Recompute(producer, consumer))
    return out


__all__ = ["RecomputeError", "flops_per_byte", "chained_reductions", "apply_recompute", "with_recomputes", "prefer_recompute",
           "recompute_records", "DEFAULT_FLOPS_PER_BYTE"]
