"""Elementwise and data-movement statements on the CPU: parallel outer loops and a vectorized innermost
contiguous one, tiled transposes, and which temporaries are inlined into their readers."""

from __future__ import annotations

import math

from superopt.ir.expr import Access
from superopt.ir.statement import Statement
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import (
    CacheWrite,
    Fuse,
    Parallel,
    Primitive,
    Reorder,
    Split,
    Vectorize,
)
from superopt.target import Target


def fuse_chain(stage: str, loops: list[str], extents: dict[str, int], min_extent: int) -> tuple[list, str, int]:
    """Fuse outer loops left to right until the fused extent reaches min_extent."""
    prims: list[Primitive] = []
    name, ext = loops[0], extents[loops[0]]
    divided = False  # the loop so far is a fuse of two loops of extent > 1: fusing it again is not expressible
    for nxt in loops[1:]:
        if ext >= min_extent or divided and extents[nxt] > 1:
            break
        prims.append(Fuse(stage, name, nxt))
        divided = divided or (ext > 1 and extents[nxt] > 1)
        name, ext = f"{name}_{nxt}", ext * extents[nxt]
    return prims, name, ext


def transpose_schedule(st: Statement, target: Target, knobs: KnobRecorder | None = None) -> list[Primitive]:
    """A pure copy whose input's contiguous axis is not the output's: square blocks (``<stage>.block``,
    a vector by default, half a vector where both sides divide by that and not by a vector; the last block
    of a side that is not a multiple of it is partial), so both the strided side and the contiguous side
    stay in L1 (attention's K transpose; NCHW16c back to NCHW), where a row-by-row copy walks the strided side
    through memory. Whole blocks of 8 or 16 are copied by register shuffles."""
    kn = knobs or KnobRecorder()
    s, ext = st.out, st.extent
    VECTOR, threads = target.lanes("float32"), target.threads
    if st.reduce != "=" or not isinstance(st.expr, Access) or st.padding or len(st.out_dims) < 2:
        raise ValueError("not a transpose")
    src = st.expr.index[-1]
    d_out = st.out_dims[-1]
    if not src.is_plain_dim or src.dims[0] == d_out or any(not ix.is_plain_dim for ix in st.expr.index):
        raise ValueError("not a transpose")
    d_in = src.dims[0]
    if ext[d_in] < VECTOR or ext[d_out] < VECTOR:
        raise ValueError("transpose extents are shorter than the vector width")
    # a block both sides divide is copied whole by register shuffles (the loop nest's ``transposed`` loops)
    fits = next((b for b in (VECTOR, VECTOR // 2) if ext[d_in] % b == 0 and ext[d_out] % b == 0), VECTOR)
    block = kn.get(f"{s}.block", fits, (VECTOR // 2, VECTOR, 2 * VECTOR, 4 * VECTOR))
    outer = [d for d in st.out_dims if d not in (d_in, d_out)]
    blocks = (f"{d_out}_o", f"{d_in}_i", f"{d_out}_i")
    prims: list[Primitive] = [Split(s, d_in, block), Split(s, d_out, block)]
    # (scalar copies: vectorizing either side of a block turns the other into gathers or scatters)
    if math.prod(ext[d] for d in outer) >= 2 * threads:
        fprims, fname, _ = fuse_chain(s, outer, dict(ext), 4 * threads)
        return prims + [Reorder(s, (*outer, f"{d_in}_o", *blocks))] + fprims + [Parallel(s, fname)]
    return prims + [Reorder(s, (f"{d_in}_o", *outer, *blocks)), Parallel(s, f"{d_in}_o")]


def simple_schedule(st: Statement, target: Target, attached: bool = False,
                    knobs: KnobRecorder | None = None) -> list[Primitive]:
    """Parallel outer loops, vectorized innermost loop (the ``simple`` sketch; transposes get blocks)."""
    kn = knobs or KnobRecorder()
    VECTOR, threads = target.lanes("float32"), target.threads
    s = st.out
    ext = st.extent
    loops = [d for d, _ in st.extents]
    if not attached:
        try:
            return transpose_schedule(st, target, kn)
        except ValueError:
            pass
    prims: list[Primitive] = []
    inner = loops[-1]
    if not attached and inner in st.reduce_dims and kn.get(f"{s}.column_blocks", True, (True, False)):
        from superopt.schedule.column_reduction import column_reduction_schedule

        columns = column_reduction_schedule(st, target, kn)
        if columns is not None:
            return columns
    last = st.out_dims[-1] if st.out_dims else None
    window = math.prod(ext[d] for d in st.reduce_dims)
    if (st.reduce_dims and last and inner != last and window <= 64 and ext[inner] < VECTOR
            and 8 <= ext[last] <= 1024 and all(ix.coeff(last) in (0, 1) for a in st.expr.accesses() for ix in a.index)
            and kn.get(f"{s}.row_window", True, (True, False))):
        # a small window (pooling, LRN): reduce into a row of accumulators vectorized along the output
        # row, instead of a short scalar reduction per output element (unit stride only: no gathers)
        prims += [Reorder(s, tuple(d for d in st.out_dims if d != last) + st.reduce_dims + (last,)),
                  CacheWrite(s, st.reduce_dims[0])]
        inner = last
    # a padded copy whose bounds test moves with the vector loop (X[c, y-1, x-1] over x) is left to the
    # compiler: an explicit simd loop turns the test into masked gathers, where gcc's own vectorizer
    # peels the edges and keeps contiguous loads
    checked = st.reduce == "=" and any(
        a.tensor in st.pad_value and any(inner in ix.vars() and ix.bounds(ext)[0] < 0 for ix in a.index)
        for a in st.expr.accesses())
    if ext[inner] >= 4 and kn.get(f"{s}.vectorize", not checked, (True, False)):
        prims.append(Vectorize(s, inner))
    if not attached:
        outer = [d for d in st.out_dims if d != inner]
        if outer:
            par = kn.get(f"{s}.par", 4, (1, 2, 4, 16, 64))
            fprims, fname, _ = fuse_chain(s, outer, dict(ext), par * threads)
            prims += fprims
            prims.append(Parallel(s, fname))
    return prims


def inlinable(st: Statement, stmts: list[Statement], outputs: tuple[str, ...]) -> bool:
    """An elementwise temporary the sketches inline into its readers: read by some stage, none of which
    pads it, and not a padded copy feeding a window (inlined, its bounds checks would return)."""
    if st.out in outputs or st.reduce != "=" or len(stmts) < 2:
        return False
    consumers = [c for c in stmts if st.out in c.inputs()]
    padded_copy = bool(st.padding) and any(c.reduce_dims for c in consumers)
    return bool(consumers) and not padded_copy and all(st.out not in c.pad_value for c in consumers)
