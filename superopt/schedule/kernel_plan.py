"""A KernelPlan: the checked meaning of (compute, trace, target), one loop nest per statement (stage), and
the error an illegal trace raises."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from superopt.ir.compute import Compute
from superopt.ir.expr import Affine
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.schedule.primitives import (
    Prefetch,
    Primitive,
)
from superopt.target import Target


class ScheduleError(ValueError):
    """An illegal schedule; the message says which primitive and why."""


@dataclass
class Loop:
    name: str
    extent: int
    reduce: bool
    parallel: bool = False
    vector: bool = False
    unroll: bool = False
    bind: str | None = None  # a GPU grid axis (Bind), e.g. "block_x"


@dataclass
class Stage:
    stmt: Statement
    loops: list[Loop]
    dims: dict[str, Affine]  # dim -> linear expression over loop variables (and div/mod atoms of fused ones)
    tails: list[tuple[Affine, int]] = field(default_factory=list)  # each: lin < limit
    cache_at: str | None = None
    attach: tuple[str, str] | None = None  # (consumer stage, consumer loop)
    bound: dict[str, str] = field(default_factory=dict)  # my out dim -> the consumer dim it is read at
    # my out dim -> a block of it (consumer dim, the block's origin over the consumer's loops above the
    # attach point, its extent): attached at the outer loop of a split, I compute the split's block
    block: dict[str, tuple[str, Affine, int]] = field(default_factory=dict)
    epilogue: str | None = None  # the elementwise stage evaluated at my accumulator's write-back
    epilogue_of: str | None = None  # I am that stage: computed inside this producer's nest, no loops of my own
    cache_reads: list[tuple[str, str]] = field(default_factory=list)  # (input, loop): GPU shared-memory copies
    reduce_epilogues: list[str] = field(default_factory=list)  # reductions folded into my write-back, in order
    reduce_epilogue_of: str | None = None  # I am one: my buffer is combined into at this producer's write-back
    in_place: str | None = None  # attached and stored in this consumer's buffer (InPlace)
    next_row_into: str | None = None  # a row reduction computed a row ahead in this sibling's loop (NextRow)
    next_rows: list[str] = field(default_factory=list)  # the row reductions computed a row ahead in my loop
    # fused loops made linear (:func:`_linearize`): the dims they walk are only meaningful in flat offsets
    linear: list[str] = field(default_factory=list)
    prefetches: list[Prefetch] = field(default_factory=list)  # inputs fetched an iteration ahead (Prefetch)
    transpose_block: tuple[str, bool, str] | None = None  # (loop, stream, prefetch loop): a block copied by shuffles
    pack_at: dict[str, str] = field(default_factory=dict)  # packed input -> the loop its boxes are packed in (PackAt)

    @property
    def name(self) -> str:
        return self.stmt.out

    def loop(self, name: str, prim: Primitive) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise ScheduleError(f"{prim}: stage {self.name!r} has no loop {name!r} "
                            f"(loops: {[lp.name for lp in self.loops]})")

    def index_of(self, name: str) -> int:
        return [lp.name for lp in self.loops].index(name)

    @property
    def acc_at(self) -> str | None:
        """Where the accumulator lives: explicit cache_write, else above the innermost reduce suffix."""
        if self.stmt.reduce == "=":
            return None
        if self.cache_at is not None:
            return self.cache_at
        k = len(self.loops)
        while k > 0 and self.loops[k - 1].reduce:
            k -= 1
        return self.loops[k].name if k < len(self.loops) else None

    def tile_loops(self) -> list[Loop]:
        at = self.acc_at
        if at is None:
            return []
        return [lp for lp in self.loops[self.index_of(at):] if not lp.reduce]

    @property
    def partial(self) -> bool:
        """True when some reduction happens outside the accumulator (needs an init pass)."""
        if self.stmt.reduce == "=":
            return False
        at = self.acc_at
        if at is None:
            return True
        return any(lp.reduce for lp in self.loops[: self.index_of(at)])


@dataclass(frozen=True)
class PackLayout:
    """Packed layout of an input: permuted axes, one optionally split (outer part moved first)."""

    perm: tuple[int, ...]
    split_axis: int
    factor: int
    src_shape: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        s = [self.src_shape[p] for p in self.perm]
        if self.split_axis < 0:
            return tuple(s)
        a = self.split_axis
        outer = math.ceil(s[a] / self.factor)
        return (outer, *s[:a], self.factor, *s[a + 1:])

    @property
    def axis_sources(self) -> tuple[int, ...]:
        """The source axis of each packed axis (the split's outer part, packed axis 0, and its inner part both
        name the split source axis)."""
        if self.split_axis < 0:
            return tuple(self.perm)
        return (self.perm[self.split_axis], *self.perm)

    def map_index(self, index: Sequence) -> list:
        """Original per-axis indices -> packed per-axis (as ('div'|'mod', x, f) for the split axis)."""
        s = [index[p] for p in self.perm]
        if self.split_axis < 0:
            return s
        a = self.split_axis
        return [("div", s[a], self.factor), *s[:a], ("mod", s[a], self.factor), *s[a + 1:]]

    def pack_array(self, x: np.ndarray) -> np.ndarray:
        """``x`` (of ``src_shape``) in this layout, the last panel's missing part zeros: the numpy statement of
        what a kernel's pack routine writes."""
        y = np.transpose(x, self.perm)
        if self.split_axis < 0:
            return np.ascontiguousarray(y)
        a, shape = self.split_axis, self.shape
        pad = [(0, 0)] * y.ndim
        pad[a] = (0, shape[0] * self.factor - y.shape[a])
        y = np.pad(y, pad).reshape(*y.shape[:a], shape[0], self.factor, *y.shape[a + 1:])
        return np.ascontiguousarray(np.moveaxis(y, a, 0))

    def unpack_array(self, packed: np.ndarray) -> np.ndarray:
        """The array of ``src_shape`` that :meth:`pack_array` (or the kernel's pack) made ``packed`` from:
        every element is in the packed copy, so a weight read only packed need not be kept beside it."""
        y = packed
        if self.split_axis >= 0:
            a = self.split_axis
            n = self.src_shape[self.perm[a]]
            y = np.moveaxis(y, 0, a)
            y = y.reshape(*y.shape[:a], y.shape[a] * y.shape[a + 1], *y.shape[a + 2:])[(slice(None),) * a + (slice(0, n),)]
        return np.ascontiguousarray(np.transpose(y, np.argsort(self.perm)))


@dataclass
class KernelPlan:
    compute: Compute
    stages: dict[str, Stage]
    packs: dict[str, PackLayout]
    types: dict[str, TensorType]
    target: Target

    def consumers_of(self, name: str) -> list[Stage]:
        return [s for s in self.stages.values() if name in s.stmt.inputs()]


def local_shape(stage: Stage) -> tuple[tuple[str, int], ...]:
    """The (dim, extent) axes of a stage's buffer (bound dims of an attached stage dropped, block dims
    the block's extent)."""
    return tuple((d, stage.block[d][2] if d in stage.block else n)
                 for d, n in zip(stage.stmt.out_dims, stage.stmt.out_shape) if d not in stage.bound)
