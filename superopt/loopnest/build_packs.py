"""Pack routines and software prefetches for the loop-nest builder: the copy of an operand into its packed
layout (transposed or split among threads when large) and the cache-line fetches spread over a loop."""

from __future__ import annotations

import math
from dataclasses import replace

from superopt.ir.expr import Affine
from superopt.loopnest.index import FlatIndex
from superopt.loopnest.kernel import Joined, PackNest
from superopt.loopnest.loop import Loop
from superopt.loopnest.statements import Node, Prefetch
from superopt.schedule.kernel_plan import Loop as PlanLoop
from superopt.schedule.kernel_plan import Stage

PARALLEL_PACK_ELEMENTS = 1 << 16  # a pack this large is split among the threads (a parallel region costs a few us)


class PacksAndPrefetches:
    """Mixed into the loop-nest builder (``superopt.loopnest.build``): the state it reads is the builder's."""

    def prefetches(self, s: Stage, spread: PlanLoop) -> list[Node]:
        """The cache-line fetches that the stage's Prefetch primitives spread over loop ``spread``, issued at the
        start of each of its iterations (see :meth:`prefetch`)."""
        out: list[Node] = []
        for p in s.prefetches:
            if p.spread == spread.name:
                out.extend(self.prefetch(s, p.tensor, p.loop, spread))
        return out

    def prefetch(self, s: Stage, tensor: str, at: str, spread: PlanLoop) -> list[Node]:
        """Fetches of what the stage reads of ``tensor`` in the next iteration of loop ``at``, spread over loop
        ``spread``. Each read's offset, with ``at`` one further and the loops inside it at 0, is the base; the
        inner loops whose strides chain densely from 1 make one contiguous run of ``lines`` cache lines, the
        others (a weight panel's output-channel blocks, 128 KiB apart) enumerate such runs. Iteration ``v`` of
        ``spread`` fetches lines ``[v*q, v*q + q)`` of every run (``q = ceil(lines / extent)``; a few lines past a
        run's end at worst, never a guard that index-set splitting would split ``spread`` at). A read at a
        wrapped (div/mod) offset or with a negative stride is not fetched: a hint may be left out."""
        names = [lp.name for lp in s.loops]
        cv = self.var[s.name]
        k = names.index(at)
        inner = {cv[lp.name]: lp.extent for lp in s.loops[k + 1:]}
        nxt = cv[at]
        walked = set(inner) | {nxt}  # (div/mod atoms of fused loops outside ``at`` stay as they are)
        elems = max(1, self.plan.target.cache_line_bytes // self.types[tensor].np_dtype.itemsize)  # per line
        out: list[Node] = []
        seen: set[FlatIndex] = set()
        for a in s.stmt.expr.accesses():
            if a.tensor != tensor:
                continue
            acc = self.access(s, tensor, a.index)
            lin = acc.index.linear
            if acc.index.wrapped or any(not isinstance(v, str) and v.var in walked for v, _ in lin.terms) \
                    or acc.index in seen:
                continue
            seen.add(acc.index)
            strides = sorted((lin.coeff(u), e) for u, e in inner.items() if e > 1 and lin.coeff(u))
            if any(c < 0 for c, _ in strides):
                continue
            run, runs = 1, []
            for c, e in strides:
                if not runs and c <= run:
                    run = max(run, c * (e - 1) + run)
                else:
                    runs.append((c, e))
            lines = math.ceil(run / elems)
            if lines * math.prod(e for _, e in runs) * self.plan.target.cache_line_bytes > self.plan.target.l2_bytes:
                continue  # more than L2 holds each iteration: nothing would still be cached when read
            q = math.ceil(lines / spread.extent)
            base = lin.substitute({nxt: Affine.of({nxt: 1}, 1)} | {u: Affine.of() for u in inner})
            line = Affine.of({cv[spread.name]: q * elems, "pf_l": elems})
            index = base + line + Affine.of({f"pf_{i}": c for i, (c, _) in enumerate(runs)})
            node: Node = Loop("pf_l", q, "unrolled" if q <= 8 else "serial",
                              (Prefetch(replace(acc, index=FlatIndex(index.simplify()))),))
            for i, (_, e) in reversed(list(enumerate(runs))):
                node = Loop(f"pf_{i}", e, "serial", (node,))
            out.append(node)
        return out

    def pack(self, tensor: str) -> PackNest:
        lay = self.plan.packs[tensor]
        names = [f"a{i}" for i in range(len(lay.shape))]
        permuted: list[str | Joined]
        if lay.split_axis >= 0:
            a = lay.split_axis
            outer, rest = names[0], names[1:]
            permuted = [*rest[:a], Joined(outer, lay.factor, rest[a]), *rest[a + 1:]]
        else:
            permuted = list(names)
        src: list[str | Joined] = [""] * len(lay.perm)
        for pos, axis in enumerate(lay.perm):
            src[axis] = permuted[pos]
        in_range = None
        if lay.split_axis >= 0 and lay.shape[0] * lay.factor != lay.src_shape[lay.perm[lay.split_axis]]:
            in_range = (permuted[lay.split_axis], lay.src_shape[lay.perm[lay.split_axis]])  # a partial last panel
        loops = tuple(zip(names, lay.shape))
        dtype = self.types[tensor].dtype
        transpose = self.pack_transpose(loops, tuple(src), lay.src_shape, dtype)
        # (transposed: the packed innermost loop and the source's innermost one step by blocks, in place)
        order = [(v, n) for v, n in loops if transpose is None or v not in transpose[:2]]
        if transpose and transpose[5] < dict(loops)[transpose[1]]:  # (runs of q in its place)
            q_at = [v for v, _ in loops].index(transpose[1])
            order.insert(q_at, (transpose[1], -(-dict(loops)[transpose[1]] // transpose[5])))
        if in_range is not None and isinstance(in_range[0], Joined):  # (its bound moves with the panel: not collapsed)
            order = order[:next((i for i, (v, _) in enumerate(order) if v == in_range[0].inner), len(order))]
        parallel = self.pack_parallel(tuple(n for _, n in order), math.prod(lay.shape))
        return PackNest(tensor, dtype, lay, loops, lay.src_shape, tuple(src), in_range, parallel, transpose)

    def pack_transpose(self, loops: tuple[tuple[str, int], ...], src: tuple[str | Joined, ...],
                       src_shape: tuple[int, ...], dtype: str) -> tuple[str, str, int, int, int, int] | None:
        """Blocks of a vector's lanes squared, transposed in registers, where the packed innermost axis ``p``
        reads the source with a stride and the source's innermost axis is walked with unit stride by a loop ``q``
        of the pack (a plain axis, or the inner part of a split one), float32 on a CPU of 8 or 16 lanes. Extents
        need not be multiples of the block: the blocks at the edges are copied element by element, still one block
        at a time, so every source line is used whole while it is in cache (element by element along ``p``,
        each read is a line of its own: a GETT-style pack of a 5 MiB operand took a third of its kernel's time).
        The loops keep the packed order, ``q`` in runs of ``span`` (a multiple of the block) in its place and by
        blocks inside the others: the packed lines are written whole while in cache (``q`` moved innermost left
        them half written), and the source rows that one run reads are few enough for the cache (``q`` by blocks
        in its place read a line from each of 160 rows a step: 1.4x slower).
        Returns (p, q, block, the source's stride along p, the packed layout's stride along q, span)."""
        target = self.plan.target
        block = target.lanes("float32")
        if target.kind != "cpu" or dtype != "float32" or block not in (8, 16):
            return None
        p, last = loops[-1][0], src[-1]
        q = last if isinstance(last, str) else last.inner
        if q == p:
            return None
        axis = next((a for a, ix in enumerate(src[:-1]) if ix == p or (isinstance(ix, Joined) and ix.inner == p)), None)
        if axis is None:
            return None
        q_at = [v for v, _ in loops].index(q)
        # ``q`` in runs of ``span`` (a multiple of the block) around the loops inside it: the source lines and the
        # packed lines that one run touches stay in half the L2 together
        rows = math.prod(n for _, n in loops[q_at + 1:])  # (packed elements per step of q)
        span = max(block, (target.l2_bytes // 2 // (2 * rows * 4)) // block * block)
        return p, q, block, math.prod(src_shape[axis + 1:]), rows, span

    def pack_parallel(self, shape: tuple[int, ...], elements: int) -> int:
        """Leading pack loops (of extents ``shape``) the threads share: the fewest giving each thread 4 parts, none
        for a copy of ``elements`` under :data:`PARALLEL_PACK_ELEMENTS` (a run-time input packed on every call:
        attention's keys, 0.1 ms alone)."""
        threads = self.plan.target.threads
        if self.plan.target.kind != "cpu" or threads < 2 or elements < PARALLEL_PACK_ELEMENTS:
            return 0
        for k in range(1, len(shape) + 1):
            if math.prod(shape[:k]) >= 4 * threads:
                return k
        return len(shape)
