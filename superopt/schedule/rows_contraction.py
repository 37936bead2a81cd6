"""The ``rows+contraction`` sketch: attention-like ops (a contraction whose operand is computed from
another contraction through row reductions) computed inside the final contraction's loop over blocks
of its rows, so every temporary lives in a small buffer on the stack (the score matrix never exists).

Two structures, chosen by the knob ``<final>.row_block`` (query rows per block):

* ``1``: one row at a time (the score row; the contractions vectorized along their last dim).
* ``> 1`` (flash-attention-like, the default where it lowers): a block of rows at a time. The scores
  contraction ``T[.., i, j] += Q[.., i, e] * K[.., j, e]`` is register-tiled inside the block (keys ``j``
  as the vector loop, ``K`` packed ``[e, j]`` so its panels are contiguous, a panel of keys reused by
  all row groups of the block while it sits in L1); the row reductions and elementwise steps walk the
  block's rows vectorized over the keys; the final contraction ``O[.., i, f] += P[.., i, j] * V[.., j, f]``
  is register-tiled over rows x the vector dim ``f``, its reduction split into key blocks so each block
  of ``V`` stays in L1 across the block's row groups (the tile then accumulates into ``O``).

Knobs (``<stage>.<role>``): ``row_block``, ``rows`` (register rows of the final tile), ``key_block``,
``width`` (columns of the final tile); per scores contraction ``width`` (keys per register tile),
``rows`` and ``pack``; per elementwise temporary ``inline``.
"""

from __future__ import annotations

import math

from superopt.ir.compute import Compute
from superopt.ir.expr import product_accesses
from superopt.ir.statement import Statement
from superopt.schedule.contraction import final_contraction, is_contraction
from superopt.schedule.elementwise import simple_schedule
from superopt.schedule.knobs import KnobRecorder, divisor_like
from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    Pack,
    Parallel,
    Primitive,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.schedule.rowwise import is_cheap
from superopt.target import Target

ROW_BLOCK = 32  # query rows per block: a block's scores (32 x keys floats) stay in L1/L2


def rows_into_contraction(compute: Compute, target: Target, kn: KnobRecorder) -> list[Primitive]:
    """The sketch's trace; the row block (knob ``<final>.row_block``) defaults to :data:`ROW_BLOCK` rows
    where that structure lowers, else to one row."""
    from superopt.schedule.plan import ScheduleError, lower

    _, final, _ = final_contraction(compute)
    if len(compute.outputs) != 1 or not is_contraction(final) or len(final.out_dims) < 2:
        raise ValueError("not a contraction over rows")
    s = final.out
    row = final.out_dims[-2]
    n_rows = final.extent[row]
    default = 1
    if len(final.reduce_dims) == 1 and n_rows > 1:
        try:
            lower(compute, _row_blocks(compute, target, KnobRecorder(kn.overrides), min(ROW_BLOCK, n_rows)), target)
            default = min(ROW_BLOCK, n_rows)
        except (ScheduleError, ValueError, KeyError, StopIteration):
            pass
    domain = [1] + ([b for b in (4, 8, 16, 32, 64, 128) if b <= n_rows] if len(final.reduce_dims) == 1 else [])
    block = kn.get(f"{s}.row_block", default, domain)
    if block == 1:
        return _one_row(compute, target, kn)
    return _row_blocks(compute, target, kn, block)


def _tile_vectors(target: Target) -> int:
    """Vectors per register-tile row: 4 rows x 4 vectors of accumulators fit a 32-register file with the
    operands, 4 x 2 a 16-register one."""
    return 4 if target.vector_registers >= 32 else 2


def _batch_loop(s: str, batch: list[str]) -> tuple[list[Primitive], str | None, list[str]]:
    """The outer (batch) row dims with the first two fused into the parallel loop: (prims, its name, the
    loops above the row block)."""
    if not batch:
        return [], None, []
    if len(batch) == 1:
        return [], batch[0], list(batch)
    par = f"{batch[0]}_{batch[1]}"
    return [Fuse(s, batch[0], batch[1])], par, [par, *batch[2:]]


def _row_blocks(compute: Compute, target: Target, kn: KnobRecorder, block: int) -> list[Primitive]:
    temps, final, epilogue = final_contraction(compute)
    VECTOR = target.lanes("float32")
    s, last, (red,) = final.out, final.out_dims[-1], final.reduce_dims
    ext = final.extent
    rows = list(final.out_dims[:-1])
    row, batch = rows[-1], rows[:-1]
    trace: list[Primitive] = [Reorder(s, (*rows, red, last))]
    fprims, par, outer = _batch_loop(s, batch)
    trace += fprims
    # rows: blocks of `block` (the attach point), then register tiles of `r` rows
    r = kn.get(f"{s}.rows", min(4, block), [x for x in range(1, 9) if x <= block])
    trace += [Split(s, row, block), Split(s, f"{row}_i", r)]
    row_o, row_m, row_r = f"{row}_o", f"{row}_i_o", f"{row}_i_i"
    # columns of the tile: 4 vectors on a 32-register file (4 x 4 accumulators), else 2 (AVX2: 4 x 2 of 16)
    cols = ext[last]
    width = kn.get(f"{s}.width", min(cols, _tile_vectors(target) * VECTOR),
                   sorted({min(cols, w * VECTOR) for w in (1, 2, 3, 4)}))
    col_o, col_i = (f"{last}_o", f"{last}_i") if cols > width else (None, last)
    if col_o:
        trace.append(Split(s, last, width))
    # keys: blocks whose slice of the second operand stays in L1 while the block's row groups pass
    kb_default = min(ext[red], 64)
    key_block = kn.get(f"{s}.key_block", kb_default, divisor_like(ext[red], 16, ext[red], 16) or [ext[red]])
    red_o, red_i = (f"{red}_o", f"{red}_i") if key_block < ext[red] else (None, red)
    if red_o:
        trace.append(Split(s, red, key_block))
    order = [*outer, row_o, *([red_o] if red_o else []), *([col_o] if col_o else []), row_m, red_i, row_r, col_i]
    trace.append(Reorder(s, tuple(order)))
    trace += [CacheWrite(s, red_i), Unroll(s, row_r), Vectorize(s, col_i)]
    n_par = math.prod(ext[d] for d in batch[:2])
    if par is None:
        par = row_o
    elif n_par < 2 * target.threads and len(outer) == 1 and ext[row] % block == 0:
        trace.append(Fuse(s, par, row_o))  # too few batch rows for the threads: their blocks too
        par = f"{par}_{row_o}"
        row_o = par
    trace.append(Parallel(s, par))
    for t in temps:
        per_row = math.prod(n for d, n in t.extents if d in t.out_dims[len(rows):])
        if t.reduce == "=" and per_row > 1 and is_cheap(t.expr) and kn.get(f"{t.out}.inline", True, (True, False)):
            trace.append(Inline(t.out))
            continue
        if t.out_shape[:len(rows)] != final.out_shape[:-1]:
            raise ValueError(f"{t.out} is not computed per row of {s}: attached, it would be recomputed")
        trace.append(ComputeAt(t.out, s, row_o))
        if is_contraction(t) and len(t.out_dims) == len(rows) + 1:
            # a pack re-lays out a whole input: only one read by this access alone (not K sharing a fused
            # projection's output with V, whose reads the pack would scatter)
            reads = [a.tensor for x in compute.statements for a in x.expr.accesses()]
            alone = tuple(i for i in compute.inputs if reads.count(i) == 1)
            trace += _scores_tiles(t, alone, target, kn, len(rows) - 1)
        else:
            trace += simple_schedule(t, target, attached=True, knobs=kn)
    return trace + ([Epilogue(epilogue.out, s)] if epilogue else [])


def _scores_tiles(t: Statement, inputs: tuple[str, ...], target: Target, kn: KnobRecorder,
                  row_axis: int) -> list[Primitive]:
    """A contraction computed per block of rows (``T[.., i, j] += Q[.., i, e] * K[.., j, e]``): register
    tiles of rows x a vector run of its last dim ``j``, the operand indexed by ``j`` packed so the run is
    contiguous (``[.., e, j]`` in panels of the run) when it is one of ``inputs``."""
    VECTOR = target.lanes("float32")
    s, row, col = t.out, t.out_dims[row_axis], t.out_dims[-1]
    ext = t.extent
    width = kn.get(f"{s}.width", min(ext[col], _tile_vectors(target) * VECTOR),
                   sorted({min(ext[col], w * VECTOR) for w in (1, 2, 3, 4)}))
    rows = kn.get(f"{s}.rows", 4, list(range(1, 9)))
    prims: list[Primitive] = []
    col_o, col_i = (f"{col}_o", f"{col}_i") if ext[col] > width else (None, col)
    if col_o:
        prims.append(Split(s, col, width))
    prims.append(Split(s, row, rows))
    reduce = list(t.reduce_dims)
    prims.append(Reorder(s, (*([col_o] if col_o else []), f"{row}_o", *reduce, f"{row}_i", col_i)))
    prims += [CacheWrite(s, reduce[0]), Unroll(s, f"{row}_i"), Vectorize(s, col_i)]
    accs = product_accesses(t.expr) or []
    b = next((a for a in accs if any(ix.coeff(col) for ix in a.index)), None)
    # the column axis must be a plain dim; any other axis may be a compound index (the heads of a
    # [seq, batch*heads, e] key tensor, K[j, 4*b+h, e]; a column slice of a fused Q/K/V projection,
    # X[b, j, 64*h+e+256]): it keeps its index in the packed copy
    if b is None or b.tensor not in inputs or any(ix.coeff(row) for ix in b.index) \
            or sum(ix.is_plain_dim and ix.dims[0] == col for ix in b.index) != 1 \
            or any(col in ix.vars() and not ix.is_plain_dim for ix in b.index):
        return prims
    cols = [i for i, ix in enumerate(b.index) if ix.is_plain_dim and ix.dims[0] == col]
    red = [i for i, ix in enumerate(b.index) if i not in cols and set(ix.vars()) & set(t.reduce_dims)]
    perm = tuple([i for i in range(len(b.index)) if i not in red and i not in cols] + red + cols)
    if kn.get(f"{s}.pack", True, (True, False)):
        if col_o:
            prims.append(Pack(b.tensor, perm, len(perm) - 1, width))
        elif perm != tuple(range(len(b.index))):
            prims.append(Pack(b.tensor, perm))
    return prims


def _one_row(compute: Compute, target: Target, kn: KnobRecorder) -> list[Primitive]:
    """Scores, softmax and weighted sum (attention) as one pass per output row: every temporary is
    computed inside the final contraction's row loop (its last output dim excepted), so each lives in a
    row buffer on the stack (the score row, never the score matrix); cheap elementwise ones are inlined.
    The final contraction accumulates its row in registers, vectorized along its last output dim."""
    temps, final, epilogue = final_contraction(compute)
    s, last = final.out, final.out_dims[-1]
    # the first two row dims fused into the parallel loop (batch x heads; a fused loop cannot be fused
    # again), the temporaries attached at the innermost row loop (the query row)
    rows = list(final.out_dims[:-1])
    trace: list[Primitive] = [Reorder(s, (*rows, *final.reduce_dims, last))]
    par = rows[0]
    if len(rows) >= 2:
        trace.append(Fuse(s, rows[0], rows[1]))
        par = f"{rows[0]}_{rows[1]}"
        rows[:2] = [par]
    row = rows[-1]
    for t in temps:
        per_row = math.prod(n for d, n in t.extents if d in t.out_dims[len(final.out_dims) - 1:])
        if t.reduce == "=" and per_row > 1 and is_cheap(t.expr) and kn.get(f"{t.out}.inline", True, (True, False)):
            trace.append(Inline(t.out))
            continue
        if t.out_shape[:len(final.out_dims) - 1] != final.out_shape[:-1]:
            raise ValueError(f"{t.out} is not computed per row of {s}: attached, it would be recomputed")
        trace.append(ComputeAt(t.out, s, row))
        trace += simple_schedule(t, target, attached=True, knobs=kn)
    trace.append(CacheWrite(s, final.reduce_dims[0]))
    if final.extent[last] >= 4 and kn.get(f"{s}.vectorize", True, (True, False)):
        trace.append(Vectorize(s, last))
    trace.append(Parallel(s, par))
    return trace + ([Epilogue(epilogue.out, s)] if epilogue else [])
