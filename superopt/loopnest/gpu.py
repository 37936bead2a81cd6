"""Loop-nest statements that only GPU schedules produce."""

from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.ir.expr import Affine
from superopt.loopnest.index import RegisterRef


@dataclass(frozen=True)
class ThreadReduce:
    """All-reduce ``target`` with the reduction ``op`` (``+= *= max= min=``) across the threads of a block
    (axis x): every thread holds a partial (its share of a reduction loop bound to ``thread_x``) and ends
    with the whole. Every thread of the block reaches it (it sits outside any thread-dependent branch)."""

    target: RegisterRef
    op: str
    dtype: str


@dataclass(frozen=True)
class SharedLoad:
    """The block's threads copy a box of input ``tensor`` into the shared-memory array ``buffer``: box element
    ``a`` (per axis, row-major over ``shape``) is ``tensor[origin + a]``, or 0 outside ``src_shape`` (when
    ``checked``). ``origin``: per axis, an index expression over the loops enclosing the copy."""

    buffer: str
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    origin: tuple[Affine, ...]
    src_shape: tuple[int, ...]
    checked: bool

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Barrier:
    """Every thread of the block waits here for the others (``__syncthreads``)."""
