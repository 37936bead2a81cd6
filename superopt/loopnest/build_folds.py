"""Sums folded into an elementwise stage and rows computed ahead (chained reductions) for the loop-nest
builder: their registers, flags, reduction clauses and the first row computed before the loop."""

from __future__ import annotations

import math

from superopt.ir.expr import Affine, substitute_dims
from superopt.ir.statement import REDUCE_IDENTITY
from superopt.loopnest.alloc import Alloc
from superopt.loopnest.index import BufferAccess, GuardCond, RegisterRef
from superopt.loopnest.loop import CLAUSE_OP, Loop, ReductionClause
from superopt.loopnest.statements import Accumulate, Assign, Node
from superopt.loopnest.values import Literal, Load
from superopt.schedule.kernel_plan import Loop as PlanLoop
from superopt.schedule.kernel_plan import Stage, local_shape
from superopt.schedule.plan_check import next_row_shift, reduce_epilogue_dims


class FoldedRows:
    """Mixed into the loop-nest builder (``superopt.loopnest.build``): the state it reads is the builder's."""

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
            out += (ReductionClause(CLAUSE_OP[self.stages[n].stmt.reduce], self.ahead_register(n)),)
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
