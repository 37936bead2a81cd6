"""KernelPlan -> LoopNest: every structural decision of code generation, made once, for any printer.

Decided here: loop variable names (an attached stage's are prefixed with its name), where an
accumulator lives and its size, its init, accumulate and write-back, NaN flags of float max/min
into a scalar, vectorized sums split into partial sums (``target.split_sum_lanes``), tail bounds
(a bound on the innermost loop of the tail, else a guard), tile lanes that may safely overrun a
tail, flattened (and packed) indices, padding checks, epilogues, which producers are stored,
workspace and local buffers, and the element type of every value.

The builder is assembled of parts, one concept each: ``build_access`` (indices, accesses, values),
``build_folds`` (sums folded into elementwise stages, rows computed ahead), ``build_write_back`` (register
tiles, write-backs, epilogues) and ``build_packs`` (pack routines, prefetches); the loops are built here.
"""

from __future__ import annotations

import math
from dataclasses import replace

from superopt.ir.expr import Affine
from superopt.ir.statement import REDUCE_IDENTITY
from superopt.ir.types import TensorType, is_float
from superopt.loopnest.alloc import Alloc, Fill
from superopt.loopnest.build_access import AccessBuilding
from superopt.loopnest.build_folds import FoldedRows
from superopt.loopnest.build_packs import PacksAndPrefetches
from superopt.loopnest.build_write_back import WriteBacks
from superopt.loopnest.gpu import ThreadReduce
from superopt.loopnest.index import BufferAccess, GuardCond, RegisterRef
from superopt.loopnest.index_sets import split_index_sets
from superopt.loopnest.kernel import LoopNest, Param
from superopt.loopnest.loop import CLAUSE_OP, Loop, ReductionClause, TailLimit
from superopt.loopnest.names import box_workspace
from superopt.loopnest.statements import (
    Accumulate,
    Assign,
    CombineLanes,
    Guard,
    Node,
    RestoreNan,
    Scope,
    SplitIndex,
    StageNest,
    WriteBack,
)
from superopt.loopnest.values import Literal, Load, Value
from superopt.loopnest.versioning import peel_tile_tails
from superopt.schedule.kernel_plan import KernelPlan, ScheduleError, Stage, local_shape
from superopt.schedule.kernel_plan import Loop as PlanLoop
from superopt.schedule.pack_box import PackBox, pack_box
from superopt.schedule.plan_check import reduce_epilogue_dims

Bounds = dict[str, tuple[TailLimit, ...]]  # loop var -> its tail limits


def build_loopnest(plan: KernelPlan) -> LoopNest:
    """The loop nest of ``plan`` (a legal lowering): kernel body and pack routines."""
    nest = _Builder(plan).kernel()
    if plan.target.kind == "cpu":  # (the CUDA printer maps tiles to threads: no tails to version there)
        nest = peel_tile_tails(split_index_sets(nest, min_parallel=2 * plan.target.threads), plan.target.threads)
    return nest


class _Builder(AccessBuilding, FoldedRows, WriteBacks, PacksAndPrefetches):
    """The builder's state and its loops; index and value building, folded sums and rows ahead, register tiles
    and their write-back, packs and prefetches come from the parts it is assembled of."""

    def __init__(self, plan: KernelPlan) -> None:
        self.plan = plan
        self.types: dict[str, TensorType] = plan.types
        self.stages = plan.stages
        self.var: dict[str, dict[str, str]] = {}  # stage -> plan loop name -> loop variable
        for s in self.stages.values():
            pre = "" if s.attach is None else f"{s.name}_"
            self.var[s.name] = {lp.name: pre + lp.name for lp in s.loops}
        self.attached: dict[tuple[str, str], list[Stage]] = {}
        for s in self.stages.values():
            if s.attach is not None:
                self.attached.setdefault(s.attach, []).append(s)
        self.extents: dict[str, int] = {}  # loop var -> extent (for bounds of index expressions)
        self._acc_override: dict[str, Value] = {}  # an epilogue reads its producer's accumulator
        self._acc_ref: RegisterRef | None = None  # the accumulator the innermost statement updates, when not acc
        self._guards: list[tuple[GuardCond, bool]] = []  # (cond, involves a reduction loop) of the stage
        self._nan_flag: set[str] = set()  # stages in a scalar float max=/min= accumulator with a NaN flag
        self.lanes = plan.target.split_sum_lanes
        self.boxes: dict[tuple[str, str], list[PackBox]] = {}  # (stage, loop) -> the boxes packed atop its body
        for s in self.stages.values():
            for tensor, at in s.pack_at.items():
                self.boxes.setdefault((s.name, at), []).append(pack_box(plan, s, tensor, at))
        self._in_box: dict[str, PackBox] = {}  # inputs read from the running thread's box (inside its loop)

    # ---- loops --------------------------------------------------------------------------------

    def loop_bounds(self, s: Stage) -> Bounds:
        """Tails: bound the innermost loop of each by a limit when its coefficient is 1, else guard."""
        out: Bounds = {}
        self._guards = []
        cvars = self.var[s.name]
        order = [cvars[lp.name] for lp in s.loops]
        reduce_vars = {cvars[lp.name] for lp in s.loops if lp.reduce}
        tails = [(self._rename(s, lin), limit) for lin, limit in s.tails]
        for d, (_, _, n) in s.block.items():  # a block past the end of its dim (the consumer's split has a tail)
            origin = self.block_origin(s, d)
            if origin.bounds(self.extents)[1] + n > s.stmt.extent[d]:
                tails.append((origin + self._rename(s, s.dims[d]), s.stmt.extent[d]))
        for cl, limit in tails:
            inner = max(cl.vars() & set(order), key=order.index)  # (a block origin: consumer loops)
            if cl.map.get(inner) == 1:
                rest = Affine.of({a: c for a, c in cl.terms if a != inner}, cl.const)
                out[inner] = out.get(inner, ()) + (TailLimit(limit, rest.simplify()),)
            else:
                self._guards.append((GuardCond(cl.simplify(), limit), bool(cl.vars() & reduce_vars)))
        return out

    def make_loop(self, s: Stage, lp: PlanLoop, bounds: Bounds, body: list[Node],
                  reductions: tuple[ReductionClause, ...] = ()) -> Loop:
        v = self.var[s.name][lp.name]
        kind = lp.bind or ("parallel" if lp.parallel else "unrolled" if lp.unroll else "vectorized" if lp.vector
                           else "serial")
        return Loop(v, lp.extent, kind, tuple(body), bounds.get(v, ()), reductions, lp.reduce, s.name)

    def stage(self, s: Stage) -> StageNest:
        st = s.stmt
        t = self.types[s.name]
        cvars = self.var[s.name]
        for lp in s.loops:
            self.extents[cvars[lp.name]] = lp.extent
        body: list[Node] = []
        if s.attach is not None and s.in_place is None:
            size = math.prod(n for _, n in local_shape(s))
            body.append(Alloc("local", s.name, t.dtype, size))
        bounds = self.loop_bounds(s)
        if s.partial and self.first_blocks(s) is None:
            size = math.prod(n for _, n in local_shape(s))
            ident = Literal(REDUCE_IDENTITY[st.reduce], t.dtype)
            body.append(Fill(s.name, size, ident, "so_i", bool(s.loops and s.loops[0].parallel)))
        sums_in_registers = st.reduce == "=" and bool(s.reduce_epilogues)  # sums of my elements, a register each
        for name in s.reduce_epilogues:  # folded reductions start at their identity before my loops
            e = self.stages[name]
            dtype = self.types[name].dtype
            ident = Literal(REDUCE_IDENTITY[e.stmt.reduce], dtype)
            if sums_in_registers:
                body.append(Alloc("local", name, dtype, math.prod(n for _, n in local_shape(e))))
                body.append(Alloc("register", self.fold_register(name), dtype, 1, ident))
            else:
                body.append(Fill(name, self.types[name].size, ident, "so_i", bool(s.loops and s.loops[0].parallel)))
        flags = {name: self.ahead_flag(self.stages[name]) for name in s.next_rows}
        for name, flag in flags.items():  # rows reduced a row ahead in my loop start at their identity
            body.append(Assign(RegisterRef(self.ahead_register(name)),
                               Literal(REDUCE_IDENTITY[self.stages[name].stmt.reduce], self.types[name].dtype)))
            if flag:
                body.append(Assign(RegisterRef(flag), Literal(0, "int32")))
        body.extend(self.loops(s, 0, bounds))
        for name, flag in flags.items():
            if flag:
                body.append(RestoreNan(RegisterRef(self.ahead_register(name)), flag))
        if sums_in_registers:
            for name in s.reduce_epilogues:
                e = self.stages[name]
                ren = self.fold_dims(e, s)
                body.append(Assign(self.access(s, name, tuple(ren[d] for d in e.stmt.out_dims)),
                                   Load(RegisterRef(self.fold_register(name)))))
        return StageNest(s.name, str(st), tuple(body))

    def _guarded(self, conds: list[GuardCond], stmt: Assign | Accumulate | WriteBack) -> Node:
        return Guard(tuple(conds), stmt) if conds else stmt

    def loops(self, s: Stage, k: int, bounds: Bounds) -> list[Node]:
        st = s.stmt
        t = self.types[s.name]
        acc_at = s.acc_at
        if k == len(s.loops):
            val = self.value(s, st.expr, t.dtype)
            guard = [g for g, _ in self._guards]
            if st.reduce == "=":
                return [self._guarded(guard, Assign(self.out_access(s), val)), *self.folded_sums(s, guard),
                        *self.rows_ahead(s, guard)]
            if acc_at is None:
                acc = Accumulate(self.out_access(s), st.reduce, val, t.dtype)
            elif s.name in self._nan_flag:
                acc = Accumulate(RegisterRef("acc"), st.reduce, val, t.dtype, "acc_nan")
            else:
                acc = Accumulate(self._acc_ref or self.tile_ref(s), st.reduce, val, t.dtype)
            return [self._guarded(guard, acc), *self.rows_ahead(s, guard)]
        lp = s.loops[k]
        is_acc = lp.name == acc_at
        tile = s.tile_loops() if is_acc else []
        ident = Literal(REDUCE_IDENTITY.get(st.reduce, 0.0), t.dtype)
        scope: list[Node] = []
        if is_acc:
            if tile:
                size = math.prod(x.extent for x in tile)
                lanes = self.plan.target.lanes(t.dtype) if self.plan.target.kind == "cpu" else None
                scope.append(Alloc("register_tile", "acc", t.dtype, size, lanes=lanes))
                scope.append(Fill("acc", size, ident, "so_i"))
            else:
                scope.append(Alloc("register", "acc", t.dtype, 1, ident))
                if st.reduce in ("max=", "min=") and is_float(t.dtype):
                    self._nan_flag.add(s.name)
                    scope.append(Alloc("flag", "acc_nan", "int32", 1, Literal(0, "int32")))
        clause: tuple[ReductionClause, ...] = ()
        if lp.vector and lp.reduce and acc_at is not None and not s.tile_loops():
            clause = (ReductionClause(CLAUSE_OP[st.reduce], "acc"),)
            if s.name in self._nan_flag:
                clause += (ReductionClause("or", "acc_nan"),)
        if lp.vector and st.reduce == "=":  # sums folded into me combine their registers across the lanes
            clause = tuple(ReductionClause(CLAUSE_OP[self.stages[n].stmt.reduce], self.fold_register(n))
                           for n in s.reduce_epilogues)
        if lp.vector:  # rows computed ahead in my loop combine theirs
            clause += self.ahead_clauses(s)
        v = self.var[s.name][lp.name]
        inner = bounds  # bounds of the loops that accumulate; the write-back below keeps ``bounds``
        if acc_at is not None and not lp.reduce and k >= s.index_of(acc_at) and v in bounds \
                and self.overrun_is_safe(s, v):
            # accumulate the whole tile: lanes past the tail read zero padding (or in-bounds data) and
            # are never written back; a constant trip count keeps the tile in registers (4x on co=1000)
            inner = {u: b for u, b in bounds.items() if u != v}
        out = scope if is_acc else []
        if (clause and st.reduce == "+=" and k == len(s.loops) - 1 and v not in inner and lp.extent >= 2 * self.lanes
                and lp.extent % self.lanes == 0 and not self.attached.get((s.name, lp.name))):
            out.append(self.split_sum(s, lp, k, inner))
        else:
            body: list[Node] = []
            guards = self._guards  # an attached stage computes its own tail guards; restore ours after it
            ahead = [c for c in self.attached.get((s.name, lp.name), []) if c.next_row_into is not None]
            for child in self.attached.get((s.name, lp.name), []):
                if child.next_row_into is not None:  # reduced a row ahead in a sibling's loop (NextRow)
                    body.extend(self.row_from_register(child))
                elif child.reduce_epilogue_of is None:  # (a sum folded into a sibling runs in its loops)
                    body.append(self.stage(child))
            self._guards = guards
            boxes = self.boxes.get((s.name, lp.name), [])
            body.extend(self.box_slots(s, lp))
            body.extend(self.box_pack(s, b) for b in boxes)
            self._in_box.update({b.tensor: b for b in boxes})
            body.extend(self.prefetches(s, lp))
            body.extend(self.loops(s, k + 1, inner))
            for b in boxes:
                del self._in_box[b.tensor]
            if ahead:
                out.extend(self.first_row(s, lp, ahead))
            chosen = s.transpose_block if s.transpose_block and s.transpose_block[0] == lp.name else None
            around = self.var[s.name][chosen[2]] if chosen and chosen[2] else None
            out.append(self.transposed(self.make_loop(s, lp, inner, body, clause), chosen, around))
        if not is_acc:
            return out
        wb: list[Node] = []
        ref = self.out_access(s)
        acc = RegisterRef("acc") if not tile else self.tile_ref(s)
        if s.name in self._nan_flag:
            wb.append(RestoreNan(acc, "acc_nan"))
            self._nan_flag.discard(s.name)
        if any(x.bind and x.reduce for x in s.loops):  # a reduction shared by a block's threads (GPU)
            wb.append(ThreadReduce(acc, st.reduce, t.dtype))
        guard = [g for g, on_reduce in self._guards if not on_reduce]
        first = self.first_blocks(s)
        if first is not None and s.epilogue is not None:
            wb.extend(self.blocks_then_epilogue(s, first, acc, guard))
        elif first is not None:
            wb.extend(self.block_write_backs(s, ref, acc, first, guard))
        elif self.stored(s):
            wb.append(self._guarded(guard, WriteBack(ref, acc, st.reduce if s.partial else None, t.dtype)))
        if s.epilogue is not None and first is None:
            if s.partial:
                raise AssertionError(f"epilogue of {s.name}, whose accumulator holds a partial reduction")
            wb.append(self.epilogue(s, self.stages[s.epilogue], Load(acc), guard))
        for name in s.reduce_epilogues:
            wb.append(self.reduce_epilogue(s, self.stages[name], Load(acc), guard))
        for group in self.by_block(wb) if tile else [self.unblocked(wb)]:
            for x in reversed(tile):
                if x.vector and self.lanes_collide(s, x):
                    x = replace(x, vector=False)  # lanes would update one element of a folded reduction
                group = [self.make_loop(s, x, bounds, group)]
            out.extend(group)
        return [Scope(tuple(out))]

    def transposed(self, lp: Loop, chosen: tuple[str, bool, str] | None = None, around: str | None = None) -> Loop:
        """``lp`` as a ``transposed`` loop when it and the one loop it holds walk an L x L block (L: 8 or 16, at
        most the target's float32 lanes) of one float32 copy that reads contiguously along ``lp`` and writes
        contiguously along the inner loop; else ``lp``. ``chosen``: the stage's TransposeBlock at this loop (its
        plan is checked: tails allowed, which make partial blocks, its ``stream``, and its ``prefetch``, the
        source's stride along loop ``around``, a loop outside the pair); without one, a block that
        needs nothing else (a transpose's block, see ``schedule.elementwise.transpose_schedule``, or a pack's):
        plain loops only, no tails, guards, padding or wrapped indices."""
        lanes = lp.extent
        why = None
        inner = lp.body[0] if len(lp.body) == 1 else None
        a = inner.body[0] if isinstance(inner, Loop) and len(inner.body) == 1 else None
        if self.plan.target.kind != "cpu" or lanes not in (8, 16) or lanes > self.plan.target.lanes("float32") \
                or lp.kind != "serial" or (lp.tail and not chosen):
            why = "not a serial loop of a vector's lanes"
        elif not isinstance(inner, Loop) or inner.kind != "serial" or inner.extent != lanes \
                or (inner.tail and not chosen) or not isinstance(a, Assign):
            why = "the loop does not hold one loop of as many iterations around one copy"
        elif not isinstance(a.target, BufferAccess) or not isinstance(a.value, Load) or a.value.checks \
                or not isinstance(a.value.source, BufferAccess):
            why = "the copy is not from one buffer to another without checks"
        else:
            src, dst = a.value.source, a.target
            if src.dtype != "float32" or dst.dtype != "float32" or src.index.wrapped or dst.index.wrapped:
                why = "the copy is not of float32 at plain indices"
            elif src.stride(lp.var) != 1 or dst.stride(inner.var) != 1 or not src.stride(inner.var) \
                    or not dst.stride(lp.var) or src.stride(inner.var) < lanes or dst.stride(lp.var) < lanes:
                why = "the copy does not read along the loop and write along the inner one"
        ahead = 0
        if why is None and around is not None:
            ahead = a.value.source.stride(around) or 0
            if not ahead:
                why = f"the next block's source along {around!r} is not at a constant stride"
        if why is None:
            return replace(lp, kind="transposed", stream=bool(chosen and chosen[1]), prefetch=ahead)
        if chosen:  # (plan_check admits only blocks that lower to this)
            raise ScheduleError(f"TransposeBlock({lp.stage}, {lp.var}): {why}")
        return lp

    def split_sum(self, s: Stage, lp: PlanLoop, k: int, bounds: Bounds) -> Scope:
        """A vectorized scalar sum as ``lanes`` partial sums (four vector registers) added up at the end.

        One vector accumulator makes the loop wait on its add latency every iteration; four
        independent ones overlap (softmax's row sum: 13% faster)."""
        dtype = self.types[s.name].dtype
        v = self.var[s.name][lp.name]
        lanes = self.lanes
        self._acc_ref = RegisterRef("acc_v", Affine.var("so_l"))
        try:
            body = self.loops(s, k + 1, bounds)
        finally:
            self._acc_ref = None
        lane_loop = Loop("so_l", lanes, "vectorized", (SplitIndex(v, "so_o", lanes, "so_l"), *body),
                         reductions=self.ahead_clauses(s), reduce=True)
        return Scope((
            Alloc("register_tile", "acc_v", dtype, lanes),
            Fill("acc_v", lanes, Literal(0, "int64"), "so_l"),  # an integer zero (converts to any element type)
            Loop("so_o", lp.extent // lanes, "serial", (lane_loop,), reduce=True),
            CombineLanes(RegisterRef("acc"), "acc_v", lanes, "so_l"),
        ))

    def overrun_is_safe(self, s: Stage, var: str) -> bool:
        """Whether tile loop ``var`` may run to its full extent past a tail: every read stays in its buffer.

        Only for spatial loops inside an accumulator: an extra iteration fills a tile lane that is never
        written back. (An extra reduction iteration would add into a real lane.)"""
        for a in s.stmt.expr.accesses():
            if a.tensor in s.stmt.pad_value:
                continue  # guarded read
            lins = [self.affine_lin(s, ix) for ix in a.index]
            if not any(var in lin.vars() for lin in lins):
                continue
            shape = self.types[a.tensor].shape
            lay = self.plan.packs.get(a.tensor)
            for axis, (lin, n) in enumerate(zip(lins, shape)):
                if var not in lin.vars():
                    continue  # (bounded by its own loops' tails, which stay: a tiled reduction's last block)
                if lay is not None and lay.split_axis >= 0 and lay.perm[lay.split_axis] == axis:
                    n = math.ceil(n / lay.factor) * lay.factor  # the packed copy is zero-filled to here
                lo, hi = lin.bounds(self.extents)
                if lo < 0 or hi >= n:
                    return False
        return True

    def lanes_collide(self, s: Stage, lp: PlanLoop) -> bool:
        """Whether tile loop ``lp`` walks a dim that one of the reductions folded into ``s`` sums over."""
        walked = {d for d, lin in s.dims.items() if lp.name in lin.vars()}
        for name in s.reduce_epilogues:
            e = self.stages[name]
            dims = reduce_epilogue_dims(e.stmt, s.stmt) or {}
            if walked & {dims[d] for d in e.stmt.reduce_dims if d in dims}:
                return True
        return False

    # ---- whole kernel -------------------------------------------------------------------------

    def kernel(self) -> LoopNest:
        c = self.plan.compute
        args = list(c.inputs) + list(c.outputs)
        params = tuple(Param(n, self.types[n].dtype, n in c.inputs, i) for i, n in enumerate(args))
        buffered = [s for s in self.stages.values() if s.attach is None]  # epilogue stages included
        roots = [s for s in buffered if s.epilogue_of is None and s.reduce_epilogue_of is None]
        temps = [s for s in buffered if s.name not in c.outputs and self.stored(s)]
        workspace = tuple(Alloc("workspace", s.name, self.types[s.name].dtype, self.types[s.name].size,
                                arg_index=len(args) + i) for i, s in enumerate(temps))
        boxes = [b for bs in self.boxes.values() for b in bs]
        threads = max(1, self.plan.target.threads)  # (a slot of each box's workspace a thread)
        workspace += tuple(Alloc("workspace", box_workspace(b.tensor), self.types[b.tensor].dtype, b.size * threads,
                                 arg_index=len(args) + len(workspace) + i) for i, b in enumerate(boxes))
        body = tuple(self.stage(s) for s in roots)
        packs = tuple(self.pack(t) for t in self.plan.packs if not any(b.tensor == t for b in boxes))
        box_packs = tuple(self.pack(b.tensor, b) for b in boxes)
        target = self.plan.target
        lanes = target.lanes("float32") if target.kind == "cpu" else None
        return LoopNest(params, workspace, body, packs, tuple(c.inputs), tuple(c.outputs), lanes, box_packs,
                        threads if boxes else 0)


