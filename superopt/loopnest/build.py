"""KernelPlan -> LoopNest: every structural decision of code generation, made once, for any printer.

Decided here: loop variable names (an attached stage's are prefixed with its name), where an
accumulator lives and its size, its init, accumulate and write-back, NaN flags of float max/min
into a scalar, vectorized sums split into partial sums (``target.split_sum_lanes``), tail bounds
(a bound on the innermost loop of the tail, else a guard), tile lanes that may safely overrun a
tail, flattened (and packed) indices, padding checks, epilogues, which producers are stored,
workspace and local buffers, and the element type of every value.
"""

from __future__ import annotations

import math
from dataclasses import replace

from superopt.ir.expr import (
    BOOL_FNS,
    SAME_TYPE_FNS,
    Access,
    Affine,
    Binary,
    Cast,
    Compare,
    Const,
    DivMod,
    Expr,
    IndexValue,
    Unary,
    Where,
    substitute_dims,
)
from superopt.ir.statement import REDUCE_IDENTITY
from superopt.ir.types import TensorType, is_float
from superopt.lang.parser import infer_dtype
from superopt.loopnest.alloc import Alloc, Fill
from superopt.loopnest.gpu import ThreadReduce
from superopt.loopnest.index import BufferAccess, FlatIndex, GuardCond, InBounds, RegisterRef, WrappedTerm
from superopt.loopnest.index_sets import split_index_sets
from superopt.loopnest.kernel import Joined, LoopNest, PackNest, Param
from superopt.loopnest.loop import Loop, ReductionClause, TailLimit
from superopt.loopnest.statements import (
    Accumulate,
    Assign,
    CombineLanes,
    Epilogue,
    Guard,
    Node,
    Prefetch,
    RestoreNan,
    Scope,
    SplitIndex,
    StageNest,
    WriteBack,
)
from superopt.loopnest.values import IndexNumber, Literal, Load, Op, Value
from superopt.loopnest.versioning import peel_tile_tails
from superopt.schedule.plan import KernelPlan, Stage, local_shape, next_row_shift, reduce_epilogue_dims
from superopt.schedule.plan import Loop as PlanLoop

_CLAUSE_OP = {"+=": "+", "*=": "*", "max=": "max", "min=": "min"}
PARALLEL_PACK_ELEMENTS = 1 << 16  # a pack this large is split among the threads (a parallel region costs a few us)

Bounds = dict[str, tuple[TailLimit, ...]]  # loop var -> its tail limits


def build_loopnest(plan: KernelPlan) -> LoopNest:
    """The loop nest of ``plan`` (a legal lowering): kernel body and pack routines."""
    nest = _Builder(plan).kernel()
    if plan.target.kind == "cpu":  # (the CUDA printer maps tiles to threads: no tails to version there)
        nest = peel_tile_tails(split_index_sets(nest, min_parallel=2 * plan.target.threads))
    return nest


class _Builder:
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

    # ---- index algebra ----------------------------------------------------------------------
    def dim_lin(self, s: Stage, d: str) -> Affine:
        if d in s.bound:
            cons = self.stages[s.attach[0]]
            return self._rename(cons, cons.dims[s.bound[d]])  # a loop var, or div/mod atoms of a fused one
        if d in s.block:  # the block's origin (consumer loops) + my loop over the block
            return self.block_origin(s, d) + self._rename(s, s.dims[d])
        return self._rename(s, s.dims[d])

    def block_origin(self, s: Stage, d: str) -> Affine:
        """Where attached stage ``s``'s block of dim ``d`` starts, in the consumer's loop variables."""
        return self._rename(self.stages[s.attach[0]], s.block[d][1])

    def _rename(self, s: Stage, e: Affine) -> Affine:
        """Plan loop names -> loop variables."""
        cv = self.var[s.name]
        out = Affine.of({}, e.const)
        for a, c in e.terms:
            atom = cv[a] if isinstance(a, str) else DivMod(a.op, cv[a.var], a.divisor)
            out = out + Affine.of({atom: c})
        return out

    def affine_lin(self, s: Stage, ix: Affine) -> Affine:
        out = Affine.of({}, ix.const)
        for d, c in ix.terms:
            out = out + self.dim_lin(s, d).scale(c)
        return out

    def buffer_axes(self, tensor: str) -> tuple[tuple[int, ...], list[int] | None]:
        """Shape of the tensor's buffer and, for an attached temp, the axes kept."""
        st = self.stages.get(tensor)
        if st is not None and st.attach is not None:
            keep = [i for i, d in enumerate(st.stmt.out_dims) if d not in st.bound]
            return tuple(n for _, n in local_shape(st)), keep
        if tensor in self.plan.packs:
            return self.plan.packs[tensor].shape, None
        return self.types[tensor].shape, None

    def access(self, s: Stage, tensor: str, index: tuple[Affine, ...]) -> BufferAccess:
        lins = [self.affine_lin(s, ix) for ix in index]
        stage = self.stages.get(tensor)
        if stage is not None and stage.in_place is not None:  # stored in its consumer's rows (InPlace)
            tensor = stage.in_place
        shape, keep = self.buffer_axes(tensor)
        if keep is not None:
            owner = self.stages[tensor]  # a block of the attached stage's dim is indexed from its origin
            lins = [lins[i] + self.block_origin(owner, d).scale(-1) if d in owner.block else lins[i]
                    for i, d in ((i, owner.stmt.out_dims[i]) for i in keep)]
        layout = self.plan.packs.get(tensor)
        parts = layout.map_index(lins) if layout is not None else lins
        return BufferAccess(tensor, self._flat(parts, shape), self.types[tensor].dtype, layout)

    def _flat(self, parts: list, shape: tuple[int, ...]) -> FlatIndex:
        stride = 1
        total = Affine.of()
        wrapped: list[WrappedTerm] = []
        for part, n in reversed(list(zip(parts, shape))):
            if isinstance(part, tuple):
                kind, lin, f = part
                q, r = _divmod(lin, f, self.extents)
                if kind == "div":
                    if q is not None:
                        total = total + q.scale(stride)
                    else:
                        wrapped.append(WrappedTerm(stride, lin, "/", f))
                else:
                    if r is not None:
                        total = total + r.scale(stride)
                    else:
                        wrapped.append(WrappedTerm(stride, lin, "%", f))
            else:
                total = total + part.scale(stride)
            stride *= n
        return FlatIndex(total.simplify(), tuple(wrapped))

    # ---- values -------------------------------------------------------------------------------
    def value(self, s: Stage, e: Expr, want: str) -> Value:
        types = self.types
        if isinstance(e, Access):
            if e.tensor in self._acc_override:
                return self._acc_override[e.tensor]
            ref = self.access(s, e.tensor, e.index)
            pad = s.stmt.pad_value.get(e.tensor)
            if pad is None:
                return Load(ref)
            checks = []
            for ix, n in zip(e.index, types[e.tensor].shape):
                lin = self.affine_lin(s, ix)
                lo, hi = lin.bounds(self.extents)
                if lo < 0 or hi >= n:
                    checks.append(InBounds(lin.simplify(), lo < 0, n if hi >= n else None))
            if not checks:
                return Load(ref)
            return Load(ref, tuple(checks), Literal(pad, types[e.tensor].dtype))
        if isinstance(e, Const):
            return Literal(e.value, want if want != "bool" or isinstance(e.value, bool) else "float32")
        if isinstance(e, IndexValue):
            return IndexNumber(self.affine_lin(s, e.index).simplify(), want if is_float(want) else "int64")
        folded = _index_affine(e)
        if folded is not None and isinstance(e, Binary):  # index arithmetic: one int64 affine value
            return IndexNumber(self.affine_lin(s, folded).simplify(), want if is_float(want) else "int64")
        if isinstance(e, Compare) and folded is None:
            a, b = _index_affine(e.a), _index_affine(e.b)
            if a is not None and b is not None:  # compare index expressions as integers, never as floats:
                # gcc 12 -O3 -mavx2 miscompiles the vectorized int64-to-float compare (a Trilu mask lost rows)
                diff = self.affine_lin(s, a + b.scale(-1)).simplify()
                return Op(e.op, (IndexNumber(diff, "int64"), Literal(0, "int64")), "bool")
        dt = infer_dtype(e, types, want)
        fdt = dt if is_float(dt) else "float32"
        if isinstance(e, Unary):
            if e.fn in BOOL_FNS:  # a test of the operand as it is (isnan of a double stays a double)
                xt = infer_dtype(e.x, types, "float32")  # literals are floats (isnan(nan) holds)
                if not is_float(xt):  # integers are never NaN or infinite
                    return Literal(False, "bool")
                return Op(e.fn, (self.value(s, e.x, xt),), dt)
            return Op(e.fn, (self.value(s, e.x, dt if e.fn in SAME_TYPE_FNS else fdt),), dt)
        if isinstance(e, Binary):
            return Op(e.op, (self.value(s, e.a, dt), self.value(s, e.b, dt)), dt)
        if isinstance(e, Compare):
            kd = infer_dtype(e.a, types, want)
            kd2 = infer_dtype(e.b, types, want)
            k = kd if is_float(kd) else kd2
            return Op(e.op, (self.value(s, e.a, k), self.value(s, e.b, k)), "bool")
        if isinstance(e, Where):
            return Op("where", (self.value(s, e.cond, "bool"), self.value(s, e.a, dt), self.value(s, e.b, dt)), dt)
        if isinstance(e, Cast):
            return Op("cast", (self.value(s, e.x, infer_dtype(e.x, types, want)),), e.dtype)
        raise TypeError(f"cannot lower expression {e!r}")

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

    @staticmethod
    def fold_register(name: str) -> str:
        """The register a sum folded into an elementwise stage accumulates in."""
        return f"{name}_acc"

    def fold_dims(self, e: Stage, prod: Stage) -> dict[str, Affine]:
        """The folded reduction ``e``'s dims as ``prod``'s (a kept axis of extent 1 at 0)."""
        dims = reduce_epilogue_dims(e.stmt, prod.stmt)
        assert dims is not None, f"{e.name} folded into {prod.name} without a legality check"
        return {d: Affine.dim(dims[d]) if d in dims else Affine.of() for d in e.stmt.extent}

    def folded_sums(self, s: Stage, guard: list[GuardCond]) -> list[Node]:
        """The sums folded into elementwise ``s``, each element added as it is computed."""
        out: list[Node] = []
        for name in s.reduce_epilogues:
            e = self.stages[name]
            dtype = self.types[name].dtype
            val = self.value(s, substitute_dims(e.stmt.expr, self.fold_dims(e, s)), dtype)
            out.append(self._guarded(guard, Accumulate(RegisterRef(self.fold_register(name)), e.stmt.reduce, val,
                                                       dtype)))
        return out

    @staticmethod
    def ahead_register(name: str) -> str:
        """The register a row reduction computed a row ahead (NextRow) accumulates the next row in."""
        return f"{name}_next"

    def ahead_flag(self, m: Stage) -> str | None:
        """Its NaN flag (a float max= or min=), else None."""
        return f"{m.name}_next_nan" if m.stmt.reduce in ("max=", "min=") else None

    def ahead_clauses(self, s: Stage) -> tuple[ReductionClause, ...]:
        """The lane combinations of the rows computed ahead in ``s``'s (vectorized) loop."""
        out: tuple[ReductionClause, ...] = ()
        for n in s.next_rows:
            out += (ReductionClause(_CLAUSE_OP[self.stages[n].stmt.reduce], self.ahead_register(n)),)
            if self.ahead_flag(self.stages[n]):
                out += (ReductionClause("or", self.ahead_flag(self.stages[n])),)
        return out

    def rows_ahead(self, s: Stage, guard: list[GuardCond]) -> list[Node]:
        """The row reductions computed a row ahead in ``s``: each element of the next row combined into
        its register as ``s`` visits this row's element (``s``'s dims, the row one iteration of the row
        loop on), except in the row loop's last iteration (no next row there)."""
        out: list[Node] = []
        for name in s.next_rows:
            m = self.stages[name]
            cname, loop = m.attach
            row, step = next_row_shift(self.plan, m)
            at = {cd: ed for ed, cd in s.bound.items()}
            (walked,) = [d for d, n in s.stmt.extents if d not in s.bound and n > 1]
            mapping: dict[str, Affine] = {}
            for d, n in m.stmt.extents:
                if d in m.bound:
                    mapping[d] = Affine.dim(at[m.bound[d]]) + Affine.of({}, step if m.bound[d] == row else 0)
                else:
                    mapping[d] = Affine.dim(walked) if n > 1 else Affine.of()
            dtype = self.types[name].dtype
            val = self.value(s, substitute_dims(m.stmt.expr, mapping), dtype)
            c = self.stages[cname]
            extent = {lp.name: lp.extent for lp in c.loops}
            conds = [*guard, GuardCond(Affine.var(self.var[cname][loop]), extent[loop] - 1)]
            # past the row dim's end (a tail of its split): the last row of the tail has no next row either
            lin = c.dims[row]
            top = lin.const + step + sum(k * (extent[a] - (2 if a == loop else 1)) for a, k in lin.terms if k > 0)
            if top >= c.stmt.extent[row]:
                conds.append(GuardCond(Affine.of({self.var[cname][a]: k for a, k in lin.terms}, lin.const + step),
                                       c.stmt.extent[row]))
            out.append(self._guarded(conds, Accumulate(RegisterRef(self.ahead_register(name)), m.stmt.reduce, val,
                                                       dtype, self.ahead_flag(m))))
        return out

    def first_row(self, s: Stage, lp: PlanLoop, ahead: list[Stage]) -> list[Node]:
        """Before loop ``lp`` of consumer ``s``: the registers of the row reductions computed a row ahead,
        and those reductions for the loop's first row, computed on their own (the loop's variable at 0)."""
        out: list[Node] = []
        body: list[Node] = []
        guards = self._guards
        for m in ahead:
            dtype = self.types[m.name].dtype
            out.append(Alloc("register", self.ahead_register(m.name), dtype, 1,
                             Literal(REDUCE_IDENTITY[m.stmt.reduce], dtype)))
            if self.ahead_flag(m):
                out.append(Alloc("flag", self.ahead_flag(m), "int32", 1, Literal(0, "int32")))
            body.append(self.stage(m))
            body.append(Assign(RegisterRef(self.ahead_register(m.name)), Load(self.row_access(m))))
        self._guards = guards
        out.append(Loop(self.var[s.name][lp.name], 1, "serial", tuple(body), (), (), False, s.name))
        return out

    def row_from_register(self, m: Stage) -> list[Node]:
        """In the row loop, a row reduction computed a row ahead: its row buffer set from its register."""
        size = math.prod(n for _, n in local_shape(m))
        return [Alloc("local", m.name, self.types[m.name].dtype, size),
                Assign(self.row_access(m), Load(RegisterRef(self.ahead_register(m.name))))]

    def row_access(self, m: Stage) -> BufferAccess:
        """``m``'s element for the consumer's current row, outside ``m``'s own loops (its output dims
        are bound to the consumer's, or of extent 1)."""
        return self.access(m, m.name, tuple(Affine.dim(d) if d in m.bound else Affine.of() for d in m.stmt.out_dims))

    def out_access(self, s: Stage) -> BufferAccess:
        return self.access(s, s.name, tuple(Affine.dim(d) for d in s.stmt.out_dims))

    def tile_ref(self, s: Stage) -> RegisterRef:
        tile = s.tile_loops()
        if not tile:
            return RegisterRef("acc")
        cv = self.var[s.name]
        lin = Affine.of()
        stride = 1
        for lp in reversed(tile):
            lin = lin + Affine.of({cv[lp.name]: stride})
            stride *= lp.extent
        return RegisterRef("acc", lin)

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
            clause = (ReductionClause(_CLAUSE_OP[st.reduce], "acc"),)
            if s.name in self._nan_flag:
                clause += (ReductionClause("or", "acc_nan"),)
        if lp.vector and st.reduce == "=":  # sums folded into me combine their registers across the lanes
            clause = tuple(ReductionClause(_CLAUSE_OP[self.stages[n].stmt.reduce], self.fold_register(n))
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
            body.extend(self.prefetches(s, lp))
            body.extend(self.loops(s, k + 1, inner))
            if ahead:
                out.extend(self.first_row(s, lp, ahead))
            out.append(self.transposed(self.make_loop(s, lp, inner, body, clause)))
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
        for x in reversed(tile):
            if x.vector and self.lanes_collide(s, x):
                x = replace(x, vector=False)  # lanes would update one element of a folded reduction
            wb = [self.make_loop(s, x, bounds, wb)]
        out.extend(wb)
        return [Scope(tuple(out))]

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

    def transposed(self, lp: Loop) -> Loop:
        """``lp`` as a ``transposed`` loop when it and the one loop it holds walk an L x L block (L: 8 or 16, at
        most the target's float32 lanes) of one float32 copy that reads contiguously along ``lp`` and writes
        contiguously along the inner loop (a transpose's block, see ``default.transpose_schedule``); else
        ``lp``. Plain loops only: no tails, guards, padding or wrapped indices."""
        lanes = lp.extent
        if self.plan.target.kind != "cpu" or lanes not in (8, 16) or lanes > self.plan.target.lanes("float32") \
                or lp.kind != "serial" or lp.tail or len(lp.body) != 1:
            return lp
        inner = lp.body[0]
        if not isinstance(inner, Loop) or inner.kind != "serial" or inner.extent != lanes or inner.tail \
                or len(inner.body) != 1 or not isinstance(inner.body[0], Assign):
            return lp
        a = inner.body[0]
        if not isinstance(a.target, BufferAccess) or not isinstance(a.value, Load) or a.value.checks \
                or not isinstance(a.value.source, BufferAccess):
            return lp
        src, dst = a.value.source, a.target
        if src.dtype != "float32" or dst.dtype != "float32" or src.index.wrapped or dst.index.wrapped:
            return lp
        if src.stride(lp.var) != 1 or dst.stride(inner.var) != 1 or not src.stride(inner.var) \
                or not dst.stride(lp.var) or src.stride(inner.var) < lanes or dst.stride(lp.var) < lanes:
            return lp
        return replace(lp, kind="transposed")

    def first_blocks(self, s: Stage) -> Affine | None:
        """For a stage whose accumulator holds a partial reduction (reduction loops outside it), the sum of
        those loops' variables: zero exactly at the first visit of each output element, whose write-back
        then stores the tile instead of combining it into a buffer filled with the identity beforehand (no
        fill pass: one parallel region fewer). None where the buffer is filled (no accumulator, a GPU target)."""
        at = s.acc_at
        if not s.partial or at is None or self.plan.target.kind != "cpu" or s.reduce_epilogues \
                or not (self.stored(s) or s.epilogue is not None):
            return None
        cv = self.var[s.name]
        return Affine.of({cv[lp.name]: 1 for lp in s.loops[:s.index_of(at)] if lp.reduce})

    def block_write_backs(self, s: Stage, buf: BufferAccess, acc: RegisterRef, first: Affine,
                          guard: list[GuardCond]) -> list[Node]:
        """A partial reduction's tile into ``buf``: the first reduction block (``first`` == 0) stores it,
        the later ones combine into it (each under ``guard``)."""
        dtype = self.types[s.name].dtype
        return [self._guarded(guard + [GuardCond(first, 1)], WriteBack(buf, acc, None, dtype)),
                self._guarded(guard + [GuardCond(first.scale(-1), 0)], WriteBack(buf, acc, s.stmt.reduce, dtype))]

    def blocks_then_epilogue(self, s: Stage, first: Affine, acc: RegisterRef, guard: list[GuardCond]) -> list[Node]:
        """The write-back of a partial reduction with an epilogue: the blocks before the last keep the
        running sum in a buffer (the producer's own when it is stored, else the epilogue's output, which
        the last block overwrites): the first stores it, the later ones combine into it; the last block
        adds it to its tile, then stores the producer (when stored) and runs the epilogue on the sum.
        ``first`` is the sum of the outer reduction loops' variables, at its largest in the last block."""
        st, dtype = s.stmt, self.types[s.name].dtype
        e = self.stages[s.epilogue]  # type: ignore[index]
        last = sum(lp.extent - 1 for lp in s.loops[:s.index_of(s.acc_at)] if lp.reduce)  # type: ignore[arg-type]
        stored = self.stored(s)
        buf = self.out_access(s) if stored else self.access(s, e.name, tuple(Affine.dim(d) for d in st.out_dims))
        is_last = guard + [GuardCond(first.scale(-1), 1 - last)]  # -sum < 1 - last: sum == last
        out: list[Node] = []
        if last > 0:
            out.extend(self.block_write_backs(s, buf, acc, first, guard + [GuardCond(first, last)]))
            out.append(self._guarded(is_last, Accumulate(acc, st.reduce, Load(buf), dtype)))
        if stored:
            out.append(self._guarded(is_last, WriteBack(buf, acc, None, dtype)))
        out.append(self.epilogue(s, e, Load(acc), is_last))
        return out

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
                if lay is not None and lay.split_axis >= 0 and lay.perm[lay.split_axis] == axis:
                    n = math.ceil(n / lay.factor) * lay.factor  # the packed copy is zero-filled to here
                lo, hi = lin.bounds(self.extents)
                if lo < 0 or hi >= n:
                    return False
        return True

    def stored(self, s: Stage) -> bool:
        """False for a producer whose only reader is its epilogue: it lives in registers only."""
        if (s.epilogue is None and not s.reduce_epilogues) or s.name in self.plan.compute.outputs:
            return True
        folded = {s.epilogue, *s.reduce_epilogues}
        return any(s.name in x.stmt.inputs() for x in self.stages.values() if x.name not in folded)

    def lanes_collide(self, s: Stage, lp: PlanLoop) -> bool:
        """Whether tile loop ``lp`` walks a dim that one of the reductions folded into ``s`` sums over."""
        walked = {d for d, lin in s.dims.items() if lp.name in lin.vars()}
        for name in s.reduce_epilogues:
            e = self.stages[name]
            dims = reduce_epilogue_dims(e.stmt, s.stmt) or {}
            if walked & {dims[d] for d in e.stmt.reduce_dims if d in dims}:
                return True
        return False

    def reduce_epilogue(self, s: Stage, e: Stage, acc: Value, guard: list[GuardCond]) -> Epilogue:
        """A reduction folded into ``s``'s write-back: its buffer combined with its expression of the
        tile element, in ``s``'s loop variables (its dims renamed to the producer's by its read of it)."""
        ren = self.fold_dims(e, s)
        expr = substitute_dims(e.stmt.expr, ren)
        dtype = self.types[e.name].dtype
        self._acc_override[s.name] = acc
        try:
            val = self.value(s, expr, dtype)
        finally:
            del self._acc_override[s.name]
        store = Accumulate(self.access(s, e.name, tuple(ren[d] for d in e.stmt.out_dims)), e.stmt.reduce, val, dtype)
        return Epilogue(e.name, str(e.stmt), Guard(tuple(guard), store) if guard else store)

    def epilogue(self, s: Stage, e: Stage, acc: Value, guard: list[GuardCond]) -> Epilogue:
        """The epilogue stage's statement at the producer's write-back, in the producer's loop variables."""
        here = tuple(Affine.dim(d) for d in s.stmt.out_dims)
        expr = substitute_dims(e.stmt.expr, dict(zip(e.stmt.out_dims, here)))
        self._acc_override[s.name] = acc
        try:
            val = self.value(s, expr, self.types[e.name].dtype)
        finally:
            del self._acc_override[s.name]
        store = Assign(self.access(s, e.name, here), val)
        return Epilogue(e.name, str(e.stmt), Guard(tuple(guard), store) if guard else store)

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
        body = tuple(self.stage(s) for s in roots)
        packs = tuple(self.pack(t) for t in self.plan.packs)
        return LoopNest(params, workspace, body, packs, tuple(c.inputs), tuple(c.outputs))

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
        parallel = self.pack_parallel(lay.shape)
        dtype = self.types[tensor].dtype
        return PackNest(tensor, dtype, lay, loops, lay.src_shape, tuple(src), in_range, parallel,
                        self.pack_transpose(loops, tuple(src), lay.src_shape, dtype, in_range, parallel))

    def pack_transpose(self, loops: tuple[tuple[str, int], ...], src: tuple[str | Joined, ...],
                       src_shape: tuple[int, ...], dtype: str, in_range, parallel: int
                       ) -> tuple[str, str, int, int, int] | None:
        """Blocks of a vector's lanes squared, transposed in registers, when the packed innermost axis ``p``
        reads the source with a stride and the source's innermost axis is a plain loop ``q`` of the pack: both
        extents multiples of the block, neither among the parallel loops, float32 on a CPU of 8 or 16 lanes.
        Returns (p, q, block, the source's stride along p, the packed layout's stride along q)."""
        target = self.plan.target
        block = target.lanes("float32")
        if target.kind != "cpu" or dtype != "float32" or block not in (8, 16) or in_range is not None:
            return None
        extent = dict(loops)
        p, q = loops[-1][0], src[-1]
        if not isinstance(q, str) or q == p or extent[p] % block or extent[q] % block:
            return None
        axis = next((a for a, ix in enumerate(src[:-1]) if ix == p or (isinstance(ix, Joined) and ix.inner == p)), None)
        if axis is None or {p, q} & {v for v, _ in loops[:parallel]}:
            return None
        q_at = [v for v, _ in loops].index(q)
        return p, q, block, math.prod(src_shape[axis + 1:]), math.prod(n for _, n in loops[q_at + 1:])

    def pack_parallel(self, shape: tuple[int, ...]) -> int:
        """Leading pack loops the threads share: the fewest giving each thread 4 parts, none for a copy under
        :data:`PARALLEL_PACK_ELEMENTS` (a run-time input packed on every call: attention's keys, 0.1 ms alone)."""
        threads = self.plan.target.threads
        if self.plan.target.kind != "cpu" or threads < 2 or math.prod(shape) < PARALLEL_PACK_ELEMENTS:
            return 0
        for k in range(1, len(shape)):
            if math.prod(shape[:k]) >= 4 * threads:
                return k
        return 0


def _divmod(lin: Affine, f: int, extents: dict[str, int]) -> tuple[Affine | None, Affine | None]:
    """Split lin = f*q + r exactly when the remainder terms stay in [0, f)."""
    q, r = {}, {}
    for a, c in lin.simplify().terms:
        if c % f == 0:
            q[a] = c // f
        else:
            r[a] = c
    rc = lin.const % f
    qc = lin.const // f
    rl = Affine.of(r, rc)
    try:
        lo, hi = rl.bounds(extents)
    except KeyError:
        return None, None
    if lo >= 0 and hi < f:
        return Affine.of(q, qc), rl
    return None, None


def _index_affine(e: Expr) -> Affine | None:
    """``e`` as an integer affine function of the index variables, when it is one (index values, integral
    constants, sums, differences, products by a constant); None otherwise."""
    if isinstance(e, IndexValue):
        return e.index
    if isinstance(e, Const):
        v = e.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() or abs(v) > 2**31:
            return None
        return Affine.of({}, int(v))
    if isinstance(e, Binary) and e.op in ("+", "-", "*"):
        a, b = _index_affine(e.a), _index_affine(e.b)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a + b.scale(-1)
        if not a.terms:
            return b.scale(a.const)
        if not b.terms:
            return a.scale(b.const)
    return None
