"""A reduction over axes that are not the input's innermost (``B[j] += A[i, j]``, ``B[i, k] += A[i, j, k]``):
a row of accumulators along the kept contiguous axis, the reduced rows streamed through it.

Reducing each output element on its own walks the input with the row stride in the vectorized loop (a
gather per lane, a cache line per element). Instead the kept axis that every read walks with unit stride is
split into column blocks of whole vectors held in registers (a ``CacheWrite`` tile), the reduction loops run
outside the block, and each step adds one contiguous piece of a row into the block. Threads share the column
blocks (and the other kept axes): no two of them write one output element.
"""

from __future__ import annotations

import math

from superopt.ir.statement import Statement
from superopt.schedule.elementwise import fuse_chain
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import CacheWrite, Parallel, Primitive, Reorder, Split, Vectorize
from superopt.target import Target

MOST_VECTORS = 8  # accumulators of a column block: half the registers of a 16-register file


def column_reduction_schedule(st: Statement, target: Target, knobs: KnobRecorder | None = None
                              ) -> list[Primitive] | None:
    """The column-block schedule of a reduction whose reads all walk the output's last dim with unit stride
    and whose innermost loop (a reduced dim) does not, or None where that is not the statement's shape."""
    kn = knobs or KnobRecorder()
    lanes, threads = target.lanes("float32"), target.threads
    if st.reduce == "=" or not st.reduce_dims or not st.out_dims or st.padding or st.pad_value:
        return None
    ext, s = st.extent, st.out
    last = st.out_dims[-1]
    accs = st.expr.accesses()
    if not accs or ext[last] < lanes:
        return None
    for a in accs:  # every read: innermost axis exactly ``last``, no reduced dim there
        if not a.index or not a.index[-1].is_plain_dim or a.index[-1].dims[0] != last \
                or any(ix.coeff(last) for ix in a.index[:-1]):
            return None
    outer = [d for d in st.out_dims[:-1] if ext[d] > 1]
    spread = math.prod(ext[d] for d in outer)  # work for the threads outside the column blocks
    most = MOST_VECTORS * lanes
    need = max(1, math.ceil(2 * threads / spread))  # column blocks wanted for the threads
    # blocks that divide the columns evenly: a last partial block is lowered as a parallel region of its own, one
    # thread working while the other waits (whole vectors first; else any width, its tile a float array)
    even = [ext[last] // n for n in range(need, 4 * need + 1) if ext[last] % n == 0 and ext[last] // n >= lanes]
    if ext[last] <= most and spread >= 2 * threads:
        block = ext[last]
    elif spread == 1 and ext[last] % threads == 0 and ext[last] // threads >= lanes:
        # the columns alone share out evenly: one block per thread, each streaming one contiguous part of every
        # row (a float array in L1 where it is past the registers) rather than two parts of half the length,
        # which the hardware prefetchers follow less well
        block = ext[last] // threads
    elif even:
        block = next((b for b in even if b % lanes == 0), even[0])
    else:  # blocks of whole vectors, enough of them for every thread
        block = next((b * lanes for b in (MOST_VECTORS, 4, 2) if spread * math.ceil(ext[last] / (b * lanes))
                      >= 2 * threads), lanes)
    block = kn.get(f"{s}.col_block", block, tuple(sorted({lanes, 2 * lanes, 4 * lanes, most, block})))
    prims: list[Primitive] = []
    if block < ext[last]:
        prims.append(Split(s, last, block))
        col_o, col_i = f"{last}_o", f"{last}_i"
        extents = dict(ext) | {col_o: math.ceil(ext[last] / block), col_i: block}
        par_loops = [col_o, *outer] if spread < 2 * threads else [*outer, col_o]
    else:
        col_i, extents = last, dict(ext)
        par_loops = list(outer)
    unit = [d for d in st.out_dims[:-1] if ext[d] == 1]
    prims.append(Reorder(s, (*par_loops, *unit, *st.reduce_dims, col_i)))
    prims.append(CacheWrite(s, st.reduce_dims[0]))
    prims.append(Vectorize(s, col_i))
    if par_loops:
        chain = par_loops
        if block < ext[last] and ext[last] % block:  # (a loop with a tail is not fused)
            chain = [col_o] if par_loops[0] == col_o else outer
        fprims, fname, _ = fuse_chain(s, chain, extents, 4 * threads)
        prims += fprims
        prims.append(Parallel(s, fname))
    return prims
