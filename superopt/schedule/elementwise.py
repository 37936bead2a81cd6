"""Elementwise and data-movement statements on the CPU: parallel outer loops and a vectorized innermost
contiguous one, tiled transposes, and which temporaries are inlined into their readers."""

from __future__ import annotations

import math
from collections.abc import Mapping

from superopt.ir.expr import Access
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.plan_check import TRANSPOSE_BLOCKS
from superopt.schedule.primitives import (
    CacheWrite,
    Fuse,
    Parallel,
    Primitive,
    Reorder,
    Split,
    TransposeBlock,
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


TRANSPOSE_ORDERS = ("mid", "outer+in", "outer+out", "in", "out")


def default_transpose_order(ext: Mapping[str, int], d_in: str, d_out: str, others: list[str],
                            target: Target) -> str:
    """The block loops' default order (see :func:`transpose_schedule`), ``others`` the other dims in the output's
    order. ``mid`` unless the input rows it leaves open outgrow half the L2: between two blocks of ``d_in`` it
    walks the innermost other dim and all of ``d_out``, and each input row it reads leaves the line the next
    block finishes (two lines a row); where those lines no longer fit, every input line is read twice from
    memory, and ``outer+in`` reads each strip of input rows from end to end instead (its open lines are the
    output's: two for each of ``ext[d_in]`` rows). ``ijk->kji`` at 100 x 150 x 170: ``mid`` would leave 150 x 100
    rows open (1.9 MB) between two k-blocks, ``outer+in`` 170 output rows; ``ijkl->ljik`` at 30 x 40 x 50 x 60
    leaves 30 x 50 (192 KB) and keeps ``mid``."""
    lines = 2 * target.cache_line_bytes
    rows_open = ext[d_out] * (ext[others[-1]] if others else 1)
    if rows_open * lines > target.l2_bytes // 2 and ext[d_in] * lines <= target.l2_bytes // 2:
        return "outer+in"
    return "mid"


STREAM_LLC_SHARE = 4  # outputs of at least 1/4 of the last-level cache are stored past it by default
LONG_ROWS = 8  # input rows of at least this many blocks: streamed copies read them end to end (outer+in)


def streams_whole_lines(st: Statement, block: int, target: Target) -> bool:
    """Whether a transposition's blocks are stored past the caches by default: every whole block's stores are
    whole cache lines (a block's row is a multiple of the line, and every output row starts on a line: the
    output's strides are multiples of the block), so non-temporal stores write them without reading them first,
    and the output is at least :data:`STREAM_LLC_SHARE` of the last-level cache, which the copy would otherwise
    fill with lines that the reads then evict (``ij->ji`` at 2000 x 1500: 12 MB written as whole lines). Rows of
    another length (``ijk->kji`` at 100 x 150 x 170: rows of 100 floats) would leave lines half-written, which a
    non-temporal store turns into a read and a write in memory."""
    ext = st.extent
    strides = [math.prod(ext[d] for d in st.out_dims[k + 1:]) for k in range(len(st.out_dims) - 1)]
    size = 4 * math.prod(ext[d] for d in st.out_dims)
    return (4 * block) % target.cache_line_bytes == 0 and all(n % block == 0 for n in strides) \
        and target.l3_bytes > 0 and size * STREAM_LLC_SHARE >= target.l3_bytes


def transpose_schedule(st: Statement, target: Target, knobs: KnobRecorder | None = None,
                       types: Mapping[str, TensorType] | None = None) -> list[Primitive]:
    """A pure copy whose input's contiguous axis (``d_in``) is not the output's (``d_out``): both split into
    square blocks (``<stage>.block``, a vector), so both the strided side and the contiguous side stay in L1
    (attention's K transpose; NCHW16c back to NCHW), where a row-by-row copy walks the strided side through
    memory. A block of a vector's lanes (8 or 16) is a :class:`TransposeBlock` (``<stage>.shuffle``): contiguous
    vector loads along ``d_in``, register shuffles, contiguous vector stores along ``d_out``, and masked ones for
    the blocks that the extents' remainders cut short, where ``types`` says the copy is of float32; else scalar
    copies (vectorizing either side of a block turns the other into gathers or scatters). Whole blocks may be
    stored past the caches (``<stage>.stream``; by default where each block's stores are whole lines and the
    output is a good part of the last-level cache, :func:`streams_whole_lines`, and then, where the input rows
    are long (:data:`LONG_ROWS` blocks), with the ``outer+in`` order: an output that fits in the cache, as the
    next reader would like it to, is left there). Each block may first fetch the input rows of the next
    iteration of the innermost block loop that steps to other input rows (``<stage>.prefetch``; by default where
    the copy is a good part of the last-level cache, whose misses it overlaps).

    The loops over blocks and the other dims (``<stage>.order``): the other dims first (``outer+``) or not, then
    in the output's memory order (``out``: the stores run along whole rows of blocks) or the input's (``in``:
    the loads do); or (``mid``) the output's order with ``d_in``'s blocks moved just inside all but the
    innermost other dim: the stores still run along whole output rows, and the input rows that one block of
    ``d_in`` leaves for the next are read again from L2, not from memory (``ijkl->ljik``: the blocks of ``l``
    inside ``j``, around ``i`` and ``k``). The default is ``mid``, or ``outer+in`` where the input rows ``mid``
    leaves open between two blocks of ``d_in`` outgrow the L2 (:func:`default_transpose_order`). The leading
    loops are fused until there is work for every thread (loops with a partial block cannot be fused), and run
    in parallel."""
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
    shuffles = target.kind == "cpu" and VECTOR in (8, 16) and types is not None \
        and all(types[t].dtype == "float32" for t in (s, st.expr.tensor))
    # half a vector where both sides divide by that and not by a vector (no partial blocks: 56 pixels a row of
    # NCHW16c back to NCHW), else a vector; not a half that no shuffle copies (4 lanes of AVX2's 8: a 2000 x 1500
    # copy element by element ran 1.7x slower than 8-lane blocks with masked partial ones)
    fits = next((b for b in (VECTOR, VECTOR // 2) if ext[d_in] % b == 0 and ext[d_out] % b == 0
                 and (not shuffles or b in TRANSPOSE_BLOCKS)), VECTOR)
    block = kn.get(f"{s}.block", fits, (VECTOR // 2, VECTOR, 2 * VECTOR, 4 * VECTOR))
    shuffle = shuffles and block in TRANSPOSE_BLOCKS and block <= VECTOR and kn.get(f"{s}.shuffle", True, (True, False))
    stream = shuffle and kn.get(f"{s}.stream", shuffle and streams_whole_lines(st, block, target), (False, True))
    others = [d for d in st.out_dims if d not in (d_in, d_out)]
    # streamed stores of long input rows read end to end (every block's loads continue the same rows)
    long_rows = ext[d_in] >= LONG_ROWS * block
    order = kn.get(f"{s}.order", "outer+in" if stream and long_rows else
                   default_transpose_order(ext, d_in, d_out, others, target), TRANSPOSE_ORDERS)
    in_dims = [ix.dims[0] for ix in st.expr.index]
    level = sorted([d_in, d_out] + others, key=(in_dims if order.endswith("in") else st.out_dims).index)
    if order.startswith("outer+"):
        level = [d for d in level if d in others] + [d for d in level if d not in others]
    if order == "mid":  # the output's order, d_in's blocks just inside all but the innermost other dim
        inner_others = [d for d in st.out_dims if d in others]
        level = [*inner_others[:-1], d_in, *inner_others[-1:], d_out]
    name = {d: f"{d}_o" if d in (d_in, d_out) else d for d in level}
    extent = {name[d]: math.ceil(ext[d] / block) if d in (d_in, d_out) else ext[d] for d in level}
    tailed = {name[d] for d in (d_in, d_out) if ext[d] % block}
    loops = [name[d] for d in level]
    prims: list[Primitive] = [Split(s, d_in, block), Split(s, d_out, block),
                              Reorder(s, (*loops, f"{d_in}_i", f"{d_out}_i"))]
    fusable = loops[:next((k for k, n in enumerate(loops) if n in tailed), len(loops))] or loops[:1]
    fprims, fname, _ = fuse_chain(s, fusable, extent, 4 * threads)
    if shuffle:
        # the innermost block loop that steps to other source rows (d_in's blocks go along the same ones): the
        # next block (mid: the next k-block of ljik) or the next strip of rows (outer+in: the next i-block of
        # kji); not the parallel loop (its next iteration is another thread's) nor a fused one (no constant stride)
        around = next((n for n in reversed(loops) if n != f"{d_in}_o"), None)
        if around is not None and (around == loops[0] or any(around in (f.outer, f.inner) for f in fprims)):
            around = None
        big = 4 * math.prod(ext.values()) * STREAM_LLC_SHARE >= target.l3_bytes > 0
        prefetch = around is not None and kn.get(f"{s}.prefetch", big, (False, True))
        prims.append(TransposeBlock(s, f"{d_in}_i", stream, around if prefetch else ""))
    return prims + fprims + [Parallel(s, fname)]


def simple_schedule(st: Statement, target: Target, attached: bool = False, knobs: KnobRecorder | None = None,
                    types: Mapping[str, TensorType] | None = None) -> list[Primitive]:
    """Parallel outer loops, vectorized innermost loop (the ``simple`` sketch; transposes get blocks, copied by
    register shuffles where ``types`` shows a float32 copy)."""
    kn = knobs or KnobRecorder()
    VECTOR, threads = target.lanes("float32"), target.threads
    s = st.out
    ext = st.extent
    loops = [d for d, _ in st.extents]
    if not attached:
        try:
            return transpose_schedule(st, target, kn, types)
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
