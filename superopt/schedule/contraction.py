"""Contractions on the CPU: register tiles (rows x a vector of columns), the packed operand and its
layout roles, the order of the reduction loops, and which contraction ends a multi-statement compute."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, flat_offset, product_accesses
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.schedule.contraction_columns import (
    SMALLER_PACK_GAIN,
    choose_columns,
    lane_score,
    pick,
    row_dim,
    row_use,
    tile_rows,
)
from superopt.schedule.elementwise import fuse_chain
from superopt.schedule.knobs import KnobRecorder, divisor_like
from superopt.schedule.primitives import (
    CacheWrite,
    Fuse,
    Pack,
    Parallel,
    Primitive,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.schedule.reduction_blocks import reduction_block
from superopt.target import Target

# the longest innermost reduction loop of a register tile that is fully unrolled (a conv window's columns);
# longer ones (16 blocked-input lanes under a 5 x 64 tile) only grow the code: under a tile that large the
# loop's own counter and pointer updates are already a small share of its FMAs
UNROLL_REDUCTION = 8
# multiply-adds from which the columns are chosen by lane use (a move can pack the other operand on every call)
MOVE_WORK = 1 << 20


def contiguous_dims(st: Statement, types: Mapping[str, TensorType], outer: str, inner: str) -> bool:
    """Whether every tensor the statement reads or writes moves ``extent(inner)`` times as far per step of
    ``outer`` as per step of ``inner``: the fused loop over both walks one contiguous run (no padding)."""
    if st.pad_value:
        return False
    for tensor, index in st.indexed():
        flat = flat_offset(index, types[tensor].shape)
        if flat.coeff(outer) != st.extent[inner] * flat.coeff(inner):
            return False
    return True


def unit_run(st: Statement, types: Mapping[str, TensorType], outer: str, inner: str) -> bool:
    """:func:`contiguous_dims`, and every tensor that ``inner`` indexes walks it with unit stride: the fused loop
    reads one contiguous run of each, split by any width with no pack (a linear loop rules packs out)."""
    if not contiguous_dims(st, types, outer, inner):
        return False
    for tensor, index in st.indexed():
        coeff = flat_offset(index, types[tensor].shape).coeff(inner)
        if coeff not in (0, 1):
            return False
    return True


def _is_window(acc: Access) -> bool:
    """Indexed by a sum or a stride of loop variables somewhere (an image under a sliding window)."""
    return any(ix.dims and not ix.is_plain_dim for ix in acc.index)


# cache lines of an output row each thread writes at least, where the threads split the rows' contiguous dim
SHARED_ROW_LINES = 8
BALANCED = 1.05  # the most parallel iterations may exceed their even share over the threads before another loop fuses in
BLOCKER_OUT_SPREAD = BALANCED  # the same, before a parallel loop the next cannot fuse with goes inside that one
PACK_REREADS = 32  # row blocks at least that read a cache-resident run-time column operand before the default packs it
ROW_PACK_PASSES = 4  # column panels at least that re-read a strided row operand before the default packs it
# times at least that a row operand past L2 is fetched from memory unpacked (``_refetched_rows`` per column panel)
# before the default packs it: the copy reads it once and writes it once
ROW_REFETCH = 8
LONG_ROWS_REPICKED = True  # rows_to_repick also over an innermost row dim of more than 8 rows
FEW_ROWS_FIT_16 = True  # few rows on a 16-register file: a second row dim and a width that fits (few_rows_width)
SHORT_REDUCTION = 1024  # reduction steps at most between a tile's write-backs for the rows to follow the output's runs
SHORT_RUN_LINES = 4  # cache lines a row operand's contiguous run spans at least, unpacked (_short_runs)
STRIDED_ROWS = 4  # register-tile rows at most over a column operand read with a stride along the vector
TILE_LOADS = 24  # vector loads at most in one unrolled block of a tile whose every FMA loads its column vector


# how much less re-read traffic makes the panels go outermost against the footprint rule
REREAD_GAIN = 2.0
# ... and by how much less where a run-time column operand fits L2 but fills more than half of it: the row
# operand streaming past evicts it between row blocks (C[k,j,i] += A[j,i,m,l] * B[k,m,l], a 1.4 MB B re-read by
# 146 row blocks against a 1.5 MB A re-read by 19 panels)
FAR_REREAD_GAIN = 4.0
FLOAT32_BYTES = 4  # (the tile's operands: lanes are counted in float32)
# how much more the column operand's panels must be re-read, with the row operand's own dims outside the column
# operand's, than the row operand would be with them inside, for the column operand's dims to go outside
COLUMN_REREAD_GAIN = 1.5


def _row_block(n: int, most: int) -> int:
    """Rows per register tile: the largest of most..4 that wastes fewest padded rows (55 -> 5, 13 -> 7)."""
    return min(range(most, min(3, most - 1), -1), key=lambda r: (math.ceil(n / r) * r - n, -r))


def _lane_bytes(st: Statement, types: Mapping[str, TensorType], dim: str) -> int:
    """How far apart in the output, in bytes, a tile's lanes along output dim ``dim`` lie."""
    return FLOAT32_BYTES * abs(flat_offset([Affine.dim(d) for d in st.out_dims], types[st.out].shape).coeff(dim))


def _footprint(acc: Access, st: Statement) -> int:
    """Elements of the operand the statement reads (the product of the extents of the dims indexing it)."""
    return math.prod(st.extent[d] for d in {d for ix in acc.index for d in ix.dims})


def _panel_width(width: int, ncol: int, inner: int, window: bool, chosen: bool, b: Access, st: Statement,
                 target: Target) -> int:
    """The tile width narrowed for its column panels: the last panel's lanes (329 columns as 7 x 48, 98% of the
    lanes used, rather than 6 x 64, 86%: 1.12x on one core; 132 x 4 fused columns as 11 x 48 rather than 9 x 64,
    1.13x), and, for columns ``chosen`` by contiguity, a column operand ``b`` past L2 in too few panels for the
    threads to share evenly, the last one partial: the panels would go inside the row loops (see panel_outer),
    which then read all of the operand from memory again for every block of rows. Narrower panels, enough for
    every thread, keep them outermost (137 columns over 4 MB: 5 panels of 32 rather than 3 of 48, 1.4x on 2 cores
    of an Intel Xeon). ``inner``: the extent a fused column loop splits by multiples of (1 for one dim)."""
    lanes, threads = target.lanes("float32"), target.threads
    if not window and width == 4 * lanes and ncol > width and (3 * lanes) % inner == 0 \
            and lane_score(ncol, 3 * lanes, 1, lanes) > lane_score(ncol, width, 1, lanes) + 0.05:
        width = 3 * lanes
    if not chosen or not ncol % width or math.ceil(ncol / width) >= 2 * threads \
            or FLOAT32_BYTES * _footprint(b, st) <= target.l2_bytes:
        return width
    return next((w * lanes for w in (3, 2) if w * lanes < width and math.ceil(ncol / (w * lanes)) >= 2 * threads
                 and (w * lanes) % inner == 0), width)


def row_tile_width(width: int, ncol: int, inner: int, window: bool, b: Access, st: Statement,
                   target: Target) -> int:
    """The width of the tile that the row dim is chosen for, the chosen columns' ``width`` as their panels will
    narrow it (:func:`_panel_width`): rows picked to fill a tile of 4 vectors may fill one of 2 badly (5 rows of k,
    where 27 of m make 4 tiles of 7 rows)."""
    return _panel_width(width, ncol, inner, window, True, b, st, target)


def rows_to_repick(inner: str, shared: Collection[str], along: Collection[str], ext: Mapping[str, int],
                   lane_stride: int, line_bytes: int = 64) -> bool:
    """Whether the tile's rows are chosen again among the ``shared`` dims (those the column operand does not read)
    instead of the innermost row dim ``inner``: where the column operand reads ``inner`` (every FMA of the tile would
    load its own column vector: rows i of A[i,m,n,k,j] over columns k, j of A, 2.05x), or where ``inner`` is too
    short to fill a tile and too long to pair with a second row dim (5 to 8 rows) while a shared dim runs
    ``along`` the row operand's unit stride (rows i of A[m,j,k,i] over j's 5: each step's broadcasts from one cache
    line, 1.14x), unless the tile's lanes lie more than a cache line apart in the output (``lane_stride`` bytes):
    the rows of ``inner``, its innermost dim, then write the tile back as a few runs, where other rows would write
    each lane to a line of its own (C[j,i,l,k] over columns i 49 floats apart: rows j 0.76x). With
    :data:`LONG_ROWS_REPICKED`, an ``inner`` of more than 8 rows too: its rows fill tiles, but each step's
    broadcasts of them lie a row of the operand apart (rows j of A[j,n,m,i], 10 of them in tiles of 5, where i's 18
    run along A's unit stride in tiles of 6: rows i 1.07x). :func:`row_dim` then weighs the candidates' fill against
    that contiguity."""
    weighed = 4 < ext[inner] and (LONG_ROWS_REPICKED or ext[inner] <= 8)
    return inner not in shared or weighed and bool(set(along) - {inner}) and lane_stride <= line_bytes


def output_run_rows(out_dims: Sequence[str], lane_stride: int, steps: int, line_bytes: int = 64) -> tuple[str, ...]:
    """The row dims that a chosen tile's rows should run along: the output's innermost dim where the tile's lanes lie
    more than a cache line apart in the output (``lane_stride`` bytes) and the tile is written back every ``steps``
    reduction steps, at most :data:`SHORT_REDUCTION`; else none. Rows along another dim write a line per
    accumulator lane, 16 lines per vector of FMAs over ``steps``; rows along the output's unit stride write each
    lane's rows as one run (C[m,n,l,k,j,i] over columns l 1632 floats apart, 418 steps: rows i 1.37x rows j). Over
    longer reductions the write-back is too rare to choose the rows by."""
    return (out_dims[-1],) if lane_stride > line_bytes and steps <= SHORT_REDUCTION else ()


def few_rows_width(rows: int, whole_step: int, lanes: int, registers: int) -> int:
    """The width of a tile of few ``rows`` (both row dims' together) on a 16-register file (AVX2): the most vectors,
    at most 4, whose accumulators fit the registers with a row of the column operand and a broadcast, in multiples
    of ``whole_step``; 0 where not even one such step fits. 3 rows x 2 of a second row dim x 2 vectors, or 4 rows x
    3 vectors: 12 accumulators, where the 32-register tile of 4 rows x 8 vectors left one row of 8 (each FMA then
    loads its column vector: ``jni,knlm->mijkl`` 1.8x)."""
    vectors = max(1, min(4, (registers - 1) // (rows + 1)))
    return vectors * lanes // whole_step * whole_step


def fused_vector_step(n_dims: Sequence[str], ext: Mapping[str, int], lanes: int, linear: bool) -> int:
    """The least tile width of whole vectors that the column loop over ``n_dims`` splits by: a fused pair splits only
    by multiples of its inner extent (unless ``linear``: one contiguous run in every tensor), so by multiples of the
    least common multiple of that and the vector width."""
    if len(n_dims) < 2 or linear:
        return lanes
    return math.lcm(ext[n_dims[-1]], lanes)


def _slice(acc: Access, st: Statement, outer: list[str], parts: Mapping[str, int] | None = None) -> float:
    """Elements of the operand read under one iteration of the ``outer`` loops (dims of the statement); ``parts``:
    the iterations of a loop that walks its dim in blocks (a column panel's), where not one per element."""
    dims = {d for ix in acc.index for d in ix.dims}
    return _footprint(acc, st) / math.prod((parts or {}).get(d, st.extent[d]) for d in outer if d in dims)


def column_dims_first(dims: list[str], a: Access, b: Access, st: Statement, panel_bytes: float,
                      l2_bytes: int, line_elements: int) -> list[str]:
    """The row loops outside a column panel (``dims``, output order, no batch dims among them), with the
    column operand ``b``'s dims moved outside the row operand ``a``'s where that re-reads less.

    Each iteration of a dim of ``a`` outside dims of ``b`` reads the panel's slices of ``b`` under it again
    (``panel_bytes`` each, from memory when they pass half of L2); with ``b``'s dims outside, each slice stays
    in cache across all of ``a``'s rows, which are read again for every iteration of ``b``'s dims instead.
    ``C[m,l,j,k,i] += A[n,j,i] * B[l,k,m,n]``, columns ``m,l``: j outside k read 21 x 2.4 MB of B per panel,
    k outside j 5 x 4.8 MB of A (1.28x on 2 cores of an Intel Xeon).

    Not where a dim that would move writes the output less than ``line_elements`` apart: its neighbouring
    iterations write back into the same cache lines, which then leave the cache between them (the output's
    unit-stride i of 66 moved outside 126 row loops over a 17 MB output: 0.63x)."""
    in_b = {d for ix in b.index for d in ix.dims}
    ext = st.extent
    own_b = [d for d in dims if d in in_b]
    last_b = max((i for i, d in enumerate(dims) if d in in_b), default=-1)
    outside = [d for d in dims[:last_b] if d not in in_b]  # (a's dims with some of b's inside them)
    if not own_b or not outside:
        return dims
    moved = [d for d in dims[dims.index(outside[0]):] if d in in_b]
    stride = {d: math.prod(ext[x] for x in st.out_dims[i + 1:]) for i, d in enumerate(st.out_dims)}
    if any(stride[d] < line_elements for d in moved):
        return dims
    under = panel_bytes * math.prod(ext[d] for d in moved)
    if under <= l2_bytes // 2:
        return dims  # (b's slices stay cached across a's dims)
    b_reread = under * math.prod(ext[d] for d in outside)
    a_bytes = FLOAT32_BYTES * _footprint(a, st)
    a_reread = a_bytes * math.prod(ext[d] for d in own_b) if a_bytes > l2_bytes // 2 else a_bytes
    if b_reread < COLUMN_REREAD_GAIN * a_reread:
        return dims
    return own_b + [d for d in dims if d not in in_b]


def _batch_dims(a: Access, b: Access, st: Statement) -> frozenset[str]:
    """Output dims that index both operands: the batch of a batched contraction."""
    dims_a = {d for ix in a.index for d in ix.dims}
    return frozenset(d for d in st.out_dims if d in dims_a and any(d in ix.dims for ix in b.index))


def _own_dims(b: Access, a: Access, st: Statement) -> list[str]:
    """Output dims (of extent > 1) that index ``b`` but not ``a``: candidates for the vector columns."""
    in_a = {d for ix in a.index for d in ix.dims}
    in_b = {d for ix in b.index for d in ix.dims}
    return [d for d in st.out_dims if d in in_b and d not in in_a and st.extent[d] > 1]


def reduction_walk(a: Access, reduce_dims: Sequence[str], types: Mapping[str, TensorType] | None) -> list[str]:
    """The reduction loops ordered so the innermost walks row operand ``a`` (read one broadcast element per
    row and step) with its smallest stride: the loop nest then streams ``a`` instead of jumping a row of it per
    step (a conv's taps over a channels-last image: channels innermost). Ties, and reductions that do not
    index ``a``, keep the statement's order."""
    if types is None or a.tensor not in types:
        return list(reduce_dims)
    flat = flat_offset(a.index, types[a.tensor].shape)
    strides = {d: abs(flat.coeff(d)) for d in reduce_dims}
    if not all(strides.values()):
        return list(reduce_dims)
    return sorted(reduce_dims, key=lambda d: -strides[d])


def pack_roles(b: Access, n_dims: Sequence[str], reduce_order: Sequence[str], st: Statement
               ) -> tuple[list[int], list[int], list[int]] | None:
    """The axes of column operand ``b`` as (rest, reduction, column) groups, the order of its packed panel
    (the GETT order: what the micro-kernel walks innermost last; reduction axes in the order of the loops
    ``reduce_order``, so each step reads the next panel row), or None when some axis mixes the groups
    (a window ``2*y+kh``) or the column axes cannot be laid out as one contiguous run of the fused column
    loop. An axis may be any affine index of its group's dims: ``W[16*o+q, ...]`` (a reshape folded into the
    read) is the column axis of the fused ``o_q`` loop, so the pack makes its stride-1152 reads contiguous."""
    if b.tensor in st.pad_value:
        return None
    red_dims, col_dims = set(st.reduce_dims), set(n_dims)
    rest: list[int] = []
    red: list[int] = []
    cols: list[int] = []
    for i, ix in enumerate(b.index):
        used = ix.vars()
        if used and used <= col_dims:
            cols.append(i)
        elif used and used <= red_dims:
            red.append(i)
        elif used & (red_dims | col_dims):
            return None
        else:
            rest.append(i)
    if any(not b.index[i].is_plain_dim for i in cols):
        # one axis read as the flattening of the column dims (``16*o + q`` over o, q): the fused column loop
        # walks it with unit stride, so a split of it by the tile width is a panel
        ix = b.index[cols[0]] if len(cols) == 1 else None
        if ix is None or ix.const or ix.vars() != col_dims or any(
                ix.coeff(d) != math.prod(st.extent[e] for e in n_dims[k + 1:]) for k, d in enumerate(n_dims)):
            return None
    else:
        cols.sort(key=lambda i: n_dims.index(b.index[i].dims[0]))
    red.sort(key=lambda i: min(reduce_order.index(v) for v in b.index[i].vars()))
    return rest, red, cols


def _past_l2(a: Access, flat: Affine | None, st: Statement, types: Mapping[str, TensorType] | None,
             target: Target) -> int | None:
    """The element size of row operand ``a`` where what the statement reads of it is past L2 (and its layout is
    known: ``flat``, its flat offset), else None."""
    if flat is None or types is None or a.tensor not in types:
        return None
    itemsize = types[a.tensor].np_dtype.itemsize
    return itemsize if itemsize * _footprint(a, st) > target.l2_bytes else None


def _refetched_rows(a: Access, flat: Affine | None, rows: Collection[str | None], st: Statement,
                    types: Mapping[str, TensorType] | None, target: Target, b: Access | None = None,
                    outer: Sequence[str] = (), parts: Mapping[str, int] | None = None) -> int:
    """How many times each cache line of row operand ``a`` comes from memory per column panel, read unpacked:
    where its unit-stride dim is an outer loop (neither a row dim of the tile nor a reduction) and the operand is past
    L2, each iteration of that loop reads the elements of every line that are its own and the line is gone by the
    next one (``B[l,m,k]`` with rows l, reduction m and k outside: each line of the 5 MB operand fetched once per
    k, nine times). 1 where the lines are used whole or stay cached (``outer``: the loops outside the tile, outermost
    first, by the dims they walk, ``parts`` the iterations of those that walk theirs in blocks, as :func:`_slice`;
    ``b``: the column operand, read between two iterations of that loop too: a whole panel of its columns)."""
    itemsize = _past_l2(a, flat, st, types, target)
    if itemsize is None:
        return 1
    unit = [d for d in st.extent if abs(flat.coeff(d)) == 1]
    if not unit or unit[0] in rows or unit[0] in st.reduce_dims or st.extent[unit[0]] < 2:
        return 1
    if unit[0] in outer:
        # what is read between two iterations of that loop, the lines of ``a`` it touches (every element of them
        # across that dim) and ``b``'s slice: where that stays in cache, so do the lines the next iteration reads
        # again (that loop just outside the reductions, over a slice of each operand)
        at = list(outer).index(unit[0])
        moved = _slice(a, st, list(outer[:at]), parts) \
            + (_slice(b, st, list(outer[:at + 1]), parts) if b is not None else 0.0)
        if itemsize * moved <= target.l2_bytes // 2:
            return 1
    line = target.cache_line_bytes // itemsize
    return min(st.extent[unit[0]], line)


def refetch_blocks(n_dims: Sequence[str], panels: int | None, row: str | None, row_blocks: int | None
                   ) -> dict[str, int]:
    """The iterations of the loops outside the tile that walk their dims in blocks, by dim, as
    :func:`_refetched_rows` counts what one iteration reads: ``panels`` of the columns ``n_dims`` (a fused pair's
    inner dim whole in each) and ``row_blocks`` of ``row`` (None: not split). A panel of 48 columns reads 48 columns'
    worth of the column operand, not one (counted as one, a 650 KB panel passed for 13 KB, and a 4 MB row operand
    read 9 times over stayed unpacked: 1.23x packed)."""
    out: dict[str, int] = {}
    if panels is not None:
        out[n_dims[0]] = panels
        out.update({d: 1 for d in n_dims[1:]})
    if row is not None and row_blocks is not None:
        out[row] = row_blocks
    return out


def _short_runs(a: Access, flat: Affine | None, row: str | None, reduce_order: Sequence[str], st: Statement,
                types: Mapping[str, TensorType] | None, target: Target) -> bool:
    """Whether row operand ``a``, past L2, is read unpacked in short contiguous runs: its innermost reductions
    (with the tile's rows, where they continue the run) span fewer than ``SHORT_RUN_LINES`` cache lines before
    the next reduction step jumps elsewhere (``A[o,i,m,n,j,p]`` with rows j and reductions ..., n, p: 8 rows x
    6 p, three lines, then a jump of 2 KB), a walk the prefetchers follow poorly."""
    itemsize = _past_l2(a, flat, st, types, target)
    if itemsize is None or not reduce_order:
        return False
    inner = reduce_order[-1]
    if abs(flat.coeff(inner)) != 1:
        return False
    run = 1
    for r in reversed(reduce_order):  # (the reduction loops inside out, while each continues the run)
        if abs(flat.coeff(r)) != run:
            break
        run *= st.extent[r]
    if row is not None and abs(flat.coeff(row)) == run:
        run *= min(st.extent[row], 8)
    return run * itemsize < SHORT_RUN_LINES * target.cache_line_bytes


def spread(n: int, threads: int) -> float:
    """How far the busiest thread's share of ``n`` parallel iterations exceeds an even one (1.0: even)."""
    return math.ceil(n / threads) * threads / n


def whole_row_tile(inner: str, along: Collection[str], ext: Mapping[str, int], most: int, ncol: int, step: int,
                   lanes: int, near_steps: bool, target: Target) -> int:
    """The rows of a tile 3 vectors wide that takes all of the innermost row dim ``inner`` (0: none): where the
    row operand runs along ``inner`` with unit stride, ``inner`` is longer than the ``most`` rows of the planned tile
    but no longer than the rows a 3-vector tile fits in the registers (9 of 32), the columns (``ncol``, split by
    multiples of ``step``) fill 3-vector tiles of ``lanes``-wide vectors, and the row operand's reduction steps
    lie within a cache line of each other (``near_steps``; a step a line or more away reads a new line per step
    for a few of its elements, which a packed copy of the rows avoids: 0.66x without it). Each step's broadcasts
    then all come from one cache line, in one tile without a row tail, where a wider tile of fewer rows splits
    ``inner`` with a tail or moves the rows to a dim each of whose broadcasts reads a line of its own
    (``C[l,k,j,i] += A[m,i,j] * B[l,m,k]``: rows k, B's unit stride, all 9 in tiles of 48 columns, 1.18-1.25x
    against 4 rows of l in tiles of 96 on 2 cores of an Intel Xeon)."""
    e = ext[inner]
    fits = most < e <= _register_rows(3, target) and ncol >= 3 * lanes and (3 * lanes) % step == 0
    return e if inner in along and fits and near_steps and target.vector_registers >= 32 else 0


def scattering_pack(lane_bytes: int, alt_lane_bytes: int, steps: int, line_bytes: int = 64) -> bool:
    """Whether the smaller operand's columns (the cheaper per-call pack) would scatter the tile's write-back: their
    lanes lie more than a cache line apart in the output (``alt_lane_bytes``) where the chosen columns' lie within
    one (``lane_bytes``), and the tile is written back every ``steps`` reduction steps, at most
    :data:`SHORT_REDUCTION` (``C[l,i,m,j,k] += A[n,j,i,o] * B[l,m,n,k,o]`` over 957 steps: columns k, m of the
    4.4 MB B, not i, j of the 1.9 MB A, whose lanes lie 24 floats apart). Over longer reductions the write-back is
    too rare to count against the pack (kil,jkl->ij over 8320 steps keeps the smaller pack)."""
    return alt_lane_bytes > line_bytes >= lane_bytes and steps <= SHORT_REDUCTION


def few_uneven_panels(panels: int, width: int, ncol: int, threads: int) -> bool:
    """Whether ``panels`` column panels of ``width`` (``ncol`` columns, the last panel partial) are too few for the
    threads to share their columns evenly: fewer than two a thread, and the busiest thread's columns past
    :data:`BALANCED` times an even share (3 panels of 48 on 2 threads: 96 columns and 43; 2 of 48 and 42: 48 and
    42. Two of 48 and 47 share within it)."""
    return panels < 2 * threads and ncol % width != 0 \
        and math.ceil(panels / threads) * width * threads > BALANCED * ncol


def rows_shared_under_panels(inside: Sequence[int], threads: int) -> bool:
    """Whether outermost column panels too few to share evenly (:func:`few_uneven_panels`) run one after the
    other, the threads sharing each one's rows (the parallel loop one inside them): the loops inside them (their
    extents, outermost first) give the threads even shares, the first, or it and the next fused where that evens
    them out (``C[j,i,k,l] += A[m,i,n] * B[k,l,j,m,n]``: 3 panels of i over 95 blocks of j,k, B read 3 times
    instead of the 1.5 MB of packed A once per block, 1.17x on 2 cores of an Intel Xeon)."""
    n = evened(inside[0], inside[1] if len(inside) > 1 else None, threads) if inside else 1
    return spread(n, threads) <= BALANCED


def evened(n: int, following: int | None, threads: int) -> int:
    """The iterations the threads share of a loop of ``n``: its own, or with the ``following`` loop's fused in
    (None: none can fuse) where ``n`` alone is shared unevenly and the product evens them out."""
    if following is None or spread(n, threads) <= BALANCED:
        return n
    return min(n, n * following, key=lambda m: spread(m, threads))


def shared_inside(outer: Sequence[str], extents: Mapping[str, int], threads: int,
                  fusable: Callable[[str], bool]) -> int:
    """The iterations the threads would share with the parallel loop one inside the outermost, ``outer[1]``: its
    own, or with the next loop fused in where that evens them out (9 on two threads, 5 and 4; 9 x 19 within 1%)."""
    following = extents.get(outer[2], 1) if len(outer) > 2 and fusable(outer[1]) and fusable(outer[2]) else None
    return evened(extents.get(outer[1], 1), following, threads)


def row_pack_perm(a: Access, row: str | None, reduce_order: Sequence[str], outer_order: Sequence[str],
                  st: Statement) -> tuple[int, ...] | None:
    """The axes of row operand ``a`` in the order the register tile reads it: the axes of loops outside the tile
    (in ``outer_order``), then the row's, then the reductions' in ``reduce_order``, so each row's broadcast walks
    its next element at every reduction step instead of one cache line per step (``A[j,n,m,i]`` with rows j and
    reductions n, m read at stride 18 becomes ``[i][j][n][m]``). None when ``a`` is padded, read through a
    window or already in that order."""
    if a.tensor in st.pad_value or any(not ix.is_plain_dim for ix in a.index):
        return None
    dims = [ix.dims[0] for ix in a.index]
    reds = [i for i, d in enumerate(dims) if d in st.reduce_dims]
    rows = [i for i, d in enumerate(dims) if d == row]
    rest = [i for i in range(len(dims)) if i not in reds and i not in rows]
    rest.sort(key=lambda i: outer_order.index(dims[i]) if dims[i] in outer_order else -1)
    reds.sort(key=lambda i: reduce_order.index(dims[i]))
    perm = tuple(rest + rows + reds)
    return None if perm == tuple(range(len(dims))) else perm


def contraction_schedule(st: Statement, inputs: Sequence[str], target: Target, pack: bool = True,
                         consts: frozenset[str] | None = None, knobs: KnobRecorder | None = None,
                         keep: frozenset[str] | None = None,
                         types: Mapping[str, TensorType] | None = None) -> list[Primitive]:
    """Register-tiled schedule for ``out += A[...] * B[...]``: the ``tiled_contraction`` sketch.

    Every parameter is a knob named ``<stage>.<role>``; without overrides each takes the heuristic's
    value below. Loop nest (SSRSRS-like): outer spatial blocks (optionally with an outer reduction
    block, ``k_tile``/``k_pos``), then the reductions, then rows x a vector of columns in registers.

    ``keep``: the output dims that reductions folded into the write-back keep (``ReduceEpilogue``):
    the vector columns and the parallel loop then walk only those, and the reduction is not blocked
    (the tile must hold whole sums when the folded reductions read it)."""
    kn = knobs or KnobRecorder()
    from superopt.schedule.blocked_conv import blocked_conv_schedule  # a conv on NCHWc tensors (search/graph/layout.py)

    blocked = blocked_conv_schedule(st, target, consts, kn)
    if blocked is not None:
        return blocked
    VECTOR, threads = target.lanes("float32"), target.threads
    s = st.out
    ext = st.extent
    steps = math.prod(ext[d] for d in st.reduce_dims)  # (the most a tile takes between its write-backs)
    accs = product_accesses(st.expr)
    if not accs or len(accs) != 2 or accs[0] == accs[1] or not st.reduce_dims:
        raise ValueError("not a two-operand contraction")  # (X[i,j] * X[i,j] is a sum of squares)
    last = st.out_dims[-1]
    b = next(a for a in accs if any(ix.coeff(last) for ix in a.index))
    a = next(x for x in accs if x is not b)
    a_cols, b_cols = _own_dims(a, b, st), _own_dims(b, a, st)
    narrow = math.prod(ext[d] for d in b_cols[-2:]) < 4 * VECTOR <= math.prod(ext[d] for d in a_cols[-2:])
    # the weight is the operand to pack (for free, ahead of time) and vectorize over
    weight_on_rows = consts is not None and a.tensor in consts and b.tensor not in consts \
        and math.prod(ext[d] for d in a_cols[-2:]) >= 2 * VECTOR
    weights_as_columns = bool(a_cols) and not _is_window(a) and (_is_window(b) or narrow or weight_on_rows)
    if keep is not None:  # vector columns the folded reductions keep: their lanes never collide
        def kept_columns(bb: Access, aa: Access) -> bool:
            own_dims = _own_dims(bb, aa, st)
            return bool(own_dims) and own_dims[-1] in keep and not _is_window(bb)
        if not kept_columns(b, a) and not kept_columns(a, b):
            raise ValueError("no vector column dim that the folded reductions keep")
        weights_as_columns = not kept_columns(b, a)
    # the columns by contiguity and lane use where both operands are plain (any order of their dims): the
    # column operand is packed into the order the tile reads, so the output's innermost dims need not be its
    # (not for a constant operand, packed once for free where it is the column operand, nor for kernels too small
    # to repay a per-call pack of the other operand)
    scores = choose_columns(st, accs, VECTOR, target.vector_registers,
                            lambda o, i: types is not None and unit_run(st, types, o, i)) \
        if keep is None and types is not None and not weight_on_rows and not (consts and (a.tensor in consts or
                                                                                          b.tensor in consts)) \
        and math.prod(ext.values()) >= MOVE_WORK else None
    layout, moved = None, False
    if scores:
        col_acc, row_acc = (a, b) if weights_as_columns else (b, a)
        own_b = _own_dims(col_acc, row_acc, st)
        now = own_b[-2:] if len(own_b) < 2 or ext[own_b[-1]] <= 16 * VECTOR else own_b[-1:]
        layout = pick(scores, (accs.index(col_acc), tuple(now)))
        # both operands run-time inputs: the column operand is packed on every call, and where its columns are
        # not its innermost axis the pack is a transpose. The other operand's best columns, nearly as good
        # (within SMALLER_PACK_GAIN) on an operand at most half the size, make the cheaper pack (kil,jkl->ij: columns
        # i of the 2.6 MB operand, not j of the 5.3 MB one, 1.15x on one core)
        col_x = accs[layout.operand]
        if col_x.index[-1].dims[0] not in layout.dims:
            alt = max((c for (k, _), c in scores.items() if k != layout.operand), key=lambda c: c.score, default=None)
            if alt is not None and alt.score * SMALLER_PACK_GAIN >= layout.score \
                    and 2 * _footprint(accs[alt.operand], st) <= _footprint(col_x, st) \
                    and not scattering_pack(_lane_bytes(st, types, layout.dims[-1]), _lane_bytes(st, types, alt.dims[-1]),
                                            steps, target.cache_line_bytes):
                layout = alt
        moved = layout != scores.get((accs.index(col_acc), tuple(now)))
        if len(layout.dims) == 2:  # (a fused pair the position rule would split off whole vectors: re-laid too)
            inner_ext = ext[layout.dims[-1]]
            wide_cols = (4 if target.vector_registers >= 32 else 2) * VECTOR
            moved = moved or (inner_ext * max(1, wide_cols // inner_ext)) % VECTOR != 0 \
                and math.prod(ext[d] for d in layout.dims) > wide_cols
        weights_as_columns = accs[layout.operand] is a
    if keep is None and a_cols and not _is_window(a):
        weights_as_columns = kn.get(f"{s}.swap", weights_as_columns, (False, True))
    if weights_as_columns:
        # an image read through a window (NCHW conv: X[n,ci,y+kh,x+kw]): vectorize over the weight's own
        # dims (output channels) instead, packed contiguous; the image is read as one broadcast scalar per
        # row, any bounds checks stay off the vector loop, and strided windows need no gathers. Likewise
        # when b's own columns are too few to fill vectors (a 7x7 image against 2048 output channels)
        a, b = b, a
    own = _own_dims(b, a, st)
    n_dims = own[-2:]  # fuse at most two column dims
    groups = [dims for (k, dims) in scores if accs[k] is b] if scores else []
    if layout is not None and accs[layout.operand] is b:
        n_dims = list(groups[kn.get(f"{s}.columns", groups.index(layout.dims), tuple(range(len(groups))))])
        layout = scores[(accs.index(b), tuple(n_dims))]
    else:
        layout = None
    if keep is not None and not set(n_dims) <= keep:
        n_dims = own[-1:]
    if len(n_dims) == 2 and layout is None:
        # (two fused column dims split by multiples of the inner one: an inner dim past 16 vectors makes
        # a tile over the register budget, so one column dim then)
        n_dims = own[-kn.get(f"{s}.col_dims", 2 if ext[own[-1]] <= 16 * VECTOR else 1, (1, 2)):]
    # bounds checks on a fused column loop defeat vectorization, and a window over the column dims (a
    # padded copy's X[c, y+kh, x+kw], rows longer than the output's) makes the fused index a div/mod: gathers
    # (reductions of one step, a 1x1 conv's kernel window, are no window)
    window = any(set(ix.vars()) & set(n_dims) and set(ix.vars()) & {d for d in st.reduce_dims if ext[d] > 1}
                 for ix in b.index)
    if b.tensor in st.pad_value or window or not n_dims:
        n_dims = [last]
    m_dims = [d for d in st.out_dims if d not in n_dims]
    if not n_dims:
        raise ValueError("no column dims")
    # the register tile's row dim: the innermost other output dim by default. One that indexes only the
    # row operand reuses each column vector once per row; one the column operand also reads (an image's y
    # when only x is vectorized, weights as rows) loads a vector per FMA
    row_dims = [d for d in m_dims if ext[d] > 1]
    shared = [d for d in row_dims if not any(ix.coeff(d) for ix in b.index)]
    if keep is not None and shared and m_dims[-1] not in shared:
        # (folded reductions, where the row knob is off: a row dim the column operand does not read, so each
        # column vector loaded feeds every row; capsule votes' W[kx,ky,i,o,r,p] differs per i, not per y)
        m_dims = [d for d in m_dims if d != shared[-1]] + [shared[-1]]
    whole_rows = 0  # (the innermost row dim in one tile of 3 vectors: whole_row_tile)
    if len(row_dims) > 1 and m_dims[-1] in row_dims and keep is None:
        row_at = len(row_dims) - 1
        vecs = math.ceil(row_tile_width(layout.width, math.prod(ext[d] for d in n_dims), ext[n_dims[-1]]
                                        if len(n_dims) > 1 else 1, window, b, st, target) / VECTOR) \
            if layout is not None else 3
        most = tile_rows(vecs, target.vector_registers) if layout is not None else 8
        flat = flat_offset(a.index, types[a.tensor].shape) if layout is not None else None
        along = {d for d in shared if flat is not None and abs(flat.coeff(d)) == 1}
        lane_stride = _lane_bytes(st, types, n_dims[-1]) if layout is not None else 0
        # (the row operand's least reduction step, in bytes: a line or more is a new line per step)
        step_bytes = FLOAT32_BYTES * min((abs(flat.coeff(r)) for r in st.reduce_dims if flat.coeff(r)), default=0) \
            if flat is not None else None
        whole_rows = whole_row_tile(m_dims[-1], along, ext, most, math.prod(ext[d] for d in n_dims),
                                    fused_vector_step(n_dims, ext, VECTOR, False), VECTOR,
                                    step_bytes is not None and step_bytes < target.cache_line_bytes, target) \
            if layout is not None else 0
        if layout is not None and shared and not whole_rows \
                and (moved or ext[m_dims[-1]] > 8 and row_use(ext[m_dims[-1]], most) < 0.75
                                              or rows_to_repick(m_dims[-1], shared, along, ext, lane_stride,
                                                                target.cache_line_bytes)):
            # (a row dim the column operand does not read, filling the tile: where the columns moved, or where
            # the innermost row dim splits badly; a short one is left to the second row dim below)
            runs = output_run_rows(st.out_dims, lane_stride, steps, target.cache_line_bytes)
            row_at = row_dims.index(row_dim(shared, ext, most, vecs, along, runs))
        row = row_dims[kn.get(f"{s}.row_dim", row_at, tuple(range(len(row_dims))))]
        if row != m_dims[-1]:
            whole_rows = 0  # (the search chose another row dim: the planned tile for it)
        m_dims = [d for d in m_dims if d != row] + [row]
    reduce_dims = list(st.reduce_dims)
    if 1 < len(reduce_dims) <= 3:
        perms = [list(p) for p in itertools.permutations(reduce_dims)]
        walk = perms.index(reduction_walk(a, reduce_dims, types))
        reduce_dims = perms[kn.get(f"{s}.red_order", walk, tuple(range(len(perms))))]
    else:
        reduce_dims = reduction_walk(a, reduce_dims, types)
    reduce_order = list(reduce_dims)  # (the statement's dims: a k_tile split renames the first below)
    prims: list[Primitive] = []
    # loop order: M dims, then N dims, then reductions
    order = m_dims + n_dims + reduce_dims
    prims.append(Reorder(s, tuple(order)))
    extents = dict(ext)
    col = n_dims[0]
    for d in n_dims[1:]:
        prims.append(Fuse(s, col, d))
        extents[f"{col}_{d}"] = extents[col] * extents[d]
        col = f"{col}_{d}"
    ncol = extents[col]
    # vectors per tile row: 4 on a 32-register file (4 rows x 4 vectors: 4 loads + 4 broadcasts per 16 FMAs;
    # 4 x 2 takes 2 + 4 per 8, so the load ports rather than the FMA pipes would bound it), else 2
    wide = 4 if target.vector_registers >= 32 else 2
    width = next((v * VECTOR for v in (wide, 2) if ncol >= v * VECTOR), VECTOR if ncol >= VECTOR else ncol)
    # few rows (capsule's 4x4 p): a second row dim, an outer output dim split by ``rows2`` with its inner part
    # in the register tile too, so each vector of the column operand feeds more rows. 2 x 4 rows x 3 vectors
    # (24 accumulators) leaves registers for the operands where 4 x 8 vectors (32 accumulators) spills and
    # 4 x 4 loads a vector per 4 FMAs; without a second row dim the tile widens instead
    rows2_dims = [d for d in m_dims[:-1] if ext[d] >= 2] if keep is None else []
    few_rows = bool(m_dims) and ext[m_dims[-1]] <= 4 and ncol >= 3 * VECTOR
    # the least width of whole vectors that fused columns split by (112 for an inner extent of 7: the tiles of few
    # rows below, 4 or 8 vectors wide, would be cut to 63 or 126 columns, a tile printed as scalars, 0.34x)
    # (a fused pair that every tensor holds as one run splits by any width: its loop is made linear)
    any_split = types is not None and len(n_dims) > 1 and contiguous_dims(st, types, *n_dims)
    whole_step = fused_vector_step(n_dims, ext, VECTOR, any_split)
    rows2_dim, rows2 = None, 1
    narrow_file = wide == 2 and FEW_ROWS_FIT_16
    if rows2_dims and ext[m_dims[-1]] <= 8:
        even = [d for d in rows2_dims if ext[d] % 2 == 0]
        rows2_dim = rows2_dims[kn.get(f"{s}.rows2_dim", rows2_dims.index(even[0]) if even else len(rows2_dims) - 1,
                                      tuple(range(len(rows2_dims))))]
        rows2 = kn.get(f"{s}.rows2", 2 if few_rows and (wide == 4 and (4 * VECTOR) % whole_step == 0
                                                        or narrow_file and ext[m_dims[-1]] <= 3) else 1,
                       [r for r in (1, 2, 3, 4) if r <= ext[rows2_dim]])
    fitted = few_rows_width(ext[m_dims[-1]] * rows2, whole_step, VECTOR, target.vector_registers) \
        if few_rows and narrow_file else 0
    if fitted:
        width = fitted
    elif few_rows and rows2 == 1 and ncol >= 4 * VECTOR:
        # 4 rows x 8 vectors: each broadcast feeds 8 FMAs instead of 4 (fits 16 registers with the rows rolled)
        width = 8 * VECTOR if ncol >= 8 * VECTOR else 4 * VECTOR
        width = max(whole_step, width // whole_step * whole_step)
    elif few_rows and rows2 > 1:
        width = min(4, max(1, (target.vector_registers - 8) // (ext[m_dims[-1]] * rows2))) * VECTOR
    fused = len(n_dims) > 1
    if window and ncol > width and 0 < ncol % width < VECTOR and math.ceil(ncol / VECTOR) <= wide:
        # a window's row of few columns in one tile (its last vector partial) rather than a last tile
        # narrower than a vector: that tile's vector loop runs whole in gcc's scalar remainder (depthwise
        # convs of 19-45 columns). A tail of a vector or more stays (56 columns as 32 + 24): a tile of 56
        # columns would need more accumulators than the registers hold
        width = ncol
    # a fused loop splits by multiples of its inner extent (the default keeps rows whole); by any width where
    # every operand reads the two dims as one contiguous run: lowering then makes the fused loop linear (a
    # 1x1 conv's pixels in 64-wide tiles, no 56-column rows with a half-vector tail)
    if fused and ncol > width:
        width = ext[n_dims[-1]] * max(1, width // ext[n_dims[-1]])
    short = ext[m_dims[-1]] if m_dims and keep is None and rows2 == 1 else 0
    if wide == 4 and width >= 4 * VECTOR and 6 < short <= 8 and short % _row_block(short, 6) \
            and ncol % (2 * VECTOR) == 0:
        # a short row loop that the 4-vector tile (6 rows at most) would split with a tail: one tile of all its
        # rows x 2 vectors instead (every tile full, none in the slower remainder code). A conv's 7 output
        # columns against a channels-last image, 128 output channels (capsule votes from ONNX): 1.25x
        width = 2 * VECTOR
    if layout is not None and not few_rows and (moved or width % VECTOR and width < ncol):
        width = layout.width  # (the position-chosen columns keep a width of whole vectors)
    width = _panel_width(width, ncol, ext[n_dims[-1]] if fused else 1, window, layout is not None, b, st, target)
    if whole_rows:
        width = 3 * VECTOR
    # the search's tiles fit the register file with the column vectors and a broadcast (rows2 x rows x vectors of
    # accumulators): past it gcc spills inside the reduction, and spends seconds allocating registers for
    # the unrolled tile, which a tuning budget of seconds cannot afford
    width = kn.get(f"{s}.width", width, [w * VECTOR for w in (1, 2, 3, 4, 6, 8) if w * VECTOR <= max(ncol, VECTOR)
                                         and rows2 <= _register_rows(w, target)]
                   + ([ncol] if ncol < 8 * VECTOR and rows2 <= _register_rows(math.ceil(ncol / VECTOR), target) else []))
    if fused and ncol > width and width % ext[n_dims[-1]] and not any_split:
        width = ext[n_dims[-1]] * max(1, width // ext[n_dims[-1]])
    col_o = None
    if ncol > width:
        prims.append(Split(s, col, width))
        col_o, col_i = f"{col}_o", f"{col}_i"
        extents[col_o] = math.ceil(ncol / width)
    else:
        col_i = col
    rows_o, row_i = None, None
    outer_m = list(m_dims)
    factor = 1
    row = None
    if m_dims:
        row = m_dims[-1]
        outer_m = m_dims[:-1]
        # rows x vectors of accumulators: 8 x 2, or 6 x 4 on a 32-register file when the tile is 4 vectors wide
        # (24 accumulators; one AVX-512 core: sgemm 1024^3 93%, a 3x3 conv 77% of the FMA ceiling)
        rows = 6 if math.ceil(width / VECTOR) >= 4 and wide == 4 else 8
        if layout is not None and width > wide * VECTOR and width % VECTOR == 0:
            # (a tile wider than the usual, chosen to fill its lanes: rows to fit the registers)
            rows = tile_rows(width // VECTOR, target.vector_registers)
        if whole_rows:
            rows = whole_rows
        if keep is not None:  # (folded reductions: a tile that fits the register file with its operands, no
            # spills inside the reduction: 5 x 2 on AVX2's 16 registers ran 20% faster than 8 x 2 on the moments op)
            vecs = max(1, math.ceil(width / VECTOR))
            rows = max(4, min(rows, _register_rows(vecs, target)))
        # (the full tiles are peeled from the last one, loopnest.versioning: a tail costs one slower tile,
        # so only short row loops pick a tile size that divides them better)
        # a column operand read with a stride along the vector and at each row (a stride-2 depthwise conv's
        # X[c, 2y+kh, 2x+kw], rows over y): each vector is gathered for one FMA, and a tall tile only adds live
        # registers (112 channels, 28 x 28 outputs: 4 rows 1.25x faster than 15). Rows the column operand does
        # not read (a conv's output channels) reuse each gathered vector and keep the usual tile
        strided = n_dims == [col] and any(abs(ix.coeff(col)) > 1 for ix in b.index) \
            and any(ix.coeff(row) for ix in b.index)
        if strided:
            rows = min(rows, STRIDED_ROWS)
        if n_dims == [col] and window and any(ix.coeff(row) for ix in b.index) and (strided or 2 * ncol > VECTOR):
            # the same, stride 1 or not, for a window's image of at least a vector of columns (held in whole
            # vectors, the last overlapping: codegen.c_vector_tile): every FMA has a load of its own (two for a
            # stride of 2), and the unrolled window columns times the tile's vectors put them all in one block,
            # which gcc schedules loads first; past TILE_LOADS of them it spills (a depthwise 3x3 conv over
            # 28 columns: 4 rows 1.4x faster than 7 on stride 1, 2 rows 1.4x faster than 4 on stride 2)
            red_in = reduce_dims[-1]
            step = max(abs(ix.coeff(col)) for ix in b.index)
            vecs = math.ceil(min(width, ncol) / VECTOR) if ncol >= VECTOR else 2  # (half vectors below one)
            loads = vecs * step * (ext[red_in] if ext[red_in] <= UNROLL_REDUCTION else 1)
            rows = min(rows, max(1, TILE_LOADS // loads))
        factor = extents[row] if extents[row] <= rows else rows if extents[row] >= 4 * rows \
            else _row_block(extents[row], rows)
        vecs = math.ceil(min(width, ncol) / VECTOR)
        while factor > 1 and factor * rows2 > _register_rows(vecs, target):
            factor -= 1  # (a second row dim the search chose: a tile of all 7 rows x 4 x 3 vectors would spill)
        factor = kn.get(f"{s}.rows", factor, [r for r in range(1, rows + 1 if strided else 17) if r <= extents[row]
                                              and r * rows2 <= _register_rows(vecs, target)])
        if extents[row] > factor:
            prims.append(Split(s, row, factor))
            rows_o, row_i = f"{row}_o", f"{row}_i"
            extents[rows_o] = math.ceil(extents[row] / factor)
        else:
            row_i = row
    rows2_i = None
    if rows2 > 1 and rows2_dim is not None:
        prims.append(Split(s, rows2_dim, rows2))
        rows2_i = f"{rows2_dim}_i"
        extents[f"{rows2_dim}_o"] = math.ceil(ext[rows2_dim] / rows2)
        outer_m = [f"{rows2_dim}_o" if d == rows2_dim else d for d in outer_m]
    # panels of the column operand outermost when it is the bigger one (weights of a small-batch linear
    # layer, deep conv layers): each panel then stays in cache across all rows and the operand is read
    # from memory once instead of once per row block
    panel_outer = _footprint(b, st) >= _footprint(a, st)
    row_blocks = math.prod(extents.get(d, ext.get(d, 1)) for d in outer_m) * (extents[rows_o] if rows_o else 1)
    b_bytes, reread = FLOAT32_BYTES * _footprint(b, st), _footprint(b, st) * row_blocks
    # (with a second row dim the panels go inside the first outer loop below, where each stays in cache across
    # the row blocks under it: the column operand is read once per iteration of that loop, not once per block)
    # (and only where what the rows re-read of it under one iteration of the outer loops is past half of L2 too: a
    # column operand indexed by an outer loop has a slice per iteration, read again by the row blocks under it
    # while it is cached)
    far = FAR_REREAD_GAIN * _footprint(a, st) * extents.get(col_o, 1) <= (
        _footprint(b, st) * extents.get(outer_m[0], ext.get(outer_m[0], 1)) if rows2_i and outer_m else reread) \
        and FLOAT32_BYTES * _slice(b, st, outer_m) > target.l2_bytes // 2
    if not panel_outer and col_o and row_blocks > 1 and not _batch_dims(a, b, st) \
            and (b_bytes > target.l2_bytes // (2 if consts and b.tensor in consts else 1)
                 or b_bytes > target.l2_bytes // 2 and far and not (consts and {a.tensor, b.tensor} & consts)) \
            and REREAD_GAIN * _footprint(a, st) * extents[col_o] <= reread:
        # the smaller column operand, but past the cache: rows outermost read all of it once per row block,
        # panels outermost read the rows' operand once per panel; the panels go outside where that moves far
        # less (C[i,j] += A[l,i,k] * B[l,k,j], 508 x 329 over 36 x 102: 64 passes over a 4.8 MB B against 7 over
        # a 7.5 MB A, 1.67x on 2 cores of an Intel Xeon; mi,jklm->ijkl's 168 row blocks of jkl against 5 panels
        # of i, 1.23x). A constant weight counts as past the cache beyond half of it, where the streaming rows
        # evict it (squeezenet's 2 MB classifier over 16 images: 1.14x); a run-time operand too, but only where
        # rows outermost would re-read it FAR_REREAD_GAIN times more than the panels re-read the rows' operand
        # (the half-L2 bound alone, at the usual gain, lost on some contractions)
        panel_outer = True
    inside = [extents.get(d, ext.get(d, 1)) for d in outer_m]
    if rows_o and not (inside and extents[row] % factor):  # (a tailed row loop fuses with none before it)
        inside.append(extents[rows_o])
    uneven_panels = bool(col_o) and bool(outer_m or rows_o) and few_uneven_panels(extents[col_o], width, ncol, threads)
    # (only where rows outermost would re-read more than half of L2 of the column operand between two iterations of
    # the loops outside the rows: a smaller slice stays cached, 0.93x with panels in turn over a 0.2 MB slice)
    panels_in_turn = uneven_panels and panel_outer and not _batch_dims(a, b, st) \
        and not (_is_window(a) or _is_window(b) or consts and {a.tensor, b.tensor} & consts) \
        and FLOAT32_BYTES * _slice(b, st, outer_m) > target.l2_bytes // 2 \
        and rows_shared_under_panels(inside, threads)
    if uneven_panels and not panels_in_turn:
        # too few panels for the threads to share their columns evenly, the last one partial (a tailed loop is not
        # fused with the next): rows outermost, or one thread would do most of the work (a depthwise 3x3 conv over
        # 56 columns as 48 + 8). Two panels of 48 and 47 columns keep them outermost, and so do panels that the
        # rules above put outermost where the loops inside them share evenly: the panels then run one after the
        # other, the threads sharing each one's rows (the parallel loop below)
        panel_outer = False
    if col_o and (outer_m or rows_o):
        panel_outer = kn.get(f"{s}.panel_outer", panel_outer, (False, True))
    if panel_outer:
        # (outside the row loops but inside a batch's loops, the output dims both operands walk: a panel is not
        # reused from one batch to the next, so each batch's panel is read while it is still in cache: this
        # matters most for many small GEMMs with a large constant operand each, as Winograd's batched matmuls)
        batch = _batch_dims(a, b, st)
        if rows2_i and rows2_dim in batch:  # (its outer loop walks the batch too)
            batch |= {f"{rows2_dim}_o"}
        rest = [d for d in outer_m if d not in batch]
        if keep is None and not rows2_i and not _is_window(a) and not _is_window(b) \
                and not (consts and {a.tensor, b.tensor} & consts):
            # (measured on run-time operands only, as the reduction block below)
            panel_bytes = FLOAT32_BYTES * width * math.prod(ext[d] for d in reduce_dims)
            rest = column_dims_first(rest, a, b, st, panel_bytes, target.l2_bytes,
                                     target.cache_line_bytes // FLOAT32_BYTES)
        outer = [d for d in outer_m if d in batch] + ([col_o] if col_o else []) \
            + rest + ([rows_o] if rows_o else [])
    else:
        outer = outer_m + ([rows_o] if rows_o else [])
        if col_o:
            # the panels between the row loops: each panel stays in cache across the inner row loops
            # (innermost, a panel is reloaded for every row block; outermost, the rows' operand leaves the
            # cache between panels)
            pos = 1 if rows2_i else len(outer)
            if not rows2_i and rows_o and len(outer) > 1 and _slice(b, st, outer_m) >= _slice(a, st, outer_m):
                # the same rule as panel_outer's, for each iteration of the outer loops (the panels cannot go
                # above them: a row-wise epilogue, a batch): where the column operand they sweep is the bigger
                # one, innermost would read all of it again for every row block (a 3072 x 768 weight under
                # 16 batches of 128 rows: 9.4 MB per block of 6 rows), so its panels go just outside the row loop
                pos = len(outer) - 1
            pos = kn.get(f"{s}.panel_pos", pos, tuple(range(1, len(outer) + 1))) if len(outer) > 1 else len(outer)
            outer = outer[:pos] + [col_o] + outer[pos:]
    # unit loops (a batch of 1) innermost among the outer ones: the parallel loop must be a real one
    outer = [x for x in outer if extents.get(x, 2) > 1] + [x for x in outer if extents.get(x, 2) == 1]
    # an outer block of the first reduction (GotoBLAS' kc): the operands' panels of k_tile stay in cache
    # while the rows stream past; the register tile then accumulates a partial sum (init + read-modify-write)
    r0 = reduce_dims[0]
    k_tiles = divisor_like(ext[r0], 16, ext[r0] // 2, 8)
    k_tile, k_pos = 0, len(outer)
    plain_operands = not (_is_window(a) or _is_window(b) or consts and (a.tensor in consts or b.tensor in consts))
    if plain_operands and col_o and rows_o and col_o in outer and outer.index(col_o) < outer.index(rows_o):
        # a column panel over the whole reduction past half of L2 is read from the next cache again for every
        # block of rows: the first reduction is blocked so that the panel's slice fits, and its loop goes just
        # outside the row blocks, which then all read the slice while it is in L2 (kil,lkj->ij's 64 columns over
        # 64 x 130 steps, a 2.1 MB panel, as slices of 16 x 130 steps: 1.42x on 2 cores of an Intel Xeon). (Not
        # for a conv's window, nor a constant weight: the graph search weighs those kernels' layouts by their
        # default schedules, and this one was measured on plain run-time operands only)
        per_step = FLOAT32_BYTES * width * math.prod(ext[d] for d in reduce_dims) // ext[r0]
        fits = [t for t in k_tiles if ext[r0] % t == 0 and t * per_step <= target.l2_bytes // 2]  # (no tail block)
        if per_step * ext[r0] > target.l2_bytes // 2 and fits:
            k_tile, k_pos = max(fits), outer.index(rows_o)
    k_tile = kn.get(f"{s}.k_tile", k_tile, [0] + k_tiles) if ext[r0] >= 32 and keep is None else 0
    if k_tile and k_tile < ext[r0]:
        prims.append(Split(s, r0, k_tile))
        k_pos = kn.get(f"{s}.k_pos", k_pos, tuple(range(1, len(outer) + 1)) or (0,))
        outer = outer[:k_pos] + [f"{r0}_o"] + outer[k_pos:]
        reduce_dims = [f"{r0}_i"] + reduce_dims[1:]
    walks = {lp: {lp} for lp in outer_m} | {rows_o: {row}, col_o: set(n_dims)}
    if rows2_i:
        walks[f"{rows2_dim}_o"] = {rows2_dim}
    # a column panel read in place, past the L1: the leading reductions outside the row loops (reduction_blocks)
    hoisted: list[str] = []
    split_tail = None  # (the row loop the threads share, where its parts are uneven)
    linear = fused and ncol > width and width % ext[n_dims[-1]] != 0
    if linear and plain_operands and keep is None and not rows2_i and not (k_tile and k_tile < ext[r0]) \
            and not _batch_dims(a, b, st):
        row_loops = [lp for lp in outer if lp in outer_m and extents.get(lp, ext.get(lp, 1)) > 1]
        tiles = math.prod(extents.get(lp, ext.get(lp, 1)) for lp in outer if lp != col_o)
        block = reduction_block(reduce_dims, {**ext, **extents}, width, row_loops, tiles, threads, target.l1_bytes)
        if block is not None and kn.get(f"{s}.red_block", True, (True, False)):
            split, part = block.split, block.part
            prims.append(Split(s, split, part))
            lo, li = f"{split}_o", f"{split}_i"
            extents[lo], extents[li] = math.ceil(ext[split] / part), part
            walks[lo] = walks[li] = {split}
            split_tail = lo if ext[split] % part else None
            r = reduce_dims[block.at]
            hoisted, reduce_dims = reduce_dims[:block.at], reduce_dims[block.at:]
            if block.block < ext[r]:
                prims.append(Split(s, r, block.block))
                hoisted, reduce_dims = hoisted + [f"{r}_o"], [f"{r}_i"] + reduce_dims[1:]
            outer = [lo] + ([col_o] if col_o else []) + hoisted \
                + [li if lp == split else lp for lp in outer if lp != col_o]
    if keep is not None and outer:
        # the parallel loop may only walk kept dims (threads would otherwise update one folded element): all
        # of them outermost, so that they fuse into enough parallel work (capsule votes' batch alone is 2-8)
        outer = [x for x in outer if walks[x] <= keep] + [x for x in outer if not walks[x] <= keep]
    if layout is not None and len(outer) > 1 and not outer[0].startswith(f"{r0}_o") and not hoisted \
            and not (panels_in_turn and outer[0] == col_o):  # (those panels stay first: the threads share inside)
        # the parallel loop: a short first loop that the next cannot be fused with (a tail) leaves a thread idle
        # part of the time (3 iterations on 2 threads: a third); an outer loop that divides better goes first
        tails = {col_o if col_o and ncol % width else None, rows_o if rows_o and extents[row] % factor else None}

        def share(lp: str) -> float:
            n = extents[lp]
            return 1.0 if n >= 4 * threads else n / (math.ceil(n / threads) * threads)

        if share(outer[0]) < 0.8 and (outer[0] in tails or outer[1] in tails):
            better = [lp for lp in outer[1:] if share(lp) > share(outer[0]) and not lp.startswith(f"{r0}_o")]
            if better:
                first = max(better, key=share)
                outer = [first] + [x for x in outer if x != first]
    inner = reduce_dims + ([rows2_i] if rows2_i else []) + ([row_i] if row_i else []) + [col_i]
    reorder_at = len(prims)
    prims.append(Reorder(s, tuple(outer + inner)))
    prims.append(CacheWrite(s, reduce_dims[0]))
    if rows2_i:
        prims.append(Unroll(s, rows2_i))
    if row_i and kn.get(f"{s}.unroll", True, (True, False)):
        prims.append(Unroll(s, row_i))
    # the innermost reduction, when short (a conv window's columns), fully unrolled: gcc leaves loops rolled
    # at -O3, and a short loop around the tile's FMAs costs its counter and pointer updates at every step
    # (only a window loop, which indexes an operand together with an output dim: unrolling a short matrix
    # reduction such as capsule votes' 4 steps only grows the code)
    red_in = reduce_dims[-1]
    windowed = any(red_in in ix.vars() and set(ix.vars()) & set(st.out_dims) for acc in accs for ix in acc.index)
    if windowed and ext[red_in] <= UNROLL_REDUCTION and kn.get(f"{s}.unroll_red", True, (True, False)):
        prims.append(Unroll(s, red_in))
    prims.append(Vectorize(s, col_i))
    # the parallel loop: the outermost, or one inside it, the loops outside it then run in turn, each iteration
    # with all the threads (panels of a column operand one after the other, the threads sharing each one's rows)
    first = 0
    # a split loop with a tail cannot be fused
    tailed = {col_o if ncol % width else None, rows_o if rows_o and extents[row] % factor else None,
              split_tail,
              f"{rows2_dim}_o" if rows2_i and ext[rows2_dim] % rows2 else None}

    def fusable(lp: str) -> bool:
        return lp not in tailed and lp != f"{r0}_o" and lp not in hoisted \
            and (keep is None or walks[lp] <= keep)

    if keep is None and len(outer) > 1 and not hoisted:
        starts = [i for i in range(min(len(outer), 3)) if not outer[i].startswith(f"{r0}_o")]
        # panels outermost that the threads would share unevenly (a last partial panel cannot fuse with the rows
        # to even them out): one after the other, the threads sharing each one's row blocks. Not where that
        # splits the output's rows into short shares: the threads would write the same cache lines at their
        # shares' edges in every row, and wait on each other for them
        inner_dim = st.out_dims[-1]
        short_rows = inner_dim in walks.get(outer[1], {outer[1]}) \
            and ext[inner_dim] * FLOAT32_BYTES < threads * SHARED_ROW_LINES * target.cache_line_bytes
        uneven = outer[0] == col_o and ncol % width and 1 in starts \
            and (spread(extents[col_o], threads) > BALANCED or few_uneven_panels(extents[col_o], width, ncol, threads)) \
            and spread(shared_inside(outer, extents, threads, fusable), threads) <= BALANCED and not short_rows
        first = kn.get(f"{s}.par_pos", 1 if uneven else 0, tuple(starts) or (0,))
    if outer and not outer[first].startswith(f"{r0}_o") and (keep is None or walks[outer[first]] <= keep):
        # fuse outer loops until there is work for every thread
        chain = [outer[first]]
        for lp in outer[first + 1:]:
            if chain[-1] in tailed or not fusable(lp):
                break
            chain.append(lp)
        par = kn.get(f"{s}.par", 4, (1, 2, 4, 8, 16, 64))
        fprims, fname, fext = fuse_chain(s, chain, extents, par * threads)
        # one more loop fused where the threads would share the parallel loop unevenly (9 iterations on 2
        # threads: one of them idles a tenth of the time; 9 x 13 share within 1%)
        if len(fprims) + 1 < len(chain) and spread(fext, threads) > BALANCED:
            more = fuse_chain(s, chain, extents, fext + 1)
            if spread(more[2], threads) < spread(fext, threads):
                fprims, fname, fext = more
        # a loop that the threads share unevenly, which the next cannot fuse with (a tail: the last partial panel of
        # columns), goes inside that one, and fuses with the loop after it (9 slices of B over 2 threads, then
        # panels of 96 and 72 columns: the panels outside, each shared by the threads as 9 x 13 row tiles, 1.16x)
        if len(chain) == 1 and spread(fext, threads) > BLOCKER_OUT_SPREAD and first + 2 < len(outer):
            blocker, partner = outer[first + 1], outer[first + 2]
            movable = blocker in tailed and blocker not in hoisted and not blocker.startswith(f"{r0}_o") \
                and fusable(partner)
            if movable and spread(fext * extents[partner], threads) < spread(fext, threads) \
                    and kn.get(f"{s}.par_inside", True, (True, False)):
                outer = outer[:first] + [blocker, chain[0], partner] + outer[first + 3:]
                prims[reorder_at] = Reorder(s, tuple(outer + inner))
                fprims, fname, fext = fuse_chain(s, [chain[0], partner], extents, fext * extents[partner])
        prims += fprims
        prims.append(Parallel(s, fname))
    # pack the row operand where its broadcasts stride through it: a run-time operand whose innermost reduction
    # reads a new cache line at every step, re-read by several column panels, repays its per-call copy
    # (one core: A[j,n,m,i] at stride 18 over 11 panels 1.09x, A[n,j,i] at stride 483 over 5 panels 1.18x;
    # over 2 panels the copy costs more than it saves, 0.71-0.91x). The search may pack any row operand
    order_dims = [d for lp in outer if lp not in hoisted for d in sorted(walks.get(lp, {lp}))]
    # (a fused column loop split across its inner dim is made linear over every tensor's own layout (``linear``):
    # no operand of the stage may then be packed)
    a_perm = row_pack_perm(a, row, reduce_order, order_dims, st) if pack and a.tensor in inputs and not linear \
        else None
    if a_perm is not None:
        flat_a = flat_offset(a.index, types[a.tensor].shape) if types is not None and a.tensor in types else None
        line_per_step = flat_a is not None \
            and abs(flat_a.coeff(reduce_order[-1])) * types[a.tensor].np_dtype.itemsize >= target.cache_line_bytes
        passes = extents.get(col_o, 1) if col_o else 1
        if line_per_step and row is not None and abs(flat_a.coeff(row)) == 1 and extents[row] > factor:
            # a tile of fewer rows than a line holds, along the operand's unit stride: each line it reads is read
            # again by the tiles beside it, a pass each (27 rows in tiles of 7: a line of 16 by 3 tiles)
            passes *= math.ceil(min(target.cache_line_bytes // types[a.tensor].np_dtype.itemsize, extents[row])
                                / factor)
        blocks = refetch_blocks(n_dims, extents[col_o] if col_o else None, row, extents[rows_o] if rows_o else None)
        refetched = _refetched_rows(a, flat_a, {row, rows2_dim if rows2_i else None}, st, types, target, b,
                                    order_dims, blocks)
        short = _short_runs(a, flat_a, row, reduce_order, st, types, target)
        if kn.get(f"{s}.pack_rows", scores is not None and (line_per_step and passes >= ROW_PACK_PASSES
                                                            or refetched > 1 and refetched * passes >= ROW_REFETCH
                                                            or short and passes >= ROW_PACK_PASSES),
                  (False, True)):
            prims.append(Pack(a.tensor, a_perm))
    # pack the column operand so the vector loop reads it contiguously (not a linear fused loop: the unit_run
    # columns already read every tensor's own layout with unit stride)
    roles = pack_roles(b, n_dims, reduce_order, st) if pack and b.tensor in inputs and not linear else None
    if roles is not None:
        rest, red, cols = roles
        axes = b.index
        perm = tuple(rest + red + cols)
        worth = not (perm == tuple(range(len(axes))) and consts is not None and b.tensor not in consts
                     and 4 * _footprint(b, st) <= target.l2_bytes and row_blocks < PACK_REREADS)
        # (a cache-resident run-time operand already laid out [.., reduction, columns], read by few row blocks: a
        # per-call copy costs more than it saves; a large one is still packed: its strided panels thrash the TLB;
        # and so is one that many row blocks read again: each reads every step's columns from lines that are
        # not the tile's own, where a packed panel is whole, aligned lines)
        if not kn.get(f"{s}.pack", worth, (True, False)):
            return prims
        shape = types[b.tensor].shape if types is not None else None
        inner = math.prod(shape[i] for i in cols[1:]) if shape is not None else 0
        if len(cols) == 1 and ncol > width:
            prims.append(Pack(b.tensor, perm, len(perm) - 1, width))
        elif len(cols) > 1 and ncol > width and inner and width % inner == 0 and ncol == inner * shape[cols[0]] \
                and kn.get(f"{s}.pack_panels", ncol >= 4 * width or layout is not None and ncol % width != 0,
                           (True, False)):
            # several column axes (j, l of C[i,j,k,l]): split the outer one so each tile's columns form one
            # contiguous panel over the reductions ([j_o][m][n][j_i][l]). Unsplit, every reduction step reads a
            # tile's share of a row of all the columns: where that is a small share (576 columns, 48 per tile:
            # a panel of 4096 steps spans 192 pages) the reads miss the TLB (1.29x measured on that einsum);
            # a third of each row (capsule votes' 128 columns by 48) streams well enough, and is not split, unless
            # the last tile is partial: the panels are zero-filled to whole tiles, so it runs as a full vector tile
            # instead of scalar code (268 columns by 96: a third of the work)
            prims.append(Pack(b.tensor, perm, len(rest) + len(red), width // inner))
        elif perm != tuple(range(len(axes))):
            prims.append(Pack(b.tensor, perm))
    return prims


def _register_rows(vectors: int, target: Target) -> int:
    """The most rows of a register tile ``vectors`` wide that leave room in the register file for a row of the
    column operand and a broadcast."""
    return (target.vector_registers - vectors - 1) // vectors


def is_contraction(st: Statement) -> bool:
    accs = product_accesses(st.expr)
    return st.reduce == "+=" and bool(st.reduce_dims) and accs is not None and len(set(accs)) >= 2


def final_contraction(compute: Compute) -> tuple[list[Statement], Statement, Statement | None]:
    """(the statements before it, the last contraction, its elementwise epilogue or None): the last
    statement, or the one before it when the last only scales or shifts it at its own index (the
    softmax's ``O[i, j] = S[i, j] * R[i]`` after ``S[i, j] += E[i, k] * V[k, j]``)."""
    stmts = list(compute.statements)
    last = stmts[-1]
    if len(stmts) >= 2 and last.reduce == "=" and is_contraction(stmts[-2]):
        prev = stmts[-2]
        own = tuple(Affine.dim(d) for d in last.out_dims)
        reads = [a for a in last.expr.accesses() if a.tensor == prev.out]
        if reads and all(a.index == own for a in reads) and prev.out_shape == last.out_shape \
                and prev.out not in compute.outputs and not last.padding:
            return stmts[:-2], prev, last
    return stmts[:-1], last, None
