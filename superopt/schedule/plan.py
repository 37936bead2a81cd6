"""Apply a schedule trace to a Compute, giving a KernelPlan: one loop nest per statement (stage).

Illegal traces raise :class:`ScheduleError` with the reason; a legal trace never changes results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, DivMod, Expr, flat_offset, map_expr, substitute_dims
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType, is_float
from superopt.schedule.primitives import (
    Bind,
    CacheRead,
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    InPlace,
    NextRow,
    Pack,
    Parallel,
    Prefetch,
    Primitive,
    Recompute,
    ReduceEpilogue,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.target import Target, host_target

MAX_UNROLL = 64  # a code-size limit, not a hardware one
MAX_LOCAL_BYTES = 1 << 18  # a compute_at buffer lives on the stack (a limit of the stack, not of the target)


class ScheduleError(ValueError):
    """An illegal schedule; the message says which primitive and why."""


@dataclass
class Loop:
    name: str
    extent: int
    reduce: bool
    parallel: bool = False
    vector: bool = False
    unroll: bool = False
    bind: str | None = None  # a GPU grid axis (Bind), e.g. "block_x"


@dataclass
class Stage:
    stmt: Statement
    loops: list[Loop]
    dims: dict[str, Affine]  # dim -> linear expression over loop variables (and div/mod atoms of fused ones)
    tails: list[tuple[Affine, int]] = field(default_factory=list)  # each: lin < limit
    cache_at: str | None = None
    attach: tuple[str, str] | None = None  # (consumer stage, consumer loop)
    bound: dict[str, str] = field(default_factory=dict)  # my out dim -> the consumer dim it is read at
    # my out dim -> a block of it (consumer dim, the block's origin over the consumer's loops above the
    # attach point, its extent): attached at the outer loop of a split, I compute the split's block
    block: dict[str, tuple[str, Affine, int]] = field(default_factory=dict)
    epilogue: str | None = None  # the elementwise stage evaluated at my accumulator's write-back
    epilogue_of: str | None = None  # I am that stage: computed inside this producer's nest, no loops of my own
    cache_reads: list[tuple[str, str]] = field(default_factory=list)  # (input, loop): GPU shared-memory copies
    reduce_epilogues: list[str] = field(default_factory=list)  # reductions folded into my write-back, in order
    reduce_epilogue_of: str | None = None  # I am one: my buffer is combined into at this producer's write-back
    in_place: str | None = None  # attached and stored in this consumer's buffer (InPlace)
    next_row_into: str | None = None  # a row reduction computed a row ahead in this sibling's loop (NextRow)
    next_rows: list[str] = field(default_factory=list)  # the row reductions computed a row ahead in my loop
    # fused loops made linear (:func:`_linearize`): the dims they walk are only meaningful in flat offsets
    linear: list[str] = field(default_factory=list)
    prefetches: list[Prefetch] = field(default_factory=list)  # inputs fetched an iteration ahead (Prefetch)

    @property
    def name(self) -> str:
        return self.stmt.out

    def loop(self, name: str, prim: Primitive) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise ScheduleError(f"{prim}: stage {self.name!r} has no loop {name!r} "
                            f"(loops: {[lp.name for lp in self.loops]})")

    def index_of(self, name: str) -> int:
        return [lp.name for lp in self.loops].index(name)

    @property
    def acc_at(self) -> str | None:
        """Where the accumulator lives: explicit cache_write, else above the innermost reduce suffix."""
        if self.stmt.reduce == "=":
            return None
        if self.cache_at is not None:
            return self.cache_at
        k = len(self.loops)
        while k > 0 and self.loops[k - 1].reduce:
            k -= 1
        return self.loops[k].name if k < len(self.loops) else None

    def tile_loops(self) -> list[Loop]:
        at = self.acc_at
        if at is None:
            return []
        return [lp for lp in self.loops[self.index_of(at):] if not lp.reduce]

    @property
    def partial(self) -> bool:
        """True when some reduction happens outside the accumulator (needs an init pass)."""
        if self.stmt.reduce == "=":
            return False
        at = self.acc_at
        if at is None:
            return True
        return any(lp.reduce for lp in self.loops[: self.index_of(at)])


@dataclass(frozen=True)
class PackLayout:
    """Packed layout of an input: permuted axes, one optionally split (outer part moved first)."""

    perm: tuple[int, ...]
    split_axis: int
    factor: int
    src_shape: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        s = [self.src_shape[p] for p in self.perm]
        if self.split_axis < 0:
            return tuple(s)
        a = self.split_axis
        outer = math.ceil(s[a] / self.factor)
        return (outer, *s[:a], self.factor, *s[a + 1:])

    def map_index(self, index: Sequence) -> list:
        """Original per-axis indices -> packed per-axis (as ('div'|'mod', x, f) for the split axis)."""
        s = [index[p] for p in self.perm]
        if self.split_axis < 0:
            return s
        a = self.split_axis
        return [("div", s[a], self.factor), *s[:a], ("mod", s[a], self.factor), *s[a + 1:]]


@dataclass
class KernelPlan:
    compute: Compute
    stages: dict[str, Stage]
    packs: dict[str, PackLayout]
    types: dict[str, TensorType]
    target: Target

    def consumers_of(self, name: str) -> list[Stage]:
        return [s for s in self.stages.values() if name in s.stmt.inputs()]


def _inline(statements: list[Statement], prim: Inline, outputs: Sequence[str]) -> list[Statement]:
    prod = next((s for s in statements if s.out == prim.stage), None)
    if prod is None:
        raise ScheduleError(f"{prim}: no stage {prim.stage!r}")
    if prod.reduce != "=":
        raise ScheduleError(f"{prim}: only elementwise ('=') stages can be inlined, {prim.stage} is a reduction")
    if prod.out in outputs:
        raise ScheduleError(f"{prim}: {prim.stage} is a kernel output")
    out_dims = prod.out_dims
    result = []
    for s in statements:
        if s is prod:
            continue
        if prod.out in s.inputs():
            if prod.out in s.pad_value:
                raise ScheduleError(f"{prim}: {s.out} reads {prod.out} with padding")
            pads = dict(s.padding)
            for t, v in prod.padding:
                if t in pads and pads[t] != v:
                    raise ScheduleError(f"{prim}: conflicting padding for {t}")
                pads[t] = v

            def sub(e: Expr) -> Expr:
                if isinstance(e, Access) and e.tensor == prod.out:
                    return substitute_dims(prod.expr, dict(zip(out_dims, e.index)))
                return e

            s = Statement(s.out, s.out_dims, s.reduce, map_expr(s.expr, sub), s.extents,
                          tuple(sorted(pads.items())))
        result.append(s)
    return result


def _new_stage(st: Statement) -> Stage:
    red = set(st.reduce_dims)
    loops = [Loop(d, n, d in red) for d, n in st.extents]
    return Stage(st, loops, {d: Affine.var(d) for d, _ in st.extents})


def _substitute(stage: Stage, var: str, repl: Affine, prim: Primitive) -> None:
    try:
        stage.dims = {d: e.substitute({var: repl}) if var in e.vars() else e for d, e in stage.dims.items()}
        stage.tails = [(e.substitute({var: repl}) if var in e.vars() else e, lim) for e, lim in stage.tails]
    except ValueError as err:  # a div/mod atom of ``var`` that ``repl`` cannot be pushed through
        raise ScheduleError(f"{prim}: loop {var!r} is part of a fused loop that this primitive cannot "
                            f"rewrite ({err})") from err


def _fresh(stage: Stage, base: str) -> str:
    names = {lp.name for lp in stage.loops} | set(stage.dims)
    name = base
    k = 2
    while name in names:
        name = f"{base}{k}"
        k += 1
    return name


def _check_fields(p: object) -> None:
    """A primitive whose fields have the declared types (a trace may come from JSON or a fuzzer)."""
    if not isinstance(p, Primitive):
        raise ScheduleError(f"not a schedule primitive: {p!r}")
    for f in fields(p):
        v, ann = getattr(p, f.name), str(f.type)
        if ann == "str":
            ok = isinstance(v, str)
        elif ann == "int":
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif ann.startswith(("tuple[str", "tuple[int")):
            want = str if ann.startswith("tuple[str") else int
            ok = isinstance(v, (tuple, list)) and all(isinstance(x, want) and not isinstance(x, bool) for x in v)
        else:
            ok = True
        if not ok:
            raise ScheduleError(f"{p}: field {f.name!r} must be {ann}, got {v!r}")


def lower(compute: Compute, trace: Sequence[Primitive] = (), target: Target | None = None) -> KernelPlan:
    """Apply ``trace`` to ``compute`` for ``target`` (None: this machine).

    Raises only :class:`ScheduleError` for an illegal trace (unknown stages or loops, ill-typed
    fields, primitives that contradict each other)."""
    target = target or host_target()
    for p in trace:
        _check_fields(p)
    recomputes = [p for p in trace if isinstance(p, Recompute)]
    if recomputes:  # copies of contractions, made before any stage exists (superopt/schedule/chained.py)
        from superopt.schedule.chained import RecomputeError, with_recomputes

        try:
            compute = with_recomputes(compute, recomputes)
        except RecomputeError as e:
            raise ScheduleError(str(e)) from None
        trace = [p for p in trace if not isinstance(p, Recompute)]
    statements = list(compute.statements)
    inlined: set[str] = set()
    for p in trace:
        if isinstance(p, Inline):
            statements = _inline(statements, p, compute.outputs)
            inlined.add(p.stage)
    stages = {s.out: _new_stage(s) for s in statements}
    packs: dict[str, PackLayout] = {}
    for p in trace:
        if isinstance(p, Inline):
            continue
        if isinstance(p, Pack):
            if p.stage not in compute.inputs:
                raise ScheduleError(f"{p}: only kernel inputs can be packed, {p.stage!r} is not one")
            shape = compute.type_of[p.stage].shape
            if sorted(p.perm) != list(range(len(shape))):
                raise ScheduleError(f"{p}: perm {p.perm} is not a permutation of {len(shape)} axes")
            if p.split_axis >= len(shape) or (p.split_axis >= 0 and p.factor < 1):
                raise ScheduleError(f"{p}: bad split axis/factor")
            if any(p.stage in s.stmt.pad_value for s in stages.values()):
                raise ScheduleError(f"{p}: {p.stage} is read with padding and cannot be packed")
            packs[p.stage] = PackLayout(tuple(p.perm), p.split_axis, p.factor, shape)
            continue
        if p.stage in inlined:
            raise ScheduleError(f"{p}: stage {p.stage!r} was inlined")
        stage = stages.get(p.stage)
        if stage is None:
            raise ScheduleError(f"{p}: no stage {p.stage!r} (stages: {list(stages)})")
        _apply(stage, p, stages, compute.type_of)
    plan = KernelPlan(compute, stages, packs, dict(compute.types), target)
    _check(plan)
    return plan


def _flat_offsets(stage: Stage, types: Mapping[str, TensorType]) -> list[Affine]:
    """The element offset, over the stage's loop variables, of every access of the stage's statement."""
    return [flat_offset([ix.substitute(stage.dims) for ix in index], types[tensor].shape).simplify()
            for tensor, index in stage.stmt.indexed()]


def _linearize(stage: Stage, var: str, types: Mapping[str, TensorType]) -> bool:
    """Make fused loop ``var`` (outer * B + inner, the dims it walks indexed ``var / B`` and ``var % B``) a plain
    loop variable, when every access of the stage reads the two dims only as ``B * outer + inner`` in its flat
    offset (a 1x1 conv's y and x over contiguous rows): ``var / B`` becomes 0 and ``var % B`` becomes ``var``,
    which leaves every offset unchanged and lets ``var`` be split by any factor. Such a stage's dims are only
    meaningful in flat offsets: :func:`_check` keeps it away from attachments, epilogues, padding and packs."""
    atoms = {a for e in stage.dims.values() for a, _ in e.terms if isinstance(a, DivMod) and a.var == var}
    if len({a.divisor for a in atoms}) != 1 or any(var in e.vars() for e, _ in stage.tails) or stage.stmt.pad_value:
        return False
    for flat in _flat_offsets(stage, types):
        if any(isinstance(a, DivMod) and a.var == var for a, _ in flat.terms):
            return False
    repl = {a: (Affine.var(var) if a.op == "%" else Affine.of()) for a in atoms}

    def sub(e: Affine) -> Affine:
        out = Affine.of({}, e.const)
        for a, c in e.terms:
            out = out + (repl[a].scale(c) if a in repl else Affine.of({a: c}))
        return out

    stage.dims = {d: sub(e) for d, e in stage.dims.items()}
    stage.linear.append(var)
    return True


def _apply(stage: Stage, p: Primitive, stages: dict[str, Stage], types: Mapping[str, TensorType]) -> None:
    if isinstance(p, Split):
        lp = stage.loop(p.loop, p)
        if p.factor < 1:
            raise ScheduleError(f"{p}: factor must be positive")
        fused_atoms = [a for e in stage.dims.values() for a, _ in e.terms if isinstance(a, DivMod) and a.var == p.loop]
        splits_atoms = any(lp.extent % a.divisor == 0 and p.factor % a.divisor for a in fused_atoms)
        if splits_atoms and not _linearize(stage, p.loop, types):
            raise ScheduleError(f"{p}: splitting fused loop {p.loop!r} needs a factor that is a multiple of "
                                f"{sorted({a.divisor for a in fused_atoms})}")
        k = stage.index_of(p.loop)
        outer, inner = _fresh(stage, f"{p.loop}_o"), _fresh(stage, f"{p.loop}_i")
        n_outer = math.ceil(lp.extent / p.factor)
        stage.loops[k:k + 1] = [Loop(outer, n_outer, lp.reduce), Loop(inner, min(p.factor, lp.extent), lp.reduce)]
        repl = Affine.of({outer: p.factor, inner: 1})
        if lp.extent % p.factor and p.factor < lp.extent:
            stage.tails.append((repl, lp.extent))
        _substitute(stage, p.loop, repl, p)
    elif isinstance(p, Reorder):
        names = [lp.name for lp in stage.loops]
        for n in p.order:
            stage.loop(n, p)
        if len(set(p.order)) != len(p.order):
            raise ScheduleError(f"{p}: a loop repeats")
        slots = sorted(names.index(n) for n in p.order)
        by_name = {lp.name: lp for lp in stage.loops}
        for slot, n in zip(slots, p.order):
            stage.loops[slot] = by_name[n]
    elif isinstance(p, Fuse):
        a, b = stage.loop(p.outer, p), stage.loop(p.inner, p)
        ia, ib = stage.index_of(p.outer), stage.index_of(p.inner)
        if ib != ia + 1:
            raise ScheduleError(f"{p}: loops must be adjacent, outer then inner")
        if a.reduce != b.reduce:
            raise ScheduleError(f"{p}: cannot fuse a reduction loop with a spatial loop")
        if any({p.outer, p.inner} & e.vars() for e, _ in stage.tails):
            raise ScheduleError(f"{p}: a loop with a tail (non-dividing split) cannot be fused")
        name = _fresh(stage, f"{p.outer}_{p.inner}")
        stage.loops[ia:ib + 1] = [Loop(name, a.extent * b.extent, a.reduce)]
        if b.extent == 1:  # no div/mod atoms for a unit loop: they could not be split again
            _substitute(stage, p.outer, Affine.var(name), p)
            _substitute(stage, p.inner, Affine.of({}), p)
        elif a.extent == 1:
            _substitute(stage, p.outer, Affine.of({}), p)
            _substitute(stage, p.inner, Affine.var(name), p)
        else:
            _substitute(stage, p.outer, Affine.var(DivMod("/", name, b.extent)), p)
            _substitute(stage, p.inner, Affine.var(DivMod("%", name, b.extent)), p)
    elif isinstance(p, Vectorize):
        stage.loop(p.loop, p).vector = True
    elif isinstance(p, Parallel):
        lp = stage.loop(p.loop, p)
        if lp.reduce:
            raise ScheduleError(f"{p}: a reduction loop cannot run in parallel")
        lp.parallel = True
    elif isinstance(p, Unroll):
        stage.loop(p.loop, p).unroll = True  # (its extent is checked once attachments have set it)
    elif isinstance(p, CacheWrite):
        if stage.stmt.reduce == "=":
            raise ScheduleError(f"{p}: {stage.name} is not a reduction")
        stage.loop(p.at, p)
        stage.cache_at = p.at
    elif isinstance(p, Epilogue):
        prod = stages.get(p.producer)
        if prod is None or prod is stage:
            raise ScheduleError(f"{p}: no producer stage {p.producer!r}")
        if stage.epilogue_of is not None or prod.epilogue is not None:
            raise ScheduleError(f"{p}: a stage has one epilogue and is the epilogue of one producer")
        stage.epilogue_of, prod.epilogue = prod.name, stage.name
    elif isinstance(p, ReduceEpilogue):
        prod = stages.get(p.producer)
        if prod is None or prod is stage:
            raise ScheduleError(f"{p}: no producer stage {p.producer!r}")
        if stage.reduce_epilogue_of is not None or stage.epilogue_of is not None or stage.reduce_epilogues \
                or stage.epilogue is not None or prod.reduce_epilogue_of is not None or prod.epilogue_of is not None:
            raise ScheduleError(f"{p}: a stage folded into a producer is folded once and has no epilogues of its own")
        stage.reduce_epilogue_of = prod.name
        prod.reduce_epilogues.append(stage.name)
    elif isinstance(p, InPlace):
        if p.consumer not in stages or p.consumer == p.stage:
            raise ScheduleError(f"{p}: no consumer stage {p.consumer!r}")
        stage.in_place = p.consumer
    elif isinstance(p, NextRow):
        if p.into not in stages or p.into == p.stage:
            raise ScheduleError(f"{p}: no stage {p.into!r}")
        if stage.next_row_into is not None:
            raise ScheduleError(f"{p}: {stage.name} is already computed a row ahead in {stage.next_row_into}")
        stage.next_row_into = p.into
        stages[p.into].next_rows.append(stage.name)
    elif isinstance(p, ComputeAt):
        if p.consumer not in stages or p.consumer == p.stage:
            raise ScheduleError(f"{p}: no consumer stage {p.consumer!r}")
        stage.attach = (p.consumer, p.loop)
    elif isinstance(p, Bind):
        stage.loop(p.loop, p).bind = p.axis  # checked with the target's limits in codegen.cuda_legality
    elif isinstance(p, Prefetch):
        stage.loop(p.loop, p)
        stage.loop(p.spread, p)
        if any(q.tensor == p.tensor and q.loop == p.loop for q in stage.prefetches):
            raise ScheduleError(f"{p}: {p.tensor} is already prefetched at loop {p.loop!r}")
        stage.prefetches.append(p)
    elif isinstance(p, CacheRead):
        stage.loop(p.at, p)
        stage.cache_reads.append((p.tensor, p.at))  # a GPU shared-memory copy: codegen.cuda_shared
    else:
        raise ScheduleError(f"unknown primitive {p!r}")


def _check_cache_at(s: Stage) -> None:
    if s.cache_at is not None and s.cache_at not in [lp.name for lp in s.loops]:
        raise ScheduleError(f"CacheWrite({s.name}, {s.cache_at}): the accumulator's loop {s.cache_at!r} no longer "
                            f"exists (split, fused or bound by a ComputeAt after the CacheWrite; loops: "
                            f"{[lp.name for lp in s.loops]})")


def _check(plan: KernelPlan) -> None:
    from superopt.schedule.cuda_legality import check_gpu_plan

    for s in reversed(list(plan.stages.values())):  # readers (later stages) bind first
        if s.attach is not None:
            _check_attach(plan, s)  # (first: a block attachment sets the extent of a loop)
            _check_cache_at(s)
    check_gpu_plan(plan)  # Bind only on a CUDA target, within its limits (nothing to check on a CPU without Bind)
    for s in plan.stages.values():
        _check_cache_at(s)
        names = [lp.name for lp in s.loops]
        for i, lp in enumerate(s.loops):
            if lp.parallel and (i != 0 or s.attach is not None):
                raise ScheduleError(f"Parallel({s.name}, {lp.name}): only the outermost loop of a root stage "
                                    "can run in parallel")
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
    if st.padding or st.out_shape != ps.out_shape:
        raise ScheduleError(f"{prim}: {e.name} must cover exactly the output box of {prod.name}")
    ident = tuple(Affine.dim(d) for d in st.out_dims)
    if any(a.index != ident for a in st.expr.accesses() if a.tensor == prod.name):
        raise ScheduleError(f"{prim}: {e.name} must read {prod.name} only at its own output index")
    order = list(plan.stages)
    for t in st.inputs():
        if t in plan.stages and t != prod.name and order.index(t) > order.index(prod.name):
            raise ScheduleError(f"{prim}: {e.name} reads {t}, which is computed after {prod.name}")


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


def local_shape(stage: Stage) -> tuple[tuple[str, int], ...]:
    """The (dim, extent) axes of a stage's buffer (bound dims of an attached stage dropped, block dims
    the block's extent)."""
    return tuple((d, stage.block[d][2] if d in stage.block else n)
                 for d, n in zip(stage.stmt.out_dims, stage.stmt.out_shape) if d not in stage.bound)


__all__ = ["lower", "KernelPlan", "Stage", "Loop", "ScheduleError", "PackLayout", "local_shape", "Affine"]
