"""The legality checks of a KernelPlan once its trace is applied: every illegal combination raises
:class:`ScheduleError` with the primitive and the reason."""

from __future__ import annotations

import math

from superopt.ir.expr import Affine, DivMod
from superopt.ir.statement import Statement
from superopt.ir.types import is_float
from superopt.schedule.kernel_plan import KernelPlan, ScheduleError, Stage, local_shape
from superopt.schedule.pack_box import check_pack_boxes
from superopt.schedule.primitives import Prefetch

MAX_UNROLL = 64  # a code-size limit, not a hardware one
MAX_LOCAL_BYTES = 1 << 18  # a compute_at buffer lives on the stack (a limit of the stack, not of the target)


def _check_cache_at(s: Stage) -> None:
    if s.cache_at is not None and s.cache_at not in [lp.name for lp in s.loops]:
        raise ScheduleError(f"CacheWrite({s.name}, {s.cache_at}): the accumulator's loop {s.cache_at!r} no longer "
                            f"exists (split, fused or bound by a ComputeAt after the CacheWrite; loops: "
                            f"{[lp.name for lp in s.loops]})")


def check_plan(plan: KernelPlan) -> None:
    from superopt.schedule.cuda_legality import check_gpu_plan

    for s in reversed(list(plan.stages.values())):  # readers (later stages) bind first
        if s.attach is not None:
            _check_attach(plan, s)  # (first: a block attachment sets the extent of a loop)
            _check_cache_at(s)
    check_gpu_plan(plan)  # Bind only on a CUDA target, within its limits (nothing to check on a CPU without Bind)
    check_pack_boxes(plan)
    for s in plan.stages.values():
        _check_cache_at(s)
        names = [lp.name for lp in s.loops]
        for i, lp in enumerate(s.loops):
            if lp.parallel and (s.attach is not None or any(o.parallel or o.unroll or o.vector or o.bind
                                                             for o in s.loops[:i])):
                # (serial loops may enclose it: each of their iterations forks the threads once)
                raise ScheduleError(f"Parallel({s.name}, {lp.name}): only a loop of a root stage with serial loops "
                                    "outside it can run in parallel")
            if lp.unroll and lp.extent > MAX_UNROLL:
                raise ScheduleError(f"Unroll({s.name}, {lp.name}): extent {lp.extent} is too large to unroll "
                                    f"(max {MAX_UNROLL})")
            if lp.unroll and (lp.parallel or lp.vector):
                raise ScheduleError(f"Unroll({s.name}, {lp.name}): a parallel or vectorized loop cannot be unrolled")
            if lp.parallel and lp.vector:
                raise ScheduleError(f"Parallel({s.name}, {lp.name}): the loop is also vectorized")
            if lp.vector and i != len(s.loops) - 1:
                raise ScheduleError(f"Vectorize({s.name}, {lp.name}): the vectorized loop must be innermost "
                                    f"(loops: {names})")
            if lp.vector and lp.reduce and s.tile_loops():
                raise ScheduleError(f"Vectorize({s.name}, {lp.name}): reduction loop inside a multi-element tile")
        if s.stmt.reduce != "=":
            tile = math.prod(lp.extent for lp in s.tile_loops())
            if tile > plan.target.max_tile_elements:
                raise ScheduleError(f"CacheWrite({s.name}): tile of {tile} elements exceeds "
                                    f"{plan.target.max_tile_elements} (8x the target's register file)")
    for s in plan.stages.values():
        for p in s.prefetches:
            _check_prefetch(plan, s, p)
        if s.linear:
            _check_linear(plan, s)
        if s.transpose_block is not None:
            _check_transpose_block(plan, s)
        if s.epilogue_of is not None:
            _check_epilogue(plan, s, plan.stages[s.epilogue_of])
        if s.reduce_epilogue_of is not None:
            _check_reduce_epilogue(plan, s, plan.stages[s.reduce_epilogue_of])
        if s.in_place is not None:
            _check_in_place(plan, s, plan.stages[s.in_place])
        if s.next_row_into is not None:
            _check_next_row(plan, s, plan.stages[s.next_row_into])
    # attachment must be acyclic
    for s in plan.stages.values():
        seen = {s.name}
        cur = s
        while cur.attach is not None:
            cur = plan.stages[cur.attach[0]]
            if cur.name in seen:
                raise ScheduleError(f"ComputeAt: cycle through {cur.name}")
            seen.add(cur.name)


TRANSPOSE_BLOCKS = (8, 16)  # the register transposes the C prelude has (so_transpose8, so_transpose16)


def _check_transpose_block(plan: KernelPlan, s: Stage) -> None:
    """A TransposeBlock's stage is a root float32 copy of a kernel input (unpacked) or of a root stage, neither
    padded nor folded into another stage; its loop and the one inside it are the stage's two innermost, plain (no vector, parallel
    or unrolled loop), both of L iterations (8 or 16, at most the target's float32 lanes); the copy reads
    contiguously along the loop and writes contiguously along the inner one, each at a stride of at least L
    along the other; and a tail of either loop is that loop's own bound (a partial block), not a guard."""
    from superopt.ir.expr import Access, flat_offset

    loop, stream, prefetch = s.transpose_block
    prim = f"TransposeBlock({s.name}, {loop}{', stream=True' if stream else ''}{f', prefetch={prefetch}' if prefetch else ''})"
    names = [lp.name for lp in s.loops]
    st = s.stmt
    why = None
    lanes = plan.target.lanes("float32")
    if plan.target.kind != "cpu":
        why = "register transposes are for CPU targets"
    elif st.reduce != "=" or not isinstance(st.expr, Access) or st.pad_value or st.padding:
        why = f"{s.name} is not a plain copy (a '=' statement of one unpadded access)"
    elif st.expr.tensor in plan.packs or (st.expr.tensor in plan.stages and plan.stages[st.expr.tensor].attach):
        why = f"{st.expr.tensor!r} is packed or computed inside another stage (its buffer is not its shape)"
    elif plan.types[s.name].dtype != "float32" or plan.types[st.expr.tensor].dtype != "float32":
        why = "the copy is not of float32 to float32"
    elif s.attach is not None or s.epilogue_of or s.reduce_epilogue_of or s.in_place or s.next_row_into \
            or s.epilogue or s.reduce_epilogues or s.next_rows or s.linear:
        why = f"{s.name} is computed inside another stage, or another inside it"
    elif len(names) < 2 or names[-2] != loop:
        why = f"loop {loop!r} is not the second innermost (loops: {names})"
    if why:
        raise ScheduleError(f"{prim}: {why}")
    outer, inner = s.loops[-2], s.loops[-1]
    if outer.extent not in TRANSPOSE_BLOCKS or outer.extent > lanes or inner.extent != outer.extent:
        why = (f"loops {loop!r} and {inner.name!r} walk {outer.extent} x {inner.extent}, not a block of "
               f"{' or '.join(str(b) for b in TRANSPOSE_BLOCKS if b <= lanes)} x the same")
    elif any(lp.vector or lp.parallel or lp.unroll or lp.bind for lp in (outer, inner)):
        why = "the block's loops must be plain (not vectorized, parallel or unrolled)"
    if why:
        raise ScheduleError(f"{prim}: {why}")
    src, dst = (flat_offset([ix.substitute(s.dims) for ix in index], plan.types[t].shape).simplify()
                for t, index in st.indexed())
    o, i = outer.name, inner.name
    if src.map.get(o) != 1 or dst.map.get(i) != 1:
        why = f"the copy does not read contiguously along {o!r} and write contiguously along {i!r}"
    elif abs(src.map.get(i, 0)) < outer.extent or abs(dst.map.get(o, 0)) < outer.extent:
        why = f"the copy's stride along the other loop is under {outer.extent} (the block's rows would overlap)"
    for lin, _ in s.tails:
        if why is None and (lin.vars() & {o, i}) and not (len(lin.vars() & {o, i}) == 1 and lin.map.get(o, lin.map.get(i)) == 1):
            why = f"a tail ({lin}) is not the bound of one of the block's loops (it would be a guard)"
    if why is None and prefetch:
        if prefetch not in names[:-2]:
            why = f"loop {prefetch!r} is not a loop around the block (loops: {names})"
        elif not isinstance(src.map.get(prefetch), int) or not src.map.get(prefetch) \
                or any(not isinstance(a, str) and getattr(a, "var", None) == prefetch for a in src.map):
            why = f"the next block's source along loop {prefetch!r} is not at a constant stride"
    if why:
        raise ScheduleError(f"{prim}: {why}")


def _check_prefetch(plan: KernelPlan, s: Stage, p: Prefetch) -> None:
    """``p`` fetches a kernel input the stage reads, on a CPU, from a loop that is neither vectorized nor
    unrolled (serial or parallel), spread over a loop inside it that is not inside the accumulator's loop
    (which would issue the fetches once per reduction step)."""
    names = [lp.name for lp in s.loops]
    why = None
    if plan.target.kind != "cpu":
        why = "prefetches are for CPU targets"
    elif p.tensor not in plan.compute.inputs or p.tensor not in s.stmt.inputs():
        why = f"{p.tensor!r} is not a kernel input that {s.name} reads"
    elif p.loop not in names or p.spread not in names:
        why = f"loop {p.loop!r} or {p.spread!r} no longer exists (loops: {names})"
    elif names.index(p.spread) <= names.index(p.loop):
        why = f"loop {p.spread!r} is not inside loop {p.loop!r}"
    elif s.acc_at is not None and names.index(p.spread) > names.index(s.acc_at):
        why = f"loop {p.spread!r} is inside the accumulator's loop {s.acc_at!r}"
    elif any(s.loops[names.index(n)].vector or s.loops[names.index(n)].unroll for n in (p.loop, p.spread)):
        why = "the loops must not be vectorized or unrolled"
    if why:
        raise ScheduleError(f"{p}: {why}")


def _check_linear(plan: KernelPlan, s: Stage) -> None:
    """A stage with a linearized fused loop (its dims meaningful only in flat offsets) stands alone."""
    why = None
    if s.attach or s.epilogue or s.epilogue_of or s.reduce_epilogues or s.reduce_epilogue_of or s.in_place \
            or s.next_row_into or s.next_rows or s.cache_reads:
        why = "it is attached, fused with another stage or stages a copy"
    elif any(o.attach is not None and o.attach[0] == s.name for o in plan.stages.values()):
        why = "another stage is computed at one of its loops"
    elif {s.name, *s.stmt.inputs()} & set(plan.packs):
        why = "it reads or writes a packed layout"
    if why:
        raise ScheduleError(f"Split of fused loop(s) {s.linear} of {s.name!r} by a factor that is not a multiple of "
                            f"the inner loop's extent: the loop is made linear, which needs a stage on its own ({why})")


def _check_epilogue(plan: KernelPlan, e: Stage, prod: Stage) -> None:
    prim = f"Epilogue({e.name}, {prod.name})"
    st, ps = e.stmt, prod.stmt
    if st.reduce != "=":
        raise ScheduleError(f"{prim}: {e.name} is a reduction, not an elementwise stage")
    if prod.acc_at is None:
        raise ScheduleError(f"{prim}: {prod.name} needs a CacheWrite")
    if prod.partial:  # reduction blocks outside the accumulator: the epilogue runs at the last one
        if plan.target.kind != "cpu" or prod.reduce_epilogues:
            raise ScheduleError(f"{prim}: {prod.name} needs a CacheWrite holding its whole reduction "
                                "(reduction blocks outside it are combined before an epilogue on CPU targets "
                                "only, and not with a folded reduction)")
        if plan.types[e.name].dtype != plan.types[prod.name].dtype:
            raise ScheduleError(f"{prim}: {prod.name}'s reduction blocks are combined in {e.name}'s buffer, "
                                f"whose type {plan.types[e.name].dtype} is not {plan.types[prod.name].dtype}")
    if prod.attach is not None or e.attach is not None or any(x.attach and x.attach[0] == e.name
                                                             for x in plan.stages.values()):
        raise ScheduleError(f"{prim}: both stages must be root stages and nothing may be computed at {e.name}")
    ident = tuple(Affine.dim(d) for d in st.out_dims)
    if st.padding or (st.out_shape != ps.out_shape and epilogue_dims(st, ps) is None):
        raise ScheduleError(f"{prim}: {e.name} must cover exactly the output box of {prod.name}, or a permutation "
                            f"of it that it reads {prod.name} at")
    if any(a.index != ident for a in st.expr.accesses() if a.tensor == prod.name):
        if epilogue_dims(st, ps) is None:
            raise ScheduleError(f"{prim}: {e.name} must read {prod.name} only at its own output index, or at one "
                                f"permutation of its output dims")
        if plan.target.kind != "cpu":
            raise ScheduleError(f"{prim}: {e.name} reads {prod.name} at a permutation of its index (a transposed "
                                "write-back): CPU targets only")
    order = list(plan.stages)
    for t in st.inputs():
        if t in plan.stages and t != prod.name and order.index(t) > order.index(prod.name):
            raise ScheduleError(f"{prim}: {e.name} reads {t}, which is computed after {prod.name}")


def epilogue_dims(st: Statement, ps: Statement) -> dict[str, str] | None:
    """The map from elementwise ``st``'s output dims onto producer ``ps``'s, where ``st`` reads ``ps.out`` at one
    index that is a permutation of its own output dims of the same extents (a channel shuffle after a grouped
    conv: ``O[n, c, g, p] = f(P[n, g, c, p])``) that keeps the innermost dim innermost, else None. Its epilogue
    then writes ``O`` at the permuted index from the producer's register tile, whole vectors along the innermost
    dim: the producer's result never reaches memory."""
    dims = reduce_epilogue_dims(st, ps)
    if dims is None or set(dims) != set(st.out_dims) or len(st.out_dims) != len(ps.out_dims):
        return None
    if dims[st.out_dims[-1]] != ps.out_dims[-1]:
        return None  # (the innermost dim moved: every vector of the tile would be stored lane by lane)
    return dims


def reduce_epilogue_dims(st: Statement, ps: Statement) -> dict[str, str] | None:
    """The map from statement ``st``'s dims to producer statement ``ps``'s output dims, given by the one
    index at which ``st`` reads ``ps.out`` (None when it reads it at several, or not by a permutation of
    ``st``'s dims of the same extents): what makes ``st`` foldable by :class:`ReduceEpilogue`."""
    idx = {a.index for a in st.expr.accesses() if a.tensor == ps.out}
    if len(idx) != 1:
        return None
    (index,) = idx
    if len(index) != len(ps.out_dims) or not all(ix.is_plain_dim for ix in index):
        return None
    mine = [ix.dims[0] for ix in index]
    # every dim of ``st`` but those of extent 1 (a kept reduced axis: softmax's Z[i, u] += E[i, r]) is read at
    if len(set(mine)) != len(mine) or not set(mine) <= set(st.extent) \
            or any(n > 1 and d not in mine for d, n in st.extents):
        return None
    if any(st.extent[d] != n for d, n in zip(mine, ps.out_shape)):
        return None
    return dict(zip(mine, ps.out_dims))


def _check_reduce_epilogue(plan: KernelPlan, e: Stage, prod: Stage) -> None:
    prim = f"ReduceEpilogue({e.name}, {prod.name})"
    st = e.stmt
    if st.reduce == "=":
        raise ScheduleError(f"{prim}: {e.name} is elementwise, not a reduction (use Epilogue)")
    if st.padding:
        raise ScheduleError(f"{prim}: {e.name} reads with padding")
    dims = reduce_epilogue_dims(st, prod.stmt)
    if dims is None:
        raise ScheduleError(f"{prim}: {e.name} must read {prod.name} at one index, a permutation of "
                            f"{prod.name}'s output dims covering all of {e.name}'s dims")
    order = list(plan.stages)
    for t in st.inputs():
        if t in plan.stages and t != prod.name and order.index(t) > order.index(prod.name):
            raise ScheduleError(f"{prim}: {e.name} reads {t}, which is computed after {prod.name}")
    if prod.stmt.reduce == "=":
        _check_fold_into_elementwise(plan, e, prod, prim, dims)
        return
    if prod.acc_at is None or prod.partial:
        raise ScheduleError(f"{prim}: {prod.name} needs a CacheWrite holding its whole reduction")
    if prod.attach is not None or e.attach is not None or any(x.attach and x.attach[0] == e.name
                                                             for x in plan.stages.values()):
        raise ScheduleError(f"{prim}: both stages must be root stages and nothing may be computed at {e.name}")
    reduced = {dims[d] for d in st.reduce_dims if d in dims}  # producer dims the folded stage sums over
    for lp in prod.loops:
        if lp.parallel or lp.bind:
            walked = {d for d, lin in prod.dims.items() if lp.name in lin.vars()}
            if walked & reduced:
                raise ScheduleError(f"{prim}: {prod.name}'s parallel loop {lp.name!r} walks {sorted(walked & reduced)}, "
                                    f"which {e.name} reduces over (threads would update one element)")


def _check_fold_into_elementwise(plan: KernelPlan, e: Stage, prod: Stage, prim: str, dims: dict[str, str]) -> None:
    """A sum folded into an elementwise stage computed inside the same consumer loop (softmax's
    ``Z[i] += E[i, r]`` summed as each ``E[i, r]`` is computed): its operand is summed where it is
    produced instead of in a second pass over it. Both stages see one row at a time, so the sum is one
    register per row."""
    st = e.stmt
    if plan.target.kind != "cpu":
        raise ScheduleError(f"{prim}: a reduction folds into an elementwise stage on CPU targets only")
    if st.reduce != "+=":
        raise ScheduleError(f"{prim}: only a sum ('+=', not {st.reduce!r}) folds into an elementwise stage")
    if prod.attach is None or e.attach != prod.attach:
        raise ScheduleError(f"{prim}: {e.name} and the elementwise {prod.name} must be computed at the same "
                            "consumer loop")
    if prod.block or e.block or prod.epilogue is not None or prod.epilogue_of is not None:
        raise ScheduleError(f"{prim}: {prod.name} must compute whole rows (no blocks of rows, no epilogue)")
    if any(x.attach and x.attach[0] in (e.name, prod.name) for x in plan.stages.values()):
        raise ScheduleError(f"{prim}: nothing may be computed at {e.name} or {prod.name}")
    ext = prod.stmt.extent
    walked = {d for d in prod.stmt.out_dims if d not in prod.bound and ext[d] > 1}
    reduced = {dims[d] for d in st.reduce_dims if d in dims and ext[dims[d]] > 1}
    if walked != reduced:
        raise ScheduleError(f"{prim}: {e.name} must sum over exactly the dims {prod.name}'s own loops walk "
                            f"({sorted(walked)}), not {sorted(reduced)}")
    if any(d in dims and ext[dims[d]] > 1 and dims[d] not in prod.bound for d in st.out_dims):
        raise ScheduleError(f"{prim}: {e.name}'s output dims must be fixed by the consumer loop")
    if any(lp.parallel or lp.bind for lp in prod.loops):
        raise ScheduleError(f"{prim}: {prod.name} may not run a parallel loop")


def _moved_rows(plan: KernelPlan, m: Stage) -> list[str]:
    """The consumer dims bound to attached ``m``'s output that the attach loop moves."""
    cname, loop = m.attach
    c = plan.stages[cname]
    return [cd for cd in m.bound.values() if loop in c.dims[cd].vars()]


def next_row_shift(plan: KernelPlan, m: Stage) -> tuple[str, int]:
    """(the consumer dim that walks the rows, how far one iteration of the row loop moves it) for a
    stage computed a row ahead: the one dim of the consumer bound to ``m``'s output that the attach
    loop moves (:func:`_check_next_row` made sure there is exactly one)."""
    (row,) = _moved_rows(plan, m)
    return row, plan.stages[m.attach[0]].dims[row].coeff(m.attach[1])


def _check_next_row(plan: KernelPlan, m: Stage, e: Stage) -> None:
    """``m`` (a row reduction of kernel inputs) may be computed one row ahead in ``e``'s loop (an
    elementwise stage, or a reduction with a plain accumulator) when both are computed at the same
    serial loop of their consumer, ``e`` walks exactly the dim ``m`` reduces over, and the attach loop
    moves exactly one of the consumer's dims that ``m``'s output is bound to."""
    prim = f"NextRow({m.name}, {e.name})"
    st = m.stmt
    if plan.target.kind != "cpu":
        raise ScheduleError(f"{prim}: rows computed ahead on CPU targets only")
    if st.reduce == "=" or not is_float(plan.types[m.name].dtype):
        raise ScheduleError(f"{prim}: {m.name} must be a float reduction")
    if st.padding or any(a.tensor not in plan.compute.inputs for a in st.expr.accesses()):
        raise ScheduleError(f"{prim}: {m.name} must read kernel inputs only, without padding")
    if m.attach is None or e.attach != m.attach:
        raise ScheduleError(f"{prim}: {e.name} must be computed at {m.name}'s consumer loop")
    if e.stmt.reduce != "=" and (e.cache_at is not None or e.next_row_into is not None or e.reduce_epilogue_of):
        raise ScheduleError(f"{prim}: a reduction {e.name} must keep its plain accumulator")
    if m.block or e.block or m.in_place or m.reduce_epilogue_of or m.reduce_epilogues or m.epilogue \
            or e.epilogue_of is not None or m.cache_at is not None:
        raise ScheduleError(f"{prim}: {m.name} and {e.name} must compute whole rows, unfolded")
    if any(x.attach and x.attach[0] in (m.name, e.name) for x in plan.stages.values()):
        raise ScheduleError(f"{prim}: nothing may be computed at {m.name} or {e.name}")
    c = plan.stages[m.attach[0]]
    lp = c.loops[c.index_of(m.attach[1])]
    if lp.parallel or lp.vector or lp.bind:
        raise ScheduleError(f"{prim}: the row loop {lp.name!r} must be serial (its rows run in order)")
    ext = st.extent
    if any(ext[d] > 1 and d not in m.bound for d in st.out_dims):
        raise ScheduleError(f"{prim}: {m.name}'s output must be fixed by the consumer loop")
    moved = _moved_rows(plan, m)
    if len(moved) != 1 or any(isinstance(a, DivMod) for a in c.dims[moved[0]].dims) \
            or not c.dims[moved[0]].coeff(m.attach[1]):
        raise ScheduleError(f"{prim}: the loop {lp.name!r} must move exactly one row dim of {m.name}")
    walked = [d for d, n in e.stmt.extents if d not in e.bound and n > 1]  # an output or a reduction dim
    reduced = [d for d in st.reduce_dims if ext[d] > 1]
    if len(walked) != 1 or len(reduced) != 1 or ext[reduced[0]] != e.stmt.extent[walked[0]] \
            or [lp.name for lp in e.loops if lp.extent > 1] != walked:
        raise ScheduleError(f"{prim}: {e.name}'s loop must walk exactly the dim {m.name} reduces over")
    if not all(cd in e.bound.values() for cd in m.bound.values()):
        raise ScheduleError(f"{prim}: {e.name} must be computed at {m.name}'s rows")


def _check_in_place(plan: KernelPlan, s: Stage, c: Stage) -> None:
    """``s`` may live in consumer ``c``'s buffer when ``c`` reads it once per element, at ``c``'s own
    index, and every other reader is done with a row before ``c``'s pass over it overwrites it."""
    prim = f"InPlace({s.name}, {c.name})"
    st, ct = s.stmt, c.stmt
    if plan.target.kind != "cpu":
        raise ScheduleError(f"{prim}: in-place rows on CPU targets only")
    if st.reduce != "=" or s.attach is None or s.attach[0] != c.name:
        raise ScheduleError(f"{prim}: {s.name} must be an elementwise stage computed at {c.name}")
    if s.block or c.attach is not None or c.epilogue_of is not None or c.reduce_epilogue_of is not None:
        raise ScheduleError(f"{prim}: {s.name} must compute whole rows of the root stage {c.name}")
    if st.out_shape != ct.out_shape or plan.types[s.name].dtype != plan.types[c.name].dtype:
        raise ScheduleError(f"{prim}: {s.name} and {c.name} must have one shape and element type")
    own = tuple(Affine.dim(d) for d in ct.out_dims)
    if ct.reduce != "=" or {a.index for a in ct.expr.accesses() if a.tensor == s.name} != {own} \
            or ct.padding:
        raise ScheduleError(f"{prim}: {c.name} must be elementwise and read {s.name} only at its own index")
    if any(s.bound.get(d) not in (None, cd) for d, cd in zip(st.out_dims, ct.out_dims)):
        raise ScheduleError(f"{prim}: {s.name}'s rows are not {c.name}'s rows")
    if c.acc_at is not None or c.epilogue is not None or c.reduce_epilogues:
        raise ScheduleError(f"{prim}: {c.name} has no accumulator, epilogue or folded reduction")
    # (any other reader is computed at the same loop, before the consumer's pass: ComputeAt's check)


def _check_attach(plan: KernelPlan, s: Stage) -> None:
    cname, loop = s.attach
    prim = f"ComputeAt({s.name}, {cname}, {loop})"
    if s.name in plan.compute.outputs:
        raise ScheduleError(f"{prim}: {s.name} is a kernel output and needs its full buffer")
    c = plan.stages.get(cname)
    if c is None:
        raise ScheduleError(f"{prim}: no consumer stage {cname!r}")
    siblings = {r.name for r in plan.stages.values() if r.attach == s.attach and r is not s}
    readers = [r for r in plan.consumers_of(s.name)]
    names = [lp.name for lp in c.loops]
    if loop not in names:
        raise ScheduleError(f"{prim}: {cname} has no loop {loop!r}")
    # the consumer's epilogue runs at its tile's write-back: inside the attach loop when the tile's
    # accumulator loop is (then the epilogue may read what is computed there, as attention's 1/Z)
    in_tile = c.acc_at in names and names.index(c.acc_at) > names.index(loop)
    if not readers or any(r.name != cname and r.name not in siblings and not (r.epilogue_of == cname and in_tile)
                          for r in readers):
        raise ScheduleError(f"{prim}: {s.name} is read by {[r.name for r in readers]}; only {cname}, its "
                            f"epilogue and stages computed at the same loop may read it")
    outer = c.loops[: names.index(loop) + 1]
    outer_names = {lp.name for lp in outer}
    # consumer dims the loops down to the attach point fix entirely (plain loops, or fused ones: b0_b1)
    plain = {d for d, lin in c.dims.items() if lin.vars() and lin.vars() <= outer_names}
    blocks = _consumer_blocks(c, outer_names)
    bound: dict[str, str] = {}  # my out dim -> the consumer dim it is read at
    block: dict[str, tuple[str, Affine, int]] = {}
    first = True
    for r in readers:
        if s.name in r.stmt.pad_value:
            raise ScheduleError(f"{prim}: {r.name} reads {s.name} with padding")
        for a in r.stmt.expr.accesses():
            if a.tensor != s.name:
                continue
            this: dict[str, str] = {}
            this_block: dict[str, tuple[str, Affine, int]] = {}
            at_c = r is c or r.epilogue_of == cname  # an epilogue walks the consumer's dims
            for d, ix in zip(s.stmt.out_dims, a.index):
                if not ix.is_plain_dim:
                    continue
                rd = ix.dims[0]
                if at_c and rd in plain:
                    this[d] = rd
                elif at_c and rd in blocks:
                    this_block[d] = (rd, *blocks[rd])
                elif not at_c and rd in r.bound:
                    this[d] = r.bound[rd]
                elif not at_c and rd in r.block:
                    this_block[d] = r.block[rd]
            if not first and (this, this_block) != (bound, block):
                raise ScheduleError(f"{prim}: {s.name} is read at different points of the bound loops")
            bound, block, first = this, this_block, False
    for lp in outer:
        if any(lp.name in lin.vars() and d not in plain and d not in blocks for d, lin in c.dims.items()):
            raise ScheduleError(f"{prim}: consumer loop {lp.name!r} above the attach point is split or fused "
                                f"with a loop inside it")
    s.bound, s.block = bound, block
    # bound dims: drop their loops (they must not have been split); block dims: their loops walk the block
    for d in bound:
        if s.dims.get(d) != Affine.var(d) or d not in [lp.name for lp in s.loops]:
            raise ScheduleError(f"{prim}: loop {d!r} of {s.name} is bound by the consumer and must stay whole")
    s.loops = [lp for lp in s.loops if lp.name not in bound]
    for d, (_, _, n) in block.items():
        _restrict_to_block(s, d, n, prim)
    size = math.prod(n for _, n in local_shape(s))
    if size * plan.types[s.name].np_dtype.itemsize > MAX_LOCAL_BYTES:
        raise ScheduleError(f"{prim}: local buffer of {size} elements is too large")
    for lp in s.loops:
        if lp.parallel:
            raise ScheduleError(f"{prim}: an attached stage cannot have a parallel loop")


def _restrict_to_block(s: Stage, d: str, n: int, prim: str) -> None:
    """Stage ``s``'s loops over dim ``d`` (the dim itself, or the loops a chain of splits made of it) walk
    ``n`` values only: the outermost one's extent shrinks to the block, a tail bounds an uneven last step,
    and the tails the block makes redundant are dropped."""
    lin = s.dims.get(d)
    loops = {lp.name: lp for lp in s.loops}
    if lin is None or lin.const or any(not isinstance(a, str) or a not in loops or k < 1 for a, k in lin.terms):
        raise ScheduleError(f"{prim}: dim {d!r} of {s.name} is computed by a block of the consumer's loop; its own "
                            f"loops over it may be split but not fused")
    top, k = max(lin.terms, key=lambda t: t[1])
    loops[top].extent = min(loops[top].extent, math.ceil(n / k))
    extents = {a: lp.extent for a, lp in loops.items()}
    s.tails = [(e, limit) for e, limit in s.tails if not e.vars() <= extents.keys() or e.bounds(extents)[1] >= limit]
    if lin.bounds(extents)[1] >= n and (lin, n) not in s.tails:
        s.tails.append((lin, n))


def _consumer_blocks(c: Stage, outer_names: set[str]) -> dict[str, tuple[Affine, int]]:
    """Consumer dims that the loops down to an attach point fix up to a block: ``origin + inner`` with
    ``origin`` over those loops (not constant) and ``inner`` a non-negative combination of whole loops
    inside the attach point (``i = 8*i_o + i_i`` attached at ``i_o``: origin ``8*i_o``, a block of 8)."""
    extents = {lp.name: lp.extent for lp in c.loops}
    out: dict[str, tuple[Affine, int]] = {}
    for d, lin in c.dims.items():
        origin = Affine.of({a: k for a, k in lin.terms if (a if isinstance(a, str) else a.var) in outer_names},
                           lin.const)
        inner = [(a, k) for a, k in lin.terms if (a if isinstance(a, str) else a.var) not in outer_names]
        if not origin.vars() or not inner or any(not isinstance(a, str) or a not in extents or k < 0
                                                 for a, k in inner):
            continue
        local = Affine.of(dict(inner))
        # (a tail of the split that made the inner loops caps the block: 5 rows split by 4 walk 5, not 8)
        out[d] = (origin, min([local.bounds(extents)[1] + 1] + [n for e, n in c.tails if e == local]))
    return out
