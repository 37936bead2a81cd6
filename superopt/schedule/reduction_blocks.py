"""Blocks of the reduction outside the row loops, for a column panel that is read where it lies (GotoBLAS' kc).

A register tile reads its panel of the column operand, ``width`` columns at every reduction step. Where the panel
is packed, each step's columns are the next whole lines of one stream, and the panel streams from L2 well enough
(sgemm at 84% of the tile ceiling). Where it is read in place (two fused column axes split across their inner one,
which no pack can lay out), each step's columns are a few lines at the operand's row stride, and every row tile
reads its whole panel from L2 again: the loads wait on L2 (the panel of 64 x 2565 steps of ``jimkl`` read by 133
row tiles ran 1.9x faster when it fitted L1).

So the reduction goes in blocks outside the row loops, just inside the panel loop, each block the longest whose slice
of the panel fits :data:`PANEL_L1_SHARE` of the L1 (the innermost reduction loops whole, the next one split by a
divisor where it is too long): every row tile then reads the same slice from L1, and the tile is written back (read,
added, stored) once per block. The threads share the row loops: one of them is split in as many parts as threads,
outermost, so that each thread's rows reuse every slice it reads. The knob ``<stage>.red_block`` lets the search
turn it off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PANEL_L1_SHARE = 0.75  # of the L1 the panel's slice under one block may take (the row operand's lines stream past)
MIN_BLOCK_STEPS = 64  # reduction steps at least in one block: the tile is read and stored again after each (blocks of
# 57 steps under a scattered 6-D output: 0.86x)
MIN_ROW_TILES = 8  # row tiles at least that each thread runs over one slice of the panel
MIN_SHARE = 0.8  # of the threads' time that the split row loop keeps busy (19 rows as 10 + 9: 0.95)


@dataclass(frozen=True)
class ReductionBlock:
    """The reduction loops before ``at`` go outside the row loops, and ``at`` too where ``block`` is its whole
    extent; otherwise ``at`` is split in blocks of ``block`` steps, the loop over its blocks outside. The row loop
    ``split`` is cut in parts of ``part``, outermost, shared by the threads."""

    at: int
    block: int
    split: str
    part: int


def reduction_block(reduce_dims: Sequence[str], extents: Mapping[str, int], width: int, row_loops: Sequence[str],
                    row_tiles: int, threads: int, l1_bytes: int, itemsize: int = 4) -> ReductionBlock | None:
    """The blocking for a tile of ``width`` columns over ``reduce_dims`` (outermost first) under the outer row loops
    ``row_loops`` (``row_tiles`` tiles in all), or None where the whole panel already fits, no block of at least
    :data:`MIN_BLOCK_STEPS` steps fits, or no row loop divides over the threads. The block is the longest that fits:
    the innermost loops whole, the next one whole or split by its largest divisor that fits."""
    fit = PANEL_L1_SHARE * l1_bytes / (width * itemsize)  # (steps)
    if math.prod(extents[d] for d in reduce_dims) <= fit:
        return None
    at, block = None, 0
    for k, d in enumerate(reduce_dims):
        rest = math.prod(extents[x] for x in reduce_dims[k + 1:])
        if extents[d] * rest <= fit:  # (whole: the loops before it go outside)
            at, block = k, extents[d]
            break
        block = max((t for t in range(2, extents[d]) if extents[d] % t == 0 and t * rest <= fit), default=0)
        if block and block * rest >= MIN_BLOCK_STEPS:
            at = k
            break
    if at is None or block * math.prod(extents[x] for x in reduce_dims[at + 1:]) < MIN_BLOCK_STEPS:
        return None

    def share(lp: str) -> float:
        n = extents[lp]
        return n / (math.ceil(n / threads) * threads)

    loops = [lp for lp in row_loops if extents[lp] >= threads and share(lp) >= MIN_SHARE]
    if not loops or row_tiles < MIN_ROW_TILES * threads:
        return None
    split = max(loops, key=share)  # (the first of the best: outermost)
    return ReductionBlock(at, block, split, math.ceil(extents[split] / threads))
