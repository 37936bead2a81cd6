"""Register tiles and their write-back for the loop-nest builder: the accumulator tile, first-visit stores of
partial reductions, which producers are stored, and the epilogues applied on the way out."""

from __future__ import annotations

from dataclasses import replace

from superopt.ir.expr import Affine, substitute_dims
from superopt.loopnest.index import BufferAccess, GuardCond, RegisterRef
from superopt.loopnest.statements import Accumulate, Assign, Epilogue, Guard, Node, WriteBack
from superopt.loopnest.values import Load, Value
from superopt.schedule.kernel_plan import Stage
from superopt.schedule.plan_check import epilogue_dims


class WriteBacks:
    """Mixed into the loop-nest builder (``superopt.loopnest.build``): the state it reads is the builder's."""

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
        return [self._guarded(guard + [GuardCond(first, 1, True)], WriteBack(buf, acc, None, dtype)),
                self._guarded(guard + [GuardCond(first.scale(-1), 0, True)],
                              WriteBack(buf, acc, s.stmt.reduce, dtype))]

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
        is_last = guard + [GuardCond(first.scale(-1), 1 - last, True)]  # -sum < 1 - last: sum == last
        out: list[Node] = []
        if last > 0:
            out.extend(self.block_write_backs(s, buf, acc, first, guard + [GuardCond(first, last, True)]))
            out.append(self._guarded(is_last, Accumulate(acc, st.reduce, Load(buf), dtype)))
        if stored:
            out.append(self._guarded(is_last, WriteBack(buf, acc, None, dtype)))
        out.append(self.epilogue(s, e, Load(acc), is_last))
        return out

    @staticmethod
    def by_block(wb: list[Node]) -> list[list[Node]]:
        """A partial reduction's write-back statements grouped by the block they run in (their block tests,
        ``GuardCond.block``), each group in its order, the groups in the order they first appear: one loop nest
        of the tile's loops each, which the printers run under the group's tests (a branch per tile), so that
        neither a split of the loop of the blocks (the whole reduction copied once per kind of block) nor a
        branch per element and kind is needed. The kinds (first, middle, last) exclude each other, so the nests
        may run one after another. One group where a statement is under no block test."""
        groups: dict[tuple[GuardCond, ...], list[Node]] = {}
        for n in wb:
            g = n.body if isinstance(n, Epilogue) else n
            key = tuple(c for c in g.conds if c.block) if isinstance(g, Guard) else ()
            if not key:
                return [wb]
            groups.setdefault(key, []).append(n)
        return list(groups.values())

    @staticmethod
    def unblocked(wb: list[Node]) -> list[Node]:
        """A scalar accumulator's write-back statements with their block tests made plain tests: with no tile
        loops to run under one test, a test would run at every element's write-back, so the loop of the blocks
        is split on them instead (``index_sets``: one copy of a scalar reduction per kind of block)."""
        def plain(n: Node) -> Node:
            if isinstance(n, Epilogue):
                return replace(n, body=plain(n.body))
            if isinstance(n, Guard):
                return replace(n, conds=tuple(replace(c, block=False) for c in n.conds))
            return n

        return [plain(n) for n in wb]

    def stored(self, s: Stage) -> bool:
        """False for a producer whose only reader is its epilogue: it lives in registers only."""
        if (s.epilogue is None and not s.reduce_epilogues) or s.name in self.plan.compute.outputs:
            return True
        folded = {s.epilogue, *s.reduce_epilogues}
        return any(s.name in x.stmt.inputs() for x in self.stages.values() if x.name not in folded)

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
        ren = dict(zip(e.stmt.out_dims, here))
        ident = tuple(Affine.dim(d) for d in e.stmt.out_dims)
        if any(a.index != ident for a in e.stmt.expr.accesses() if a.tensor == s.name):
            # (read at a permutation of its index: written back transposed, the producer's dims renamed)
            dims = epilogue_dims(e.stmt, s.stmt)
            assert dims is not None, f"{e.name} as {s.name}'s epilogue without a legality check"
            ren = {d: Affine.dim(p) for d, p in dims.items()}
        expr = substitute_dims(e.stmt.expr, ren)
        self._acc_override[s.name] = acc
        try:
            val = self.value(s, expr, self.types[e.name].dtype)
        finally:
            del self._acc_override[s.name]
        store = Assign(self.access(s, e.name, tuple(ren[d] for d in e.stmt.out_dims)), val)
        return Epilogue(e.name, str(e.stmt), Guard(tuple(guard), store) if guard else store)
