"""Loops of a loop nest: a variable, an extent, a kind, an optional tail bound and reduction clauses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from superopt.ir.expr import Affine

if TYPE_CHECKING:
    from superopt.loopnest.statements import Node

# block_* / thread_*: a loop bound to a CUDA grid axis (one iteration per block or thread; see schedule.Bind).
# transposed: a loop of a vector's L lanes around one loop of L around one copy whose source runs along the inner
# loop with a stride and along this one contiguously, its target the other way round: the pair is one L x L
# block transposed through register shuffles (a CPU printer's so_transposeL; see loopnest.build, _Builder.transposed);
# with tails, a block that they cut short copies their bounds' rows and columns only (masked loads and stores)
LoopKind = Literal["serial", "parallel", "vectorized", "unrolled", "transposed", "block_x", "block_y", "block_z",
                   "thread_x", "thread_y", "thread_z"]
GPU_LOOP_KINDS = ("block_x", "block_y", "block_z", "thread_x", "thread_y", "thread_z")


@dataclass(frozen=True)
class TailLimit:
    """The loop runs while ``var < limit - offset`` as well (the tail of a non-dividing split)."""

    limit: int
    offset: Affine


@dataclass(frozen=True)
class ReductionClause:
    """A vectorized loop that combines ``var`` across its lanes with ``op`` (``+ * max min or``)."""

    op: str
    var: str


CLAUSE_OP = {"+=": "+", "*=": "*", "max=": "max", "min=": "min"}  # reduce kind -> its ReductionClause op


@dataclass(frozen=True)
class Loop:
    """``for var in [0, min(extent, limit - offset for each tail)):`` body.

    ``reduce``: the loop walks a reduction dimension. ``stage``: the statement it belongs to (None
    for helper loops, e.g. of a split sum)."""

    var: str
    extent: int
    kind: LoopKind
    body: tuple[Node, ...]
    tail: tuple[TailLimit, ...] = ()
    reductions: tuple[ReductionClause, ...] = ()
    reduce: bool = False
    stage: str | None = None
    stream: bool = False  # a ``transposed`` block whose whole blocks are stored past the caches (non-temporal)
    prefetch: int = 0  # a ``transposed`` block: source elements from its rows to the next block's, fetched first (0: none)

    @property
    def trip_count(self) -> int:
        """Iterations when no tail cuts the loop short (an upper bound otherwise)."""
        return self.extent
