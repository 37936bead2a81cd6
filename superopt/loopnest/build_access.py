"""Index and value building of the loop-nest builder: plan dims as affine forms of loop variables, buffer
accesses with flattened (and packed) indices and padding checks, and the element type of every value."""

from __future__ import annotations

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
    exact_divmod,
    flat_offset,
)
from superopt.ir.types import is_float
from superopt.lang.parser import infer_dtype
from superopt.loopnest.index import BufferAccess, FlatIndex, InBounds, WrappedTerm
from superopt.loopnest.names import box_buffer
from superopt.loopnest.values import IndexNumber, Literal, Load, Op, Value
from superopt.schedule.kernel_plan import Stage, local_shape


class AccessBuilding:
    """Mixed into the loop-nest builder (``superopt.loopnest.build``): the state it reads is the builder's."""

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
        box = self._in_box.get(tensor)
        if box is not None:  # (inside the loop that packs it: the thread's box, indexed by the loops inside)
            flat = flat_offset([self._rename(s, loc) for loc in box.local], box.shape)
            return BufferAccess(box_buffer(tensor), FlatIndex(flat.simplify()), self.types[tensor].dtype)
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
                q, r = exact_divmod(lin, f, self.extents)
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
