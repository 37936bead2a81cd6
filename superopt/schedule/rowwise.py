"""Row-wise multi-statement ops on the CPU (softmax, layernorm): every temporary computed one row at a time
inside the final stage's outer loops, reductions folded into the stage that reads them, rows computed
ahead; and which reductions of a contraction's result fold into its write-back."""

from __future__ import annotations

import math

from superopt.ir.compute import Compute
from superopt.ir.expr import Affine, Binary, Const, Unary, product_accesses
from superopt.ir.statement import Statement
from superopt.ir.types import is_float
from superopt.schedule.elementwise import simple_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import (
    ComputeAt,
    Inline,
    InPlace,
    NextRow,
    Parallel,
    Primitive,
    ReduceEpilogue,
    Split,
    Vectorize,
)
from superopt.target import Target

# functions worth computing once into a row buffer rather than recomputing at every use
EXPENSIVE_FNS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos", "reciprocal", "tan",
                           "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"})
EXPENSIVE_OPS = frozenset({"/", "pow", "mod", "fmod"})


def is_cheap(e) -> bool:
    """Only adds, multiplies, compares and the like: recomputing it beats a store and a reload. A division
    by a constant power of two counts as a multiply (the compiler emits the exact reciprocal's multiply)."""
    for x in e.walk():
        if isinstance(x, Unary) and x.fn in EXPENSIVE_FNS:
            return False
        if isinstance(x, Binary) and x.op in EXPENSIVE_OPS and not (x.op == "/" and _power_of_two(x.b)):
            return False
    return True


def _power_of_two(e) -> bool:
    """``e`` is a floating constant +-2**k: dividing by it is exactly multiplying by its reciprocal."""
    if not isinstance(e, Const) or isinstance(e.value, bool) or not is_float(e.dtype):
        return False
    v = abs(float(e.value))
    return math.isfinite(v) and v > 0 and math.frexp(v)[0] == 0.5


def foldable_reductions(compute: Compute) -> dict[str, str]:
    """Reduction stage -> the two-operand contraction whose result it reads at that result's own index
    (``S[i,j] += T[i,j,k]`` of ``T[i,j,k] += A[i,k,r] * B[r,j]``): folded by :class:`ReduceEpilogue`, the
    contraction's tile is consumed at its write-back and, with no other reader, never stored."""
    from superopt.schedule.plan_check import reduce_epilogue_dims

    stmts = list(compute.statements)
    order = {s.out: k for k, s in enumerate(stmts)}
    out: dict[str, str] = {}
    for p in stmts:
        accs = product_accesses(p.expr)
        if p.reduce != "+=" or not accs or len(accs) != 2 or accs[0] == accs[1] or not p.reduce_dims:
            continue
        for c in stmts:
            if c.reduce != "=" and c is not p and p.out in c.inputs() and not c.padding \
                    and c.out not in out and reduce_epilogue_dims(c, p) is not None \
                    and all(order.get(t, -1) < order[p.out] for t in c.inputs() if t != p.out):
                out[c.out] = p.out  # (one reading a stage computed after p is chained: schedule/chained.py)
    return out


def rowwise_schedule(compute: Compute, target: Target, kn: KnobRecorder, depth: int, fold: bool,
                     ahead: bool = True) -> list[Primitive]:
    """The ``rowwise@depth`` sketch: every temporary computed (or recomputed, when cheap) per row of the
    final stage's first ``depth`` dims, the rows in parallel. ``fold``: a sum over a row of an
    elementwise temporary (softmax's ``Z[i] += E[i, r]``) is folded into that temporary's loop (knob
    ``<sum>.fold``, CPU targets): one pass over the row instead of two; and the last elementwise
    temporary the final stage reads only at its own index is stored in the final stage's rows (knob
    ``<temporary>.in_place``: softmax's ``exp`` written to the output, then scaled in place)."""
    stmts = list(compute.statements)
    final = stmts[-1]
    temps = [s for s in stmts if s.out not in compute.outputs]
    trace: list[Primitive] = []
    attach_loop = final.out_dims[depth - 1]
    rows: dict[str, Statement] = {}  # elementwise temporaries computed into a row buffer
    for t in temps:
        per_row = math.prod(n for d, n in t.extents if d in t.out_dims[depth:])
        if t.reduce == "=" and per_row > 1 and is_cheap(t.expr) \
                and kn.get(f"{t.out}.inline", True, (True, False)):
            trace.append(Inline(t.out))  # e.g. layernorm's x - mean: recompute, never store
            continue
        trace.append(ComputeAt(t.out, final.out, attach_loop))
        producer = _row_sum_of(t, rows, depth) if fold and target.kind == "cpu" else None
        if producer is not None and kn.get(f"{t.out}.fold", True, (True, False)):
            trace.append(ReduceEpilogue(t.out, producer))
            continue
        trace += simple_schedule(t, target, attached=True, knobs=kn)
        if t.reduce == "=":
            rows[t.out] = t
    own = tuple(Affine.dim(d) for d in final.out_dims)
    in_place = [t for t in rows.values() if fold and target.kind == "cpu" and final.reduce == "=" and not final.padding
                and t.out_shape == final.out_shape and compute.type_of[t.out].dtype == compute.type_of[final.out].dtype
                and {a.index for a in final.expr.accesses() if a.tensor == t.out} == {own}]
    if in_place and kn.get(f"{in_place[-1].out}.in_place", True, (True, False)):
        trace.append(InPlace(in_place[-1].out, final.out))  # softmax: exp into the output row, scaled in place
    loops = [d for d, _ in final.extents]
    par = loops[0]
    pairs = _row_ahead_pairs(compute, trace, rows, depth) if fold and ahead and target.kind == "cpu" else []
    # on by default into an elementwise stage (softmax's exp: the next row's memory-bound read overlaps the
    # compute-bound exponentials), off into another reduction (layernorm's sum of squares: its vector sum
    # then combines the next row's lanes every 64 elements), a knob either way
    ahead_pairs = [(m, e) for m, e in pairs if kn.get(f"{m}.next_row", e in rows, (True, False))]
    n_rows = final.extent[loops[0]]
    block = max((b for b in range(2, n_rows + 1) if n_rows % b == 0 and n_rows // b >= 2 * target.threads),
                default=None) if depth == 1 else None
    if ahead_pairs and (depth > 1 or block is not None):
        if depth == 1:  # the rows run in order within blocks of rows, the blocks in parallel
            inner = f"{attach_loop}_i"
            trace = [Split(final.out, attach_loop, block)] + [
                ComputeAt(p.stage, p.consumer, inner) if isinstance(p, ComputeAt) else p for p in trace]
            par = f"{attach_loop}_o"
        trace += [NextRow(m, e) for m, e in ahead_pairs]
    trace.append(Parallel(final.out, par))
    if final.extent[loops[-1]] >= 4 and loops[-1] != attach_loop \
            and kn.get(f"{final.out}.vectorize", True, (True, False)):
        trace.append(Vectorize(final.out, loops[-1]))
    return trace


def _row_ahead_pairs(compute: Compute, trace: list[Primitive], rows: dict[str, Statement],
                     depth: int) -> list[tuple[str, str]]:
    """(row reduction, stage) pairs for :class:`NextRow`: a float reduction over a row of kernel inputs,
    computed per row, and the first stage computed per row after it that walks a row of that length, a
    row buffer or another row reduction (softmax: the max, then the exponentials; layernorm: the sum,
    then the sum of squares)."""
    attached = {p.stage for p in trace if isinstance(p, ComputeAt)}
    folded = {p.stage for p in trace if isinstance(p, ReduceEpilogue)}
    stmts = list(compute.statements)
    out = []
    taken: set[str] = set()
    for k, t in enumerate(stmts):
        red = [d for d in t.reduce_dims if t.extent[d] > 1]
        if t.out not in attached or t.out in folded or t.reduce == "=" or t.padding or len(red) != 1 \
                or not is_float(compute.type_of[t.out].dtype) \
                or any(a.tensor not in compute.inputs for a in t.expr.accesses()) \
                or any(t.extent[d] > 1 for d in t.out_dims[depth:]):
            continue
        for e in stmts[k + 1:]:
            walked = [d for d, n in e.extents if d not in e.out_dims[:depth] and n > 1]
            if e.out in attached and e.out not in folded and e.out not in taken \
                    and (e.out in rows or e.reduce != "=") and len(walked) == 1 \
                    and e.extent[walked[0]] == t.extent[red[0]]:
                out.append((t.out, e.out))
                taken.update((t.out, e.out))
                break
    return out


def _row_sum_of(t: Statement, rows: dict[str, Statement], depth: int) -> str | None:
    """The row buffer ``t`` sums over a whole row of, read at one index (then ``t`` can be folded into
    that buffer's loop), or None."""
    from superopt.schedule.plan_check import reduce_epilogue_dims

    read = [x for x in t.inputs() if x in rows]
    if t.reduce != "+=" or len(read) != 1 or t.padding:
        return None
    p = rows[read[0]]
    dims = reduce_epilogue_dims(t, p)
    if dims is None:
        return None
    row = {d for d in p.out_dims[depth:] if p.extent[d] > 1}
    summed = {dims[d] for d in t.reduce_dims if d in dims and p.extent[dims[d]] > 1}
    return p.out if row and summed == row else None
