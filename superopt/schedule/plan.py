"""Apply a schedule trace to a Compute, giving a KernelPlan: one loop nest per statement (stage).

Illegal traces raise :class:`ScheduleError` with the reason; a legal trace never changes results. The plan's
types live in ``kernel_plan``, the checks run on the applied trace in ``plan_check``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields

from superopt.ir.compute import Compute
from superopt.ir.expr import Access, Affine, DivMod, Expr, flat_offset, map_expr, substitute_dims
from superopt.ir.statement import Statement
from superopt.ir.types import TensorType
from superopt.schedule.kernel_plan import KernelPlan, Loop, PackLayout, ScheduleError, Stage
from superopt.schedule.plan_check import check_plan
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
    OutputLayout,
    Pack,
    PackAt,
    Parallel,
    Prefetch,
    Primitive,
    Recompute,
    ReduceEpilogue,
    Reorder,
    Split,
    TransposeBlock,
    Unroll,
    Vectorize,
)
from superopt.target import Target, host_target


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
        elif ann == "bool":
            ok = isinstance(v, bool)
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
    layouts = [p for p in trace if isinstance(p, OutputLayout)]
    if layouts:  # outputs computed into re-laid temporaries, then copied (superopt/schedule/output_layout.py)
        from superopt.schedule.output_layout import OutputLayoutError, with_output_layouts

        try:
            compute = with_output_layouts(compute, layouts)
        except OutputLayoutError as e:
            raise ScheduleError(str(e)) from None
        trace = [p for p in trace if not isinstance(p, OutputLayout)]
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
    check_plan(plan)
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
    meaningful in flat offsets: :func:`check_plan` keeps it away from attachments, epilogues, padding and packs."""
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
    elif isinstance(p, TransposeBlock):
        stage.loop(p.loop, p)
        if p.prefetch:
            stage.loop(p.prefetch, p)
        if stage.transpose_block is not None:
            raise ScheduleError(f"{p}: {stage.name} already copies a transposed block at {stage.transpose_block[0]!r}")
        stage.transpose_block = (p.loop, p.stream, p.prefetch)  # (checked once the trace is applied: plan_check)
    elif isinstance(p, PackAt):
        stage.loop(p.at, p)
        if p.tensor in stage.pack_at:
            raise ScheduleError(f"{p}: {p.tensor} is already packed in loop {stage.pack_at[p.tensor]!r}")
        stage.pack_at[p.tensor] = p.at  # (the box is checked once the trace is applied: schedule.pack_box)
    elif isinstance(p, CacheRead):
        stage.loop(p.at, p)
        stage.cache_reads.append((p.tensor, p.at))  # a GPU shared-memory copy: codegen.cuda_shared
    else:
        raise ScheduleError(f"unknown primitive {p!r}")
