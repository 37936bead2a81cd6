"""Statement nodes of a loop nest: scopes, stages, stores, accumulation, write-back, epilogues.

A :data:`Node` is a :class:`~superopt.loopnest.loop.Loop`, an :class:`~superopt.loopnest.alloc.Alloc`,
a :class:`~superopt.loopnest.alloc.Fill` or one of the classes below.
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt.ir.expr import Affine
from superopt.loopnest.alloc import Alloc, Fill
from superopt.loopnest.index import BufferAccess, GuardCond, RegisterRef
from superopt.loopnest.loop import Loop, TailLimit
from superopt.loopnest.values import Value


@dataclass(frozen=True)
class StageNest:
    """The nest of one statement of the compute (``text``: the statement), in place of its loops."""

    stage: str
    text: str
    body: tuple[Node, ...]


@dataclass(frozen=True)
class Scope:
    """A lexical block: the accumulators declared in it live until it ends."""

    body: tuple[Node, ...]


@dataclass(frozen=True)
class Assign:
    """``target = value`` (the statement of an elementwise stage)."""

    target: BufferAccess | RegisterRef
    value: Value


@dataclass(frozen=True)
class Accumulate:
    """``target = target <op> value`` for a reduction op (``+= *= max= min=``) in ``dtype``.

    ``nan_flag``: a float max=/min= into a scalar register as a plain compare-select, with NaN
    inputs recorded in that flag (restored at write-back by :class:`RestoreNan`)."""

    target: BufferAccess | RegisterRef
    op: str
    value: Value
    dtype: str
    nan_flag: str | None = None


@dataclass(frozen=True)
class RestoreNan:
    """``if flag: register = NaN``."""

    target: RegisterRef
    flag: str


@dataclass(frozen=True)
class WriteBack:
    """Store an accumulator to its tensor: ``target = source``, or ``target = target <op> source``
    when part of the reduction happens outside the accumulator (``op`` set)."""

    target: BufferAccess
    source: RegisterRef
    op: str | None
    dtype: str


@dataclass(frozen=True)
class Epilogue:
    """A stage evaluated at its producer's write-back (``text``: its statement): an elementwise one
    (an :class:`Assign`), or a reduction folded into it (an :class:`Accumulate` into its buffer)."""

    stage: str
    text: str
    body: Assign | Accumulate | Guard


@dataclass(frozen=True)
class Guard:
    """``if all(cond): body`` for one statement."""

    conds: tuple[GuardCond, ...]
    body: Assign | Accumulate | WriteBack | Prefetch


@dataclass(frozen=True)
class SplitIndex:
    """Define ``var = outer * factor + inner`` (a loop rebuilt from two, as in a split sum)."""

    var: str
    outer: str
    factor: int
    inner: str


@dataclass(frozen=True)
class CombineLanes:
    """``target <op>= source[var]`` for var in [0, lanes): the partial sums of a split sum added up."""

    target: RegisterRef
    source: str
    lanes: int
    var: str
    op: str = "+"


@dataclass(frozen=True)
class Prefetch:
    """A hint: bring the cache line holding ``access`` into the cache (``locality``: 3 keeps it in every
    level, 2 in L2 and L3, as gcc's ``__builtin_prefetch``). Reads nothing, writes nothing."""

    access: BufferAccess
    locality: int = 2


@dataclass(frozen=True)
class PackBox:
    """At the top of a loop's body (``PackAt``): a box of input ``tensor``'s packed layout copied into the running
    thread's slot of workspace ``workspace`` (``slot`` elements a thread) by the kernel's box pack routine for
    ``tensor``: from the input's element ``base`` on, ``counts`` elements along each axis of the box, each the
    least of its terms (a constant, or an expression of the enclosing loops where the data ends: the rest of the
    box is zeros). ``every_thread``: the loop is outside the parallel loop, and every thread packs the same box
    into its own slot (one parallel region), for the parallel loop's iterations to read."""

    tensor: str
    workspace: str
    dtype: str
    slot: int
    base: Affine
    counts: tuple[tuple[int | Affine, ...], ...]
    every_thread: bool = False


@dataclass(frozen=True)
class BoxSlot:
    """``buffer``: a pointer to the running thread's slot (``slot`` elements) of workspace ``workspace``, declared
    at the top of a parallel loop's body (or, without one, of the body of the loop that packs the boxes): what the
    reads of a box packed by :class:`PackBox` read."""

    buffer: str
    workspace: str
    dtype: str
    slot: int


@dataclass(frozen=True)
class PeeledLoop:
    """A loop over register tiles run as two: ``for var in [0, full)`` over ``loop.body`` (the tiles'
    tails dropped: constant trip counts), then ``for var in [full, extent)`` over ``general`` (the
    body as built). ``full`` is ``split`` when every condition of ``outer_full`` holds (a tail on an
    enclosing loop's variable, ``offset + extent <= limit``), else 0. ``loop`` keeps the extent, kind
    and tail of the original loop. ``middle``: where ``outer_full`` does not hold, the body with only this
    loop's own tails dropped (the enclosing loop's tails kept, as run-time bounds), run for ``[0, split)`` before
    ``general`` runs the rest: the last panel of columns keeps register tiles of constant rows. ``last``: where
    ``outer_full`` holds and the rest is one tile, that tile with every tail a constant (the last rows of a full
    panel of columns), run instead of ``general``. ``branch``: one loop over all the iterations instead, each running
    ``loop.body`` below ``split`` and ``general`` from there (a parallel loop as one parallel region). See
    :mod:`superopt.loopnest.versioning`."""

    loop: Loop
    general: tuple[Node, ...]
    split: int
    outer_full: tuple[tuple[int, TailLimit], ...] = ()
    middle: tuple[Node, ...] | None = None
    last: tuple[Node, ...] | None = None
    branch: bool = False


Node = (Loop | Alloc | Fill | StageNest | Scope | Assign | Accumulate | RestoreNan | WriteBack | Epilogue | Guard
        | SplitIndex | CombineLanes | PeeledLoop | Prefetch | PackBox | BoxSlot)
