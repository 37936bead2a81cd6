"""Pack routines and software prefetches for the loop-nest builder: the copy of an operand into its packed
layout (transposed or split among threads when large) and the cache-line fetches spread over a loop."""

from __future__ import annotations

import math
from dataclasses import replace

from superopt.ir.expr import Affine, flat_offset
from superopt.loopnest.index import FlatIndex
from superopt.loopnest.kernel import Joined, PackNest, PackStep
from superopt.loopnest.loop import Loop
from superopt.loopnest.names import box_buffer, box_workspace
from superopt.loopnest.statements import BoxSlot, Node, Prefetch
from superopt.loopnest.statements import PackBox as PackBoxNode
from superopt.schedule.kernel_plan import Loop as PlanLoop
from superopt.schedule.kernel_plan import Stage
from superopt.schedule.pack_box import PackBox

PACK_RUN_LINES = 4  # a source run shorter than this many cache lines is walked whole while its lines are cached
PACK_WRITE_STREAMS = 16  # at most this many runs of a packed layout written in turn (a core's line fill buffers)
PARALLEL_PACK_ELEMENTS = 1 << 16  # a pack this large is split among the threads (a parallel region costs a few us)


def sliver(transpose: tuple[str, str, int, int, int, int], extent: dict[str, int]) -> bool:
    """Whether a transposed pack's blocks are slivers: one of its two axes shorter than a quarter of a block, so
    that every block is copied element by element (``print_pack``: 3 x 16 is 48 single copies)."""
    p, q, block = transpose[:3]
    return min(extent[p], extent[q]) * 4 < block


def merge_shared_runs(loops: tuple[tuple[str, int], ...], src: list[str | Joined], src_shape: tuple[int, ...]
                      ) -> tuple[tuple[tuple[str, int], ...], list[str | Joined], tuple[int, ...]]:
    """The pack's loops with each pair of axes that lie next to each other, in the same order, in both the packed
    layout and the source merged into one loop (the outer's name, the product of the extents): both flat offsets
    are unchanged, and the merged axis is one run where its inner part was short. Taken where a transpose's blocks
    would be slivers (:func:`sliver`): B[n,o,k,l,m] packed as [k/48][o][l][m][n][48] keeps l,m together, and as
    one axis of 129 it is transposed in whole blocks of 16, where m's 3 alone made every block a sliver. (Where the
    blocks were whole or masked, merging the packed innermost axis with the ones outside it changed the pack's
    order of passes over the source instead, as often slower as faster.)"""
    loops, src, src_shape = tuple(loops), list(src), tuple(src_shape)
    merged = True
    while merged:
        merged = False
        for i in range(len(loops) - 1):
            (u, nu), (v, nv) = loops[i], loops[i + 1]
            a = src.index(u) if u in src else -1
            if a >= 0 and a + 1 < len(src) and src[a + 1] == v:
                loops = loops[:i] + ((u, nu * nv),) + loops[i + 2:]
                src = src[:a + 1] + src[a + 2:]
                src_shape = src_shape[:a] + (src_shape[a] * src_shape[a + 1],) + src_shape[a + 2:]
                merged = True
                break
    return loops, src, src_shape


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

    def pack(self, tensor: str, box: PackBox | None = None) -> PackNest:
        """The routine packing input ``tensor`` whole (before the kernel), or one ``box`` of it (inside)."""
        lay = self.plan.packs[tensor]
        shape = box.shape if box is not None else lay.shape
        names = [f"a{i}" for i in range(len(shape))]
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
        if box is None and lay.split_axis >= 0 and lay.shape[0] * lay.factor != lay.src_shape[lay.perm[lay.split_axis]]:
            in_range = (permuted[lay.split_axis], lay.src_shape[lay.perm[lay.split_axis]])  # a partial last panel
        loops = tuple(zip(names, shape))
        src_shape = lay.src_shape
        dtype = self.types[tensor].dtype
        transpose = self.pack_transpose(loops, tuple(src), src_shape, dtype)
        if box is None and transpose is not None and sliver(transpose, dict(loops)):
            # (not a box: its loops are its caller's counts, one per axis of the layout)
            loops, src, src_shape = merge_shared_runs(loops, src, src_shape)
            transpose = self.pack_transpose(loops, tuple(src), src_shape, dtype)
        order = self.pack_order(loops, tuple(src), src_shape, transpose, self.types[tensor].np_dtype.itemsize)
        if box is not None:  # (its caller's thread packs it)
            return PackNest(tensor, dtype, lay, loops, src_shape, tuple(src), None, 0, transpose, order, True)
        lead: list[int] = []  # (the leading headers' trip counts, for the threads to share)
        for step in order:
            if step.how == "blocks" and any(x.how == "runs" and x.var == step.var for x in order) \
                    or (in_range is not None and isinstance(in_range[0], Joined) and step.var == in_range[0].inner):
                break  # (a bound that moves with an outer loop: not collapsed; blocks alone are rectangular)
            n = dict(loops)[step.var]
            lead.append(n if step.how == "each" else -(-n // transpose[5 if step.how == "runs" else 2]))
        parallel = self.pack_parallel(tuple(lead), math.prod(lay.shape))
        return PackNest(tensor, dtype, lay, loops, src_shape, tuple(src), in_range, parallel, transpose, order)

    def box_pack(self, s: Stage, box: PackBox) -> PackBoxNode:
        """The copy of ``box`` at the top of its loop's body: where in the source it starts and how far each of
        its axes runs (see :mod:`superopt.schedule.pack_box`)."""
        lay = self.plan.packs[box.tensor]
        origin = [self._rename(s, o) for o in box.origin]
        a = lay.split_axis
        at_src = [Affine.of()] * len(lay.src_shape)  # (the box's first element, per source axis)
        for j, (axis, o) in enumerate(zip(lay.axis_sources, origin)):
            at_src[axis] = at_src[axis] + (o.scale(lay.factor) if a >= 0 and j == 0 else o)  # (0: the panel)
        base = flat_offset(at_src, lay.src_shape)
        counts: list[tuple[int | Affine, ...]] = []
        for j, (n, o, cut) in enumerate(zip(box.shape, origin, box.cut)):
            terms: list[int | Affine] = [n]
            if cut:
                ends = [Affine.of({}, lay.shape[j]) + o.scale(-1)]  # (where the layout's axis ends)
                if a >= 0 and j == a + 1:  # (the last panel, where the source does)
                    ends.append(Affine.of({}, lay.src_shape[lay.perm[a]]) + origin[0].scale(-lay.factor) + o.scale(-1))
                terms += [e.simplify() for e in ends if e.terms or e.const < n]
            counts.append(tuple(terms))
        par = [lp.name for lp in s.loops if lp.parallel]
        every = bool(par) and s.index_of(box.at) < s.index_of(par[0])
        return PackBoxNode(box.tensor, box_workspace(box.tensor), self.types[box.tensor].dtype, box.size,
                           base.simplify(), tuple(counts), every)

    def box_slots(self, s: Stage, lp: PlanLoop) -> list[BoxSlot]:
        """The pointers to the running thread's boxes, declared atop the body of the stage's parallel loop ``lp``
        (or, in a stage without one, of the loop that packs them)."""
        par = any(x.parallel for x in s.loops)
        return [BoxSlot(box_buffer(b.tensor), box_workspace(b.tensor), self.types[b.tensor].dtype, b.size)
                for (stage, at), bs in self.boxes.items() if stage == s.name for b in bs
                if (lp.parallel if par else lp.name == at)]

    def pack_order(self, loops: tuple[tuple[str, int], ...], src: tuple[str | Joined, ...],
                   src_shape: tuple[int, ...], transpose: tuple[str, str, int, int, int, int] | None,
                   itemsize: int) -> tuple[PackStep, ...]:
        """The pack's loop headers: by default the packed order (a transpose's two loops by blocks, the source's
        innermost in runs of its span). Where the source's contiguous run along its innermost loop is short
        (under :data:`PACK_RUN_LINES` cache lines), the loops continuing that run, by their source strides, move
        inside so that each source line is used whole while cached, if the default order would read some of those
        lines again only after more than half the L2 has passed through (within that, the default order was as
        fast: its packed lines are written whole, the moved order's in pieces):
        without a transpose, they move next to the packed innermost loop, at most :data:`PACK_WRITE_STREAMS` runs
        of the packed layout written in turn (a source axis split into panels of 32 was read in five passes over
        the whole tensor: 1.4-2x the time). With one whose source run is under a block, they and the source's
        innermost loop move inside the blocks of the packed innermost loop (a source axis of 10 split 5 x 2 around
        it was read five times over, each block a 2 x 16 sliver: 2x the time). Moving the loops that continue a
        short packed run instead made the packs faster but their calls slower, and is not done."""
        names = [v for v, _ in loops]
        extent = dict(loops)
        stride: dict[str, int] = {}  # (along the source)
        for a, ix in enumerate(src):
            s = math.prod(src_shape[a + 1:])
            if isinstance(ix, str):
                stride[ix] = s
            else:
                stride[ix.inner], stride[ix.outer] = s, s * ix.factor
        elems = max(1, self.plan.target.cache_line_bytes // itemsize)
        run = PACK_RUN_LINES * elems

        def continuing(first: str, stop: str | None) -> list[str]:
            """Loops continuing ``first``'s source run, innermost last, until it spans ``run`` (or ``stop`` comes)."""
            span, out = extent[first], []
            for v in sorted((u for u in names if u != first and extent[u] > 1), key=lambda u: stride[u]):
                if span >= run or v == stop:
                    break
                out.append(v)
                span = max(span, stride[v] * extent[v])
            return out[::-1]

        def far(order: list[PackStep], moved: list[str]) -> bool:
            """Whether some loop of ``moved`` walks within source lines that the loops inside it in ``order`` push
            out of half the L2 between its iterations (a run of ``r`` elements at any alignment touches
            ``(r - 1) / elems + 1`` lines on average)."""
            for g in moved:  # (``order`` has no runs: a source run under a block is shorter than any span)
                k = next(i for i, st in enumerate(order) if st.var == g)
                lines = 1.0
                for st in order[k + 1:]:
                    n, s = extent[st.var], stride[st.var]
                    lines *= n if s >= elems else (s * n - 1) / elems + 1
                if lines * self.plan.target.cache_line_bytes > self.plan.target.l2_bytes / 2:
                    return True
            return False

        if transpose is None:
            plain = [PackStep(v) for v in names]
            p = names[-1]
            if stride[p] != 1 or extent[p] < elems:  # (not a run of whole lines on both sides)
                return tuple(plain)
            inner = continuing(p, None)
            # (each moved iteration writes a run of the packed layout of its own: more than a core's line fill
            # buffers at once was slower than reading the source in passes)
            if not inner or math.prod(extent[v] for v in inner) > PACK_WRITE_STREAMS or not far(plain, inner):
                return tuple(plain)
            return tuple(PackStep(v) for v in [*(u for u in names[:-1] if u not in inner), *inner, p])
        p, q, block, _, _, span = transpose
        default = [PackStep(q, "runs") if v == q else PackStep(v) for v in names
                   if v != p and (v != q or span < extent[q])] + [PackStep(q, "blocks"), PackStep(p, "blocks")]
        inner = continuing(q, p) if extent[q] < block else []
        if inner and far(default, inner):
            rest = [PackStep(v) for v in names if v not in (p, q, *inner)]
            return (*rest, PackStep(p, "blocks"), *(PackStep(v) for v in inner), PackStep(q, "blocks"))
        return tuple(default)

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
