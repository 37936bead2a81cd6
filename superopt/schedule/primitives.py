"""Schedule primitives. A stage is named by the tensor its statement defines; loops by name.

Loop names: a statement's dims start as loops of the same name. ``Split(s, "j", 32)`` replaces
loop ``j`` by ``j_o`` (outer) and ``j_i`` (inner); ``Fuse(s, "a", "b")`` replaces adjacent loops
``a``, ``b`` by ``a_b``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class Primitive:
    stage: str


@dataclass(frozen=True)
class Split(Primitive):
    """loop -> loop_o * factor + loop_i; a tail iteration is bounded when factor does not divide."""

    loop: str
    factor: int


@dataclass(frozen=True)
class Reorder(Primitive):
    """Permute the named loops among the positions they occupy."""

    order: tuple[str, ...]


@dataclass(frozen=True)
class Fuse(Primitive):
    """Two adjacent loops (outer, inner) become one of extent outer*inner."""

    outer: str
    inner: str


@dataclass(frozen=True)
class Vectorize(Primitive):
    """SIMD across the innermost loop (``#pragma omp simd``)."""

    loop: str


@dataclass(frozen=True)
class Parallel(Primitive):
    """Distribute the outermost loop over threads (OpenMP); never a reduction loop."""

    loop: str


@dataclass(frozen=True)
class Unroll(Primitive):
    """Fully unroll a loop of small constant extent."""

    loop: str


@dataclass(frozen=True)
class CacheWrite(Primitive):
    """Accumulate the stage in a local (register) tile placed just above loop ``at``.

    The tile spans the spatial loops inside ``at``; it is written back when ``at`` finishes.
    """

    at: str


@dataclass(frozen=True)
class ComputeAt(Primitive):
    """Compute the producer stage inside loop ``loop`` of ``consumer``, for that iteration only.

    The consumer loops down to ``loop`` must be dims the consumer reads the producer by (plain
    index); the producer's buffer shrinks to the dims not bound by them.
    """

    consumer: str
    loop: str


@dataclass(frozen=True)
class Epilogue(Primitive):
    """Compute the elementwise ('=') stage at the write-back of ``producer``'s accumulator tile.

    The stage must read ``producer`` only at its own output index (bias, activation, residual add
    after a contraction); it is then evaluated on the register tile as it is stored, and the
    producer itself is not stored at all when nothing else reads it.
    """

    producer: str


@dataclass(frozen=True)
class ReduceEpilogue(Primitive):
    """Fold the reduction stage into ``producer``'s accumulator write-back (materialize or recompute:
    neither, the producer's tile is consumed on the spot).

    The stage must read ``producer`` only at one index, a permutation of the producer's output dims
    that are exactly its own dims (``S[i,j] += T[i,j,k]``, ``Q[i,j] += T[i,j,k] * T[i,j,k]``: it
    reduces over a subset of them). Its buffer is set to the reduction's identity before the
    producer's loops; each written-back tile element is combined into it. The producer's parallel
    loop must not walk a dim the stage reduces over (two threads would update one element). The
    producer is not stored at all when nothing else reads it.

    The producer may also be an elementwise stage computed per row inside a consumer, with the
    reduction computed at the same loop and summing exactly the producer's row (CPU, ``+=`` only:
    softmax's ``Z[i] += E[i, r]``): the sum is then kept in a register as each element is computed."""

    producer: str


@dataclass(frozen=True)
class InPlace(Primitive):
    """Store the attached elementwise stage in the buffer of ``consumer``, the stage it is computed at,
    which reads it only at its own output index: each element is read, then overwritten by the consumer
    (softmax: ``exp`` written into the output row, then scaled in place). No row buffer of its own, and
    the consumer's pass re-reads cached data instead of writing a fresh stream. CPU targets."""

    consumer: str


@dataclass(frozen=True)
class NextRow(Primitive):
    """Compute the row reduction ``stage`` one row ahead, inside the loop of ``into`` (an elementwise
    stage or another row reduction): both are computed at the same serial row loop of their consumer,
    and while ``into`` walks row ``i`` (the row ``stage`` reduces over, element for element), ``stage``'s
    value for row ``i + 1`` accumulates in a register, ready when row ``i + 1`` starts; only the first
    row of each run of the loop is reduced on its own. ``stage`` reads kernel inputs only. Softmax: the
    next row's max streams in from memory while this row's exponentials are computed, instead of a
    memory-bound pass then a compute-bound one. CPU targets."""

    into: str


@dataclass(frozen=True)
class Inline(Primitive):
    """Substitute an elementwise ('=') stage's expression into its consumers; it gets no loops."""


@dataclass(frozen=True)
class Recompute(Primitive):
    """Compute contraction ``stage`` again, tile by tile, for the reduction ``consumer``, which then reads
    the copy (a stage named ``recompute_name(stage, consumer)``, scheduled by the rest of the trace) instead
    of ``stage``. For a reduction chained after another over the same contraction (a variance around a mean
    that is itself a sum over the contraction): ``consumer`` may read values computed after ``stage``, so it
    cannot be folded into ``stage``'s write-back, but it can be folded into the copy's, and no buffer the
    size of the contraction is stored. Against storing ``stage`` once (no record): twice its flops, none of
    its memory traffic (superopt/schedule/chained.py)."""

    consumer: str


def recompute_name(stage: str, consumer: str) -> str:
    """The name of the copy of ``stage`` that :class:`Recompute` makes for ``consumer``."""
    return f"{stage}_for_{consumer}"


@dataclass(frozen=True)
class OutputLayout(Primitive):
    """Compute output ``stage`` into a temporary (``superopt.schedule.output_layout.laid_name``) whose dims are
    the output's in order ``perm``, then copy it into the output with a statement of its own; the rest of the
    trace schedules both. The output tile transposed on write-back, for a register tile whose columns are one
    contiguous run of an operand but not of the output (superopt/schedule/output_layout.py)."""

    perm: tuple[int, ...]


@dataclass(frozen=True)
class Pack(Primitive):
    """Re-layout input tensor ``stage`` (a kernel input): permute its axes by ``perm``, then split
    axis ``split_axis`` (an index into the permuted axes) by ``factor``, moving the outer part first.
    For constant weights the packing is done once ahead of time."""

    perm: tuple[int, ...]
    split_axis: int = -1
    factor: int = 1


@dataclass(frozen=True)
class Prefetch(Primitive):
    """While loop ``loop`` runs an iteration, fetch into cache the part of kernel input ``tensor`` that the
    stage reads in the next one, spread over the iterations of ``spread`` (a loop inside ``loop``, at or
    outside the accumulator's loop): each of them issues its share of the cache lines. A weight block
    streamed from L3 or memory while the block before it computes, instead of a burst of misses at every
    block's start (a hint: it changes no value). CPU targets; the stage's statement must read ``tensor``
    at an affine offset."""

    tensor: str
    loop: str
    spread: str


@dataclass(frozen=True)
class TransposeBlock(Primitive):
    """Copy the square block that loop ``loop`` and the one loop inside it walk (both of 8 or 16 iterations, at
    most the target's float32 lanes) through register shuffles: the stage is a float32 copy that reads
    contiguously along ``loop`` and writes contiguously along the inner loop (a transposition), so the block is
    ``L`` contiguous vector loads, log2(L) rounds of two-vector shuffles and ``L`` contiguous vector stores, where
    element-wise copies make one side a gather or a scatter. A block that a tail cuts short (extents that are not
    multiples of ``L``) is copied with masked loads and stores. ``stream``: whole blocks are written with
    non-temporal stores (past the caches; for an output larger than the last-level cache, it saves reading
    every written line first), and each iteration of the stage's outermost loop ends with one store fence.
    ``prefetch`` (a loop around the pair, or ``""``): each block first asks for the source rows of the block that
    the next iteration of that loop copies (a hint: it changes no value), so that their loads are under way
    while this block's shuffles and stores run; the loop must move the source by a constant stride. CPU
    targets."""

    loop: str
    stream: bool = False
    prefetch: str = ""


@dataclass(frozen=True)
class PackAt(Primitive):
    """Pack input ``tensor`` (which a ``Pack`` record lays out) inside loop ``at`` of the stage instead of before
    the kernel: at each iteration of ``at``, the running thread copies the box of the packed layout that the loops
    inside ``at`` read (from the input as the caller passes it) into a buffer of its own, and the reads inside
    ``at`` read that box. A column panel packed where it is used stays in the core's L2 between its copy and its
    reads, where a whole packed tensor goes out to the shared cache and is read back from there (GETT and BLIS
    pack this way). At or inside the stage's parallel loop, each thread packs the boxes of its own iterations;
    outside it, every thread packs the same box, each into its own buffer, before the threads share the parallel
    loop. CPU targets; no other stage reads ``tensor``."""

    tensor: str
    at: str


GPU_AXES = ("block_x", "block_y", "block_z", "thread_x", "thread_y", "thread_z")


@dataclass(frozen=True)
class Bind(Primitive):
    """Run a spatial loop across a GPU grid axis (``axis``: one of :data:`GPU_AXES`): each block (or
    thread) runs one iteration, ``var = blockIdx.x`` (``threadIdx.x``...). Only on a ``kind='cuda'``
    target; never a reduction loop; at most one loop per axis in a stage."""

    loop: str
    axis: str


@dataclass(frozen=True)
class CacheRead(Primitive):
    """Stage input ``tensor`` in GPU shared memory inside loop ``at`` of the stage (a CUDA target): at each
    iteration of ``at`` the block's threads copy the box of ``tensor`` that the block reads under it (the
    loops inside ``at`` and the thread loops, which must all enclose ``at``) into shared memory, then read it
    there. The stage must be a root stage whose thread loops have no tails."""

    tensor: str
    at: str


PRIMITIVES: dict[str, type[Primitive]] = {
    c.__name__: c for c in (Split, Reorder, Fuse, Vectorize, Parallel, Unroll, CacheWrite, ComputeAt, Epilogue, Inline,
              Pack, Bind, ReduceEpilogue, CacheRead, InPlace, NextRow, Prefetch, Recompute, TransposeBlock,
              OutputLayout, PackAt)
}


def trace_to_json(trace: tuple[Primitive, ...] | list[Primitive]) -> str:
    return json.dumps([{"kind": type(p).__name__, **asdict(p)} for p in trace])


def trace_from_json(text: str) -> tuple[Primitive, ...]:
    out = []
    for rec in json.loads(text):
        rec = dict(rec)
        cls = PRIMITIVES.get(rec.pop("kind", None))
        if cls is None:
            raise ValueError(f"unknown schedule primitive in {text[:80]!r}")
        kw = {}
        for f in fields(cls):
            v = rec[f.name]
            kw[f.name] = tuple(v) if isinstance(v, list) else v
        out.append(cls(**kw))
    return tuple(out)
