"""The register-tiled schedule of a conv on blocked (NCHWc) tensors, as the layout pass writes it.

``P[n,cob,y,x,co_l] += X_c[n,cib,y+kh,x+kw,ci_l] * W_c[cob,cib,kh,kw,ci_l,co_l]``: the output-channel
lanes ``co_l`` are the vector loop, ``cob_tile`` neighbouring output-channel blocks (``cob_i``) the
tile's vector columns and a run of ``rows`` output columns ``x`` its rows; the image is read as one
broadcast per row and reduction step, each weight block as contiguous vectors (no packing: ``W_c`` is
already laid out panel by panel). One block of 16 lanes is one AVX-512 vector: with one vector per row
each broadcast feeds one FMA and the loads outnumber them; two blocks (two vectors a row) halve the
loads per FMA, which is what lets the tile approach the FMA ceiling instead of the load ports' limit
(benchmarks/peak.py --tiles times every tile shape against the FMA chains).

Rows come from the register file. The tile walks its rows (pixels) outside its vectors, so a row's
broadcast feeds all the vectors and dies: a tile of ``rows`` x ``vectors`` needs ``(rows + 1) * vectors
+ 2`` registers (4 x 6 and 2 x 12 with 32). With the vectors outside (knob ``rows_outer`` off; AVX2's
default, where it did not spill) gcc keeps every row's broadcast in a register, ``rows * (vectors + 1) + 1``,
and spills at 4 x 6. With 16 registers, 7 rows of 2 vectors (``rows * vectors + 1``) do not spill.
Fewer rows are no better: a tile needs ``Target.fma_chains`` accumulators (FMA pipes x latency) or each
FMA waits for the one before it, so the rows that waste fewest padded columns are chosen among those that
have enough (squeezenet's stem, 111 columns, takes 2 x 8 with one padded row, not the 2 x 3 that divides 111).

The reduction can run in steps of ``red_block`` input-channel blocks outside the image loops, so that
one step's weights stay in L1 while a thread sweeps its rows (the partial sums live in the output, the
epilogue runs at the last step; see :func:`default_red_block`).

Knobs ``<stage>.cob_tile``, ``<stage>.rows_outer``, ``<stage>.red_block``, ``<stage>.panel_outer`` and
``<stage>.par`` keep the schedule searchable (``<stage>.rows`` is recorded with the one value the register
budget gives: the learned cost model, trained on NCHW kernels, picked spilling row counts for blocked convs).
"""


from __future__ import annotations

import math

from superopt.ir.expr import Access, Binary
from superopt.ir.statement import Statement
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.primitives import (
    CacheWrite,
    Fuse,
    Parallel,
    Prefetch,
    Primitive,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.target import Target

LANE_BLOCKS = (8, 16)
UNROLL_LANES = 4  # input lanes per unrolled reduction step (knob <stage>.unroll_lanes)
# the share of L1 one reduction step's weights may fill (default_red_block). Larger steps win when a kernel
# is timed alone, with its weights cached; in the graph the weights stream from L2 or memory and compete
# with the image for L1, so half of it is the default
RED_BLOCK_L1_SHARE = 0.5
WIDE_COB_TILE = 4  # output-channel blocks of the wide tile (see wide_tile_rows; knob <stage>.cob_tile)


def _operands(st: Statement) -> tuple[Access, Access] | None:
    e = st.expr
    if isinstance(e, Binary) and e.op == "*" and isinstance(e.a, Access) and isinstance(e.b, Access):
        return e.a, e.b
    return None


def _row_block(n: int, most: int, least: int = 2) -> int:
    """Rows per tile: the largest of most..least that wastes fewest padded rows (least: the fewest rows
    whose tile has enough independent FMA chains, see :attr:`Target.fma_chains`; 2 when none of the
    allowed row counts has). Without the floor, 111 output columns would take 3 rows (111 = 3 x 37, no waste):
    2 x 3 accumulators are too few chains to hide the FMA latency, which costs more than one padded row."""
    if n <= most:
        return n
    least = least if least <= most else 2
    return min(range(most, least - 1, -1), key=lambda r: (math.ceil(n / r) * r - n, -r))


def default_cob_tile(target: Target, lane_block: int, cob_blocks: int) -> int:
    """Output-channel blocks per register tile by default: two vectors a row where the register file has
    room for a tile of them (32 registers; AVX2's 16 keep the one-block tile, measured there before this
    choice existed), and a divisor of the block count."""
    vectors = math.ceil(lane_block / target.lanes("float32"))
    want = max(1, 2 // vectors) if target.vector_registers >= 32 else 1
    return max(c for c in (1, 2) if c <= want and cob_blocks % c == 0)


def _most_rows(target: Target, tile_vectors: int, rows_outer: bool | None = None) -> int:
    """The most rows a tile of ``tile_vectors`` accumulators a row holds without spilling. With the rows
    (pixels) outside the tile's vectors (``rows_outer``, the default on 32 registers) a row's broadcast
    dies after its FMAs: the accumulators, the tile's weight vectors, a broadcast and a spare count (4 x 6
    and 2 x 12 on AVX-512, against the 2 x 10 the other order allows). With the vectors outside, gcc keeps
    every row's broadcast in a register (seen in its output); with 16 registers it interleaves them (AVX2's
    7 x 2 does not spill), so only the accumulators and a weight vector count."""
    regs = target.vector_registers
    if rows_outer is None:
        rows_outer = regs >= 32
    if regs < 32:
        per_row, spare = tile_vectors, 1
    elif rows_outer:
        per_row, spare = tile_vectors, tile_vectors + 2
    else:
        per_row, spare = tile_vectors + 1, 1
    return max(2, min(12, (regs - spare) // per_row))


def wide_tile_rows(target: Target, lane_block: int, cob_blocks: int, cols: int) -> int:
    """Rows of the wide tile (``WIDE_COB_TILE`` output-channel blocks, one vector each, the most rows the
    registers hold: 4 x 6 = 24 accumulators on AVX-512, 10 loads per 24 FMAs where 2 x 8 takes 10 per 16),
    or 0 where it does not apply: it needs the block count divisible by 4 and at least as many columns
    as rows. It is taken even where 6-column tiles pad rows (14 columns compute 18, 7 compute 12): the
    better ratio of loads to FMAs pays for the padded columns once the weights sit on a cache line
    (``superopt.ir.graph.Constant``; a weight vector split over two lines costs more than the padding saves).
    4 x 7 spills, and narrower tiles at 14 and 7 columns give back the load ratio they were meant to save."""
    if target.vector_registers < 32 or lane_block != target.lanes("float32") \
            or cob_blocks % WIDE_COB_TILE:
        return 0
    rows = _most_rows(target, WIDE_COB_TILE)
    return rows if cols >= rows else 0


# a 1-D tile pads much when it computes at least this many times the output columns: then a 2-D tile where
# the image height allows one (two_d_tile_rows), else fewer columns (tile_columns)
TWO_D_MIN_WASTE = 1.2


def _pads_much(width: int, columns: int) -> bool:
    return math.ceil(width / columns) * columns >= TWO_D_MIN_WASTE * width


def two_d_tile_rows(height: int, width: int, rows: int) -> int:
    """Image rows of the register tile by default (knob ``<stage>.y_rows``; each of ``rows // y_rows``
    columns): 2 or 3 where that divides the image's height and computes fewer padded output pixels than
    the 1-D tile of ``rows`` columns, when that one pads at least ``TWO_D_MIN_WASTE`` of them; else 1.
    A 2-D tile saves padded columns (14 columns: 18 computed -> 15 with 2 x 3 against 1 x 6) but adds a tail
    of image rows where the height is odd (7 x 7: 8 computed rows of 7), and where the 1-D tile pads little
    (56 columns: 60 -> 57) the shorter rows cost more than the padding saved; hence the waste threshold."""
    if not _pads_much(width, rows):
        return 1

    def computed(yr: int) -> int:
        xr = max(1, rows // yr)
        return math.ceil(height / yr) * yr * math.ceil(width / xr) * xr
    one_d = computed(1)
    exact = [yr for yr in (2, 3) if yr <= height and height % yr == 0 and rows // yr >= 1 and computed(yr) < one_d]
    return min(exact, key=lambda yr: (computed(yr), yr), default=1)


def tile_columns(width: int, rows: int, y_rows: int) -> int:
    """Output columns per register tile: ``rows // y_rows`` for a 2-D tile; for a 1-D tile that pads at least
    ``TWO_D_MIN_WASTE`` of the columns, the count among ``rows`` down to two thirds of it that pads fewest
    (7 columns: 4 x 4 computes 8 where 4 x 6 computes 12, a third fewer FMAs for the same loads); else ``rows``."""
    if y_rows > 1:
        return max(1, rows // y_rows)
    if not _pads_much(width, rows):
        return rows
    least = max(1, math.ceil(2 * rows / 3))
    return min(range(rows, least - 1, -1), key=lambda r: (math.ceil(width / r) * r, -r))


def default_red_block(target: Target, blocks: int, splits: tuple[int, ...], step_bytes: int) -> int:
    """Input-channel blocks per reduction step: all of them (one step) when a tile's weights fit in half
    of L1, else the most whose weights do (at least one): a step whose weights stay in L1 while a thread
    sweeps its rows reads them from L1 at every row instead of from L2. Convs whose weights fit already get
    that in one step, and splitting them only adds passes over the partial sums, so they are not split."""
    budget = int(target.l1_bytes * RED_BLOCK_L1_SHARE)
    if blocks * step_bytes <= budget:
        return blocks
    return max([b for b in splits if b < blocks and b * step_bytes <= budget], default=min(splits))


def default_prefetch(target: Target, weight_bytes: int, window: bool) -> bool:
    """Whether the next reduction step's weights are fetched while a step computes (knob ``<stage>.prefetch``):
    for 1x1 convs whose weights do not fit in a core's L2, which stream them from L3 or memory in the graph.
    Where the weights fit in L2 the hardware prefetchers already keep up and the extra fetches only take
    load slots; for 3x3 convs a step's weights of the window do not stay in L1, so the fetches compete with
    the step's own L2 reads."""
    return target.kind == "cpu" and not window and weight_bytes >= target.l2_bytes


def conv_efficiency(target: Target, lane_block: int, cob_blocks: int) -> float:
    """The default tile's expected fraction of the FMA ceiling, for the layout choice's cost: full with two
    whole vectors a row (each broadcast feeds two FMAs), half with one, less where a block fills only part
    of a vector (8 lanes on a 16-lane ISA)."""
    lanes = target.lanes("float32")
    vectors = math.ceil(lane_block / lanes)
    fill = lane_block / (vectors * lanes)
    return fill * min(1.0, default_cob_tile(target, lane_block, cob_blocks) * vectors / 2)


def blocked_conv_schedule(st: Statement, target: Target, consts: frozenset[str] | None,
                          knobs: KnobRecorder | None = None) -> list[Primitive] | None:
    """The schedule of a blocked conv statement, or None when ``st`` is not one (the caller falls back)."""
    kn = knobs or KnobRecorder()
    ops = _operands(st)
    if st.reduce != "+=" or ops is None or len(st.out_dims) != 5 or not st.reduce_dims:
        return None
    lane = st.out_dims[-1]
    ext = st.extent
    if ext[lane] not in LANE_BLOCKS:
        return None
    ws = [a for a in ops if a.index[-1].is_plain_dim and a.index[-1].dims[0] == lane]
    if len(ws) != 1 or (consts is not None and ws[0].tensor not in consts):
        return None
    w = ws[0]
    x = next(a for a in ops if a is not w)
    if any(lane in ix.dims for ix in x.index) or not all(ix.is_plain_dim for ix in w.index):
        return None
    n, cob, y, col = st.out_dims[:4]
    if any(d in ix.dims for ix in w.index for d in (y, col)):
        return None
    s = st.out
    vectors = math.ceil(ext[lane] / target.lanes("float32"))  # per output-channel block
    fits = [c for c in (1, 2, 4) if ext[cob] % c == 0 and c * vectors + 2 <= target.vector_registers // 2]
    wide = wide_tile_rows(target, ext[lane], ext[cob], ext[col])
    cob_tile = kn.get(f"{s}.cob_tile", WIDE_COB_TILE if wide else default_cob_tile(target, ext[lane], ext[cob]),
                      tuple(fits))
    tile_vectors = cob_tile * vectors
    # the tile's pixels outside its output-channel blocks: each pixel's broadcast feeds all the tile's
    # vectors at once and dies, the weight vectors stay in registers (24 accumulators + 4 weights + 1
    # broadcast of 32). Blocks outside make gcc hoist every pixel's broadcast and spill accumulators.
    # AVX2's 16 registers keep the other order, which does not spill there
    rows_outer = kn.get(f"{s}.rows_outer", target.vector_registers >= 32, (False, True))
    most = _most_rows(target, tile_vectors, rows_outer)
    rows_default = wide if wide and cob_tile == WIDE_COB_TILE else \
        _row_block(ext[col], most, math.ceil(target.fma_chains / tile_vectors))
    rows = kn.get(f"{s}.rows", rows_default, (rows_default,))
    # image rows per tile: a 2-D tile of y_rows x (rows // y_rows) output pixels, where the columns alone pad
    y_rows = kn.get(f"{s}.y_rows", two_d_tile_rows(ext[y], ext[col], rows),
                    tuple(r for r in (1, 2, 3) if r <= ext[y] and rows // r >= 1))
    rows = tile_columns(ext[col], rows, y_rows)
    # the reduction: the activation's channel lanes innermost (a broadcast each), window and blocks outside
    red = list(st.reduce_dims)
    inner_red = [d for d in red if x.index[-1].is_plain_dim and x.index[-1].dims[0] == d]
    red = [d for d in red if d not in inner_red] + inner_red
    prims: list[Primitive] = []
    if cob_tile > 1:
        prims.append(Split(s, cob, cob_tile))
        cob_o, cob_i = f"{cob}_o", f"{cob}_i"
    else:
        cob_o, cob_i = cob, None
    if ext[col] > rows:
        prims.append(Split(s, col, rows))
        col_o, col_i = f"{col}_o", f"{col}_i"
    else:
        col_o, col_i = None, col
    if y_rows > 1:
        prims.append(Split(s, y, y_rows))
        y_o, y_i = f"{y}_o", f"{y}_i"
    else:
        y_o, y_i = y, None
    # weight panels outermost when the weights outweigh the image (deep layers): each panel then stays
    # in cache while the image streams past
    # (batched weights, indexed by the batch dim ``n`` as well, as a Winograd conv's transformed ones: one
    # conv per batch index, the batch loop outermost and the sizes compared per batch index)
    batched = any(n in ix.dims for ix in w.index)
    w_bytes = math.prod(ext[d] for d in {d for ix in w.index for d in ix.dims} - {n})
    x_bytes = math.prod(ext[d] for d in {d for ix in x.index for d in ix.dims} - ({n} if batched else set()))
    panel_outer = kn.get(f"{s}.panel_outer", w_bytes >= x_bytes, (False, True))
    spatial = [y_o] + ([col_o] if col_o else [])
    if batched:
        outer = [n] + ([cob_o] + spatial if panel_outer else spatial[:1] + [cob_o] + spatial[1:])
    else:
        outer = [cob_o, n] + spatial if panel_outer else [n] + spatial[:1] + [cob_o] + spatial[1:]
    image_rows = [y_i] if y_i else []
    if rows_outer:
        tile = image_rows + [col_i] + ([cob_i] if cob_i else []) + [lane]
    else:
        tile = ([cob_i] if cob_i else []) + image_rows + [col_i, lane]
    extents = {n: ext[n], y_o: math.ceil(ext[y] / y_rows)} | {cob_o: ext[cob] // cob_tile}
    if col_o:
        extents[col_o] = math.ceil(ext[col] / rows)
    tailed = {lp for lp, e, r in ((col_o, ext[col], rows), (y_o, ext[y], y_rows)) if lp and r > 1 and e % r}
    chain = [outer[0]]
    for lp in outer[1:]:
        if lp in tailed or chain[-1] in tailed:
            break
        chain.append(lp)
    par = kn.get(f"{s}.par", 4, (1, 2, 4, 8, 16, 64))
    fused = [chain[0]]
    size, divided = extents[chain[0]], False  # a fuse of two loops of extent > 1 cannot be fused again
    for nxt in chain[1:]:
        if size >= par * target.threads or divided and extents[nxt] > 1:
            break
        fused.append(nxt)
        divided = divided or (size > 1 and extents[nxt] > 1)
        size *= extents[nxt]
    # reduction blocks outside the image loops: each thread sweeps its image rows with one block of
    # ``red_block`` input-channel blocks' weights (kept in L1), the tile's partial sums in the output
    cib = next((d for d in red if x.index[1].is_plain_dim and x.index[1].dims[0] == d and d not in inner_red), None)
    blocks = ext[cib] if cib else 1
    splits = tuple(b for b in (1, 2, 4, 8) if b < blocks and blocks % b == 0) + (blocks,)
    step_bytes = math.prod(ext[d] for d in red if d != cib) * cob_tile * ext[lane] * 4  # weights per block
    red_block = kn.get(f"{s}.red_block", default_red_block(target, blocks, splits, step_bytes), splits)
    window = any(ext[d] > 1 for d in st.reduce_dims if d != cib and d not in inner_red)
    prefetch_at: tuple[str, str] | None = None
    if cib and red_block < blocks:
        prims.append(Split(s, cib, red_block))
        red = [f"{cib}_i"] + [d for d in red if d != cib]
        outer = fused + [f"{cib}_o"] + [d for d in outer if d not in fused]
        # the next reduction step's weights fetched while this one sweeps the image (knob <stage>.prefetch)
        after = {d: extents.get(d, 1) for d in outer[len(fused) + 1:]} | {red[0]: red_block}
        spread = next((d for d, e in after.items() if e > 1), None)
        if spread is not None and kn.get(f"{s}.prefetch", default_prefetch(target, w_bytes * 4, window),
                                         (False, True)):
            prefetch_at = (f"{cib}_o", spread)
    # the input lanes (one broadcast each) unrolled by ``unroll_lanes``: an inner loop of that many steps,
    # unrolled whole (gcc does not unroll at -O3; partial-unroll pragmas are ignored on loops that hold the
    # tile's loops). Rolled, the loop keeps pointer updates and spills per step; unrolling all 16 lanes gains
    # nothing over 4 and multiplies the compile time (gcc's alias walks over hundreds of tile loops)
    lanes_red = inner_red[0] if inner_red else None
    unroll = kn.get(f"{s}.unroll_lanes", min(UNROLL_LANES, ext[lanes_red]) if lanes_red else 1,
                    tuple(u for u in (1, 2, 4, 8, 16) if lanes_red and ext[lanes_red] % u == 0) or (1,))
    unrolled = None
    if lanes_red and 1 < unroll < ext[lanes_red]:
        prims.append(Split(s, lanes_red, unroll))
        red = red[:-1] + [f"{lanes_red}_o", f"{lanes_red}_i"]
        unrolled = f"{lanes_red}_i"
    elif lanes_red and unroll == ext[lanes_red] > 1:
        unrolled = lanes_red
    prims.append(Reorder(s, tuple(outer + red + tile)))
    prims.append(CacheWrite(s, red[0]))
    if cob_i:
        prims.append(Unroll(s, cob_i))
    if y_i:
        prims.append(Unroll(s, y_i))
    prims.append(Unroll(s, col_i))
    if unrolled:
        prims.append(Unroll(s, unrolled))
    prims.append(Vectorize(s, lane))
    name = fused[0]
    for nxt in fused[1:]:
        prims.append(Fuse(s, name, nxt))
        name = f"{name}_{nxt}"
    prims.append(Parallel(s, name))
    if prefetch_at is not None:
        prims.append(Prefetch(s, w.tensor, *prefetch_at))
    return prims
