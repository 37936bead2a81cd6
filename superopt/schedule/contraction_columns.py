"""Which operand and which of its output dims a contraction's register tile vectorizes, chosen by contiguity
and lane use (GETT-style), for contractions whose operands are indexed by plain dims in any order.

The tile's columns are one output dim of the column operand, or two of them fused into one loop; the column
operand is then packed so that the columns are its innermost, contiguous axis (``pack_roles``), whatever its
own order, and the output tile is written back lane by lane where the output is strided along them. What is
left to choose is how well the vectors are filled: a fused pair of dims can only be split into tiles of a
multiple of its inner extent (``C[..., j, i]`` with 6 ``i``: 48 or 96 columns, never 64), and a tile whose
width is not a whole number of vectors is printed as a scalar loop over a float array instead of vector
registers (``superopt.codegen.c_vector_tile``), several times slower. Each candidate is scored by the share
of vector lanes that do useful work, lowered where the tile is not whole vectors, one vector narrow (a load
per FMA row), or has few rows to reuse each vector over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from superopt.ir.expr import Access
from superopt.ir.statement import Statement

SCALAR_TILE = 0.2  # a tile not of whole vectors, printed as a scalar loop: its share of a vector tile's speed
# FMAs per value loaded (vectors of the column operand and broadcasts of the row operand) of a rows x vectors
# tile at which the loads no longer bound it: 8 x 3 and 6 x 4 reach it, 8 x 1 (8 FMAs for 9 loads) less than half
TILE_INTENSITY = 2.2
CONTIGUOUS_ROWS = 1.1
OUTPUT_RUN_ROWS = 1.1  # rows along the output's unit stride, where the tile's lanes lie lines apart there
WIDE_TILE = 0.95  # a tile wider than the usual micro-kernel's (8 x 3, 6 x 4 vectors) only where it fills better
SWITCH_GAIN = 1.15  # a candidate replaces the position-chosen columns only when it scores this much higher
# the output's dims reordered so that a run of the column operand's dims is innermost, only where that pair's
# tile scores this much better than every tile in the output's own layout
OUTPUT_MOVE_GAIN = 1.15
# the columns moved to the operand at most half the size (the cheaper per-call pack) where its best tile scores
# within this factor of the chosen one
SMALLER_PACK_GAIN = 1.15


@dataclass(frozen=True)
class Columns:
    """The column operand (``operand``: index into the statement's two product accesses), the output dims
    fused into the column loop (outer first), the tile width in elements, and the score it was chosen by."""

    operand: int
    dims: tuple[str, ...]
    width: int
    score: float


def _dims(acc: Access) -> set[str]:
    return {d for ix in acc.index for d in ix.dims}


def plain(acc: Access) -> bool:
    """Every axis indexed by one dim (no windows, strides or reshapes folded into the read)."""
    return all(ix.is_plain_dim for ix in acc.index)


def lane_score(ncol: int, width: int, inner: int, lanes: int) -> float:
    """Useful lanes over the lanes computed for ``ncol`` columns in tiles of ``width`` (the last tile runs
    whole over the zero-filled packed panel), lowered for tiles not of whole vectors.
    ``inner``: the extent a fused loop's tiles must be a multiple of (1 for a single dim)."""
    if width % inner and width < ncol:
        return 0.0  # a fused loop splits only by multiples of its inner extent
    width = min(width, ncol)
    vectors = math.ceil(width / lanes)
    score = ncol / (math.ceil(ncol / width) * vectors * lanes)
    if width % lanes:
        score *= SCALAR_TILE
    return score


def tile_rows(vectors: int, registers: int) -> int:
    """The most rows of a register tile ``vectors`` wide (as the contraction schedule splits them): 8 rows of up
    to 3 vectors, 6 of 4 on a 32-register file, and for wider tiles what fits the registers with the loads."""
    wide = 4 if registers >= 32 else 2
    if vectors > wide:
        return max(2, (registers - vectors - 2) // vectors)
    return 6 if vectors >= 4 and wide == 4 else 8


def widths(ncol: int, inner: int, lanes: int, most_vectors: int) -> list[int]:
    """Candidate tile widths: whole vectors up to ``most_vectors``, multiples of a fused loop's inner extent,
    and all the columns in one tile where they fit."""
    out = [w * lanes for w in range(1, most_vectors + 1)]
    if inner > 1:
        out += [w for w in range(inner, most_vectors * lanes + 1, inner) if w not in out]
        # wider tiles of whole vectors where the inner extent divides no narrower one (2 x 40 = 5 vectors, in
        # fewer rows): every tile full, instead of a tile printed as scalars
        out += [w for w in range(inner, 2 * most_vectors * lanes + 1, inner) if w > most_vectors * lanes
                and w % lanes == 0]
    if ncol < most_vectors * lanes and ncol not in out:
        out.append(ncol)
    return out


def best_width(ncol: int, inner: int, lanes: int, most_vectors: int = 4, rows: Sequence[int] = (),
               registers: int = 32) -> tuple[int, float]:
    """The width of the best :func:`lane_score` times the :func:`row_use` of the best of the row extents ``rows``
    in a tile that wide (the widest of equal scores), and that score."""
    def score(w: int) -> float:
        vectors = math.ceil(min(w, ncol) / lanes)
        most = tile_rows(vectors, registers)
        wide = WIDE_TILE if vectors > (4 if registers >= 32 else 2) else 1.0
        return lane_score(ncol, w, inner, lanes) * (max(row_use(n, most, vectors) for n in rows) if rows else 0.3) \
            * wide
    w = max(widths(ncol, inner, lanes, most_vectors), key=lambda w: (score(w), w))
    return w, score(w)


def choose_columns(st: Statement, accs: Sequence[Access], lanes: int, registers: int = 32,
                   linear: Callable[[str, str], bool] | None = None
                   ) -> dict[tuple[int, tuple[str, ...]], Columns] | None:
    """Every candidate (operand, column dims) of ``out += A * B`` at its best width with its score, or None
    when an operand is not indexed by plain, distinct dims (windows, reshapes, diagonals: the position-based
    choice stays). ``linear(outer, inner)``: whether every tensor holds the pair as one contiguous run, so that
    their fused loop splits by any width (not only by multiples of the inner extent)."""
    if len(accs) != 2 or st.pad_value or not all(plain(a) for a in accs):
        return None
    if any(len({ix.dims[0] for ix in a.index}) != len(a.index) for a in accs):
        return None  # a diagonal read (A[i, i])
    ext = st.extent
    most_vectors = 4 if registers >= 32 else 2
    out: dict[tuple[int, tuple[str, ...]], Columns] = {}
    for k, x in enumerate(accs):
        other = accs[1 - k]
        own = [d for d in st.out_dims if d in _dims(x) and d not in _dims(other) and ext[d] > 1]
        groups: list[tuple[str, ...]] = [(d,) for d in own]
        groups += [(d1, d2) for i, d1 in enumerate(own) for d2 in own[i + 1:]]
        for dims in groups:
            ncol = math.prod(ext[d] for d in dims)
            inner = ext[dims[-1]] if len(dims) == 2 and not (linear is not None and linear(*dims)) else 1
            rows = [ext[d] for d in st.out_dims if d not in dims and d not in _dims(x) and ext[d] > 1]
            w, score = best_width(ncol, inner, lanes, most_vectors, rows, registers)
            out[(k, dims)] = Columns(k, dims, w, score)
    return out


def pick(scores: Mapping[tuple[int, tuple[str, ...]], Columns], current: tuple[int, tuple[str, ...]]) -> Columns:
    """The best candidate, or the current one where it scores within :data:`SWITCH_GAIN` of the best (the
    position-chosen columns are the output's contiguous ones: written back with whole vector stores)."""
    best = max(scores.values(), key=lambda c: c.score)
    now = scores.get(current)
    return now if now is not None and now.score * SWITCH_GAIN >= best.score else best


def tile_use(rows: int, vectors: int) -> float:
    """How near a rows x vectors tile comes to keeping the FMA pipes busy: its FMAs per value loaded against
    :data:`TILE_INTENSITY`."""
    return min(1.0, rows * vectors / (rows + vectors) / TILE_INTENSITY)


def row_use(n: int, rows: int = 8, vectors: int = 3) -> float:
    """The share of a register tile's rows that do useful work over ``n`` rows in blocks of at most ``rows``,
    times the :func:`tile_use` of a block of those rows ``vectors`` wide."""
    block = rows if n >= 4 * rows else min(range(min(rows, n), min(4, rows, n) - 1, -1),
                                           key=lambda r: (math.ceil(n / r) * r - n, -r))  # (as the tile splits)
    return n / (math.ceil(n / block) * block) * tile_use(block, vectors)


def row_dim(candidates: Sequence[str], ext: Mapping[str, int], rows: int = 8, vectors: int = 3,
            contiguous: Collection[str] = (), output_run: Collection[str] = ()) -> str:
    """The row dim of the register tile among ``candidates`` (output dims the column operand does not read,
    innermost last): the best :func:`row_use` in blocks of at most ``rows``, the innermost of equals. A dim along
    which the row operand is ``contiguous`` scores :data:`CONTIGUOUS_ROWS` times more: a step's broadcasts of the
    block's rows then come from one cache line instead of one line each. One in ``output_run`` (the output's unit
    stride, where the tile's lanes lie lines apart there) scores :data:`OUTPUT_RUN_ROWS` times more: the tile is
    then written back as one run of rows per lane instead of one line per accumulator."""
    return max(reversed(candidates),
               key=lambda d: row_use(ext[d], rows, vectors) * (CONTIGUOUS_ROWS if d in contiguous else 1.0)
               * (OUTPUT_RUN_ROWS if d in output_run else 1.0))
