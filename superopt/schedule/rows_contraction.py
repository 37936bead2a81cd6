"""The ``rows+contraction`` sketch: attention-like ops (a contraction whose operand is computed from
another contraction through row reductions) computed one output row at a time inside the final
contraction's row loop, so every temporary lives in a row buffer on the stack.
"""

from __future__ import annotations

import math

from superopt.ir.compute import Compute
from superopt.runtime.target import Target
from superopt.schedule.default import _is_cheap, _is_contraction, simple_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import CacheWrite, ComputeAt, Fuse, Inline, Parallel, Primitive, Reorder, Vectorize


def rows_into_contraction(compute: Compute, target: Target, kn: KnobRecorder) -> list[Primitive]:
    """Scores, softmax and weighted sum (attention) as one pass per output row: every temporary is
    computed inside the final contraction's row loop (its last output dim excepted), so each lives in a
    row buffer on the stack (the score row, never the score matrix); cheap elementwise ones are inlined.
    The final contraction accumulates its row in registers, vectorized along its last output dim."""
    stmts = list(compute.statements)
    final = stmts[-1]
    if len(compute.outputs) != 1 or not _is_contraction(final) or len(final.out_dims) < 2:
        raise ValueError("not a contraction over rows")
    s, last = final.out, final.out_dims[-1]
    # the row dims fused into one parallel loop (batch x heads x query rows), the temporaries attached there
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
    for t in stmts[:-1]:
        per_row = math.prod(n for d, n in t.extents if d in t.out_dims[len(final.out_dims) - 1:])
        if t.reduce == "=" and per_row > 1 and _is_cheap(t.expr) and kn.get(f"{t.out}.inline", True, (True, False)):
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
    return trace
