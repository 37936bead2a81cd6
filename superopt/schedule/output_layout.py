"""The output-layout move: a contraction computed into a temporary whose dims are the output's in another order,
then copied into the output (the output tile transposed on its way out, as a pass of its own over a tensor that
is small beside the operands of a compute-bound contraction).

The register tile's columns are best a pair of output dims that one operand holds as one contiguous run
(``B[o, n, m, l]``'s ``m, l``): split by any width of whole vectors, its panels read with unit stride. Where the
output keeps another dim between them (``C[j, i, m, k, l]``), the fused pair is no run of the output, its loop
splits only by multiples of the inner extent (17 columns: no width of whole vectors) and the tile falls back to
a narrow or scalar one. Laid out with the pair innermost (``C_laid[j, i, k, m, l]``), every tensor reads the pair
as one run. :func:`choose_output_layout` takes the move where such a pair scores :data:`OUTPUT_MOVE_GAIN` better than
every column choice of the output's own layout (:mod:`superopt.schedule.contraction_columns`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, product_accesses
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.schedule.contraction_columns import OUTPUT_MOVE_GAIN, best_width, choose_columns
from superopt.schedule.primitives import OutputLayout

MOVE_WORK = 1 << 22  # multiply-adds under which the extra pass over the output is not worth its parallel region


class OutputLayoutError(ValueError):
    """The OutputLayout record does not fit the statements (raised as a ScheduleError by the planner)."""


def laid_name(stage: str) -> str:
    """The name of the temporary that :class:`OutputLayout` computes ``stage`` into."""
    return f"{stage}_laid"


def apply_output_layout(compute: Compute, prim: OutputLayout) -> Compute:
    """``compute`` with output ``prim.stage`` computed into :func:`laid_name` (its dims in order ``prim.perm``)
    and copied into the output by a statement of its own, right after."""
    st = next((s for s in compute.statements if s.out == prim.stage), None)
    if st is None:
        raise OutputLayoutError(f"{prim}: no stage {prim.stage!r}")
    if prim.stage not in compute.outputs:
        raise OutputLayoutError(f"{prim}: {prim.stage} is not a kernel output")
    if sum(s.out == prim.stage for s in compute.statements) != 1 or any(
            prim.stage in s.inputs() for s in compute.statements):
        raise OutputLayoutError(f"{prim}: {prim.stage} is written by more than one statement or read by one")
    if sorted(prim.perm) != list(range(len(st.out_dims))) or list(prim.perm) == sorted(prim.perm):
        raise OutputLayoutError(f"{prim}: perm {prim.perm} is not a permutation (other than the identity) "
                                f"of {len(st.out_dims)} dims")
    name = laid_name(prim.stage)
    if name in compute.type_of:
        raise OutputLayoutError(f"{prim}: a tensor {name!r} exists")
    dims = tuple(st.out_dims[p] for p in prim.perm)
    ext = st.extent
    laid = Statement(name, dims, st.reduce, st.expr, tuple((d, ext[d]) for d in dims)
                     + tuple((d, ext[d]) for d in st.reduce_dims), st.padding)
    copy = Statement(st.out, st.out_dims, "=", Access(name, tuple(Affine.dim(d) for d in dims)),
                     tuple((d, ext[d]) for d in st.out_dims))
    out_type = compute.type_of[prim.stage]
    stmts: list[Statement] = []
    for s in compute.statements:
        stmts += [laid, copy] if s is st else [s]
    types = dict(compute.types) | {name: TensorType(tuple(out_type.shape[p] for p in prim.perm), out_type.dtype)}
    return Compute(compute.inputs, compute.outputs, tuple(stmts), tuple(types.items()))


def with_output_layouts(compute: Compute, prims: Sequence[OutputLayout]) -> Compute:
    for p in prims:
        compute = apply_output_layout(compute, p)
    return compute


def _runs(acc: Access) -> list[tuple[str, str]]:
    """Pairs of dims that index two neighbouring axes of ``acc`` in that order (a contiguous run of both)."""
    names = [ix.dims[0] for ix in acc.index]
    return list(zip(names, names[1:]))


def choose_output_layout(st: Statement, lanes: int, registers: int = 32) -> tuple[int, ...] | None:
    """The perm of the output's dims that puts a pair of column dims, one contiguous run of its operand, innermost,
    where that pair's best tile scores :data:`OUTPUT_MOVE_GAIN` better than every choice in the output's own layout;
    else None. Only for a plain two-operand contraction of enough work."""
    accs = product_accesses(st.expr)
    if st.reduce != "+=" or not accs or len(accs) != 2 or math.prod(st.extent.values()) < MOVE_WORK:
        return None
    scores = choose_columns(st, accs, lanes, registers)
    if not scores:
        return None
    now = max(c.score for c in scores.values())
    ext = st.extent
    most_vectors = 4 if registers >= 32 else 2
    best: tuple[float, tuple[str, str]] | None = None
    for k, x in enumerate(accs):
        other = {d for ix in accs[1 - k].index for d in ix.dims}
        own = {d for d in st.out_dims if d not in other and ext[d] > 1}
        for a, b in _runs(x):
            if a not in own or b not in own:
                continue
            if st.out_dims.index(b) == st.out_dims.index(a) + 1:
                continue  # (already one run of the output: the columns' own scoring covers it)
            rows = [ext[d] for d in st.out_dims if d not in (a, b) and d not in {e for ix in x.index for e in ix.dims}
                    and ext[d] > 1]
            _, score = best_width(ext[a] * ext[b], 1, lanes, most_vectors, rows, registers)
            if best is None or score > best[0]:
                best = (score, (a, b))
    if best is None or best[0] < OUTPUT_MOVE_GAIN * now:
        return None
    order = [d for d in st.out_dims if d not in best[1]] + list(best[1])
    return tuple(st.out_dims.index(d) for d in order)
