"""The default schedule heuristic: adequate code in seconds, with no search and no measurement.

Contractions get register tiles (rows x a vector of columns) with the weight-like operand packed
so the vector loop reads it contiguously; multi-statement row-wise ops (softmax, layernorm) are
computed one row at a time inside the final stage's outer loop; everything else is parallelized
on outer loops and vectorized on the innermost contiguous one. Candidate traces are tried from the
most aggressive down; the first that lowers legally wins.

This module names the sketches and assembles them; the schedules of each family live in
``contraction`` (register tiles, packs), ``rowwise`` (rows, folded reductions), ``elementwise``
(parallel and vector loops, transposes, inlining), ``rows_contraction``, ``tile_transform`` and
``blocked_conv``.
"""

from __future__ import annotations

from superopt.ir.compute import Compute
from superopt.ir.expr import product_accesses
from superopt.schedule.chained import chained_reductions, flops_per_byte, recompute_records, with_recomputes
from superopt.schedule.contraction import contraction_schedule, final_contraction, is_contraction
from superopt.schedule.elementwise import inlinable, simple_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.output_layout import choose_output_layout, with_output_layouts
from superopt.schedule.panel_packing import with_panel_packing
from superopt.schedule.primitives import (
    Epilogue,
    Inline,
    InPlace,
    NextRow,
    OutputLayout,
    Primitive,
    ReduceEpilogue,
)
from superopt.schedule.rows_contraction import rows_into_contraction
from superopt.schedule.rowwise import foldable_reductions, rowwise_schedule
from superopt.schedule.tile_transform import TILE_TRANSFORM, applies, tile_transform_schedule
from superopt.target import Target, host_target


def default_schedule(compute: Compute, target: Target | None = None, constant_inputs: frozenset[str] | None = None
                     ) -> list[Primitive]:
    """The first legal of the sketches, most aggressive first, each with the heuristic's knob values.

    ``constant_inputs``: the inputs known ahead of time (weights), packed once for free; a run-time
    input is only packed when the kernel would otherwise read it with a stride. None: all inputs.
    """
    from superopt.schedule.plan import ScheduleError, lower

    target = target or host_target()
    consts = frozenset(compute.inputs) if constant_inputs is None else constant_inputs
    for sketch in sketch_names(compute, target):
        try:
            trace = build_sketch(compute, target, consts, sketch)
            lower(compute, trace, target)
            return trace
        except (ScheduleError, ValueError, KeyError, StopIteration):
            continue
    return []


ROWWISE, STAGES_EPILOGUE, STAGES, STAGES_SIMPLE, NAIVE = "rowwise", "stages+epilogue", "stages", "stages-simple", "naive"
FOLD_REDUCTIONS = "stages+fold"  # stages+epilogue, with reductions of a contraction's result folded into its write-back
ROWS_INTO_CONTRACTION = "rows+contraction"  # attention: every temporary computed per row inside the final contraction


def sketch_names(compute: Compute, target: Target) -> list[str]:
    """The sketches (structures) that apply to ``compute``, most aggressive first."""
    if target.kind == "cuda":
        from superopt.schedule.gpu_default import gpu_sketch_names

        return gpu_sketch_names(compute, target)
    stmts = list(compute.statements)
    final = stmts[-1]
    temps = [s for s in stmts if s.out not in compute.outputs]
    # every temporary computed row by row inside the last stage's outermost loop(s)
    # (a sum of squares such as Q[i] += D[i,r] * D[i,r] is a row reduction, not a contraction)
    contraction_temps = [t for t in temps if t.reduce == "+=" and len(set(product_accesses(t.expr) or [])) >= 2]
    out = [TILE_TRANSFORM] if applies(compute) else []
    if temps and len(compute.outputs) == 1 and final.reduce == "=" and not contraction_temps \
            and final.extents[0][1] >= 2 * target.threads:
        out += [f"{ROWWISE}@{d}" for d in (1, 2) if d <= len(final.out_dims) - 1]
    before, contraction, _ = final_contraction(compute)
    if before and len(compute.outputs) == 1 and is_contraction(contraction) \
            and any(is_contraction(t) for t in before) \
            and any(t.reduce != "=" and not is_contraction(t) for t in before):
        # (before folding: attention's row max folds into the scores' write-back, but the scores are then
        # stored, where computed per block of rows inside the final contraction they never exist)
        out.append(ROWS_INTO_CONTRACTION)
    if foldable_reductions(compute) or chained_reductions(compute):
        out.append(FOLD_REDUCTIONS)
    return out + [STAGES_EPILOGUE, STAGES, STAGES_SIMPLE, NAIVE]


def build_sketch(compute: Compute, target: Target, consts: frozenset[str], sketch: str,
                 knobs: KnobRecorder | None = None) -> list[Primitive]:
    """The trace of ``sketch`` with ``knobs`` (the heuristic's values where not overridden).

    Raises ValueError (or ScheduleError at lowering) when the sketch does not fit the compute."""
    if target.kind == "cuda":
        from superopt.schedule.gpu_default import build_gpu_sketch

        return build_gpu_sketch(compute, target, consts, sketch, knobs)
    kn = knobs or KnobRecorder()
    stmts = list(compute.statements)
    given = compute  # (the records below lower against it; OutputLayout and Recompute rewrite ``compute``)
    if sketch.startswith(ROWWISE):
        depth = int(sketch.split("@")[1])
        trace = rowwise_schedule(compute, target, kn, depth, fold=True)
        if any(isinstance(p, (ReduceEpilogue, InPlace, NextRow)) for p in trace):
            from superopt.schedule.plan import ScheduleError, lower

            for fold, ahead in ((True, False), (False, False)):
                try:
                    lower(compute, trace, target)
                    break
                except ScheduleError:  # a fold or a row ahead the static tests let through: try without
                    trace = rowwise_schedule(compute, target, kn, depth, fold=fold, ahead=ahead)
        return trace
    if sketch == NAIVE:
        return []
    if sketch == TILE_TRANSFORM:
        return tile_transform_schedule(compute, target, kn)
    if sketch == ROWS_INTO_CONTRACTION:
        return rows_into_contraction(compute, target, kn)
    # per-stage schedules, contractions register-tiled, with elementwise epilogues (bias, activation,
    # residual add) applied at the register tile's write-back when they read it at their own index
    use_contraction, use_epilogue = {STAGES_EPILOGUE: (True, True), STAGES: (True, False),
                                     STAGES_SIMPLE: (False, False), FOLD_REDUCTIONS: (True, True)}[sketch]
    trace: list[Primitive] = []
    if sketch == FOLD_REDUCTIONS:  # a reduction chained after another: recompute its contraction, or store it
        trace += recompute_records(compute, flops_per_byte(target),
                                   lambda c, default: kn.get(f"{c}.recompute", default, (True, False)))
        compute = with_recomputes(compute, trace)
        stmts = list(compute.statements)
    laid_copy = None  # the statement copying a re-laid output: a pass of its own, never the tile's epilogue
    if len(stmts) == 1 and use_contraction and stmts[0].out in compute.outputs and not consts & set(compute.inputs):
        # the output computed in a layout that makes the tile's best columns one run, then copied (run-time
        # operands only: a constant one is packed ahead of time into whatever the tile reads)
        st = stmts[0]
        perm = choose_output_layout(st, target.lanes("float32"), target.vector_registers)
        if kn.get(f"{st.out}.out_layout", perm is not None, (False, True) if perm is not None else (False,)):
            prim = OutputLayout(st.out, perm)
            trace.append(prim)
            compute = with_output_layouts(compute, [prim])
            stmts = list(compute.statements)
            laid_copy = st.out
    folded = foldable_reductions(compute) if sketch == FOLD_REDUCTIONS else {}
    reads: dict[str, set[str]] = {}  # stage -> what it reads once inlined stages are substituted
    tiled: set[str] = set()
    inlined: set[str] = set()
    for st in stmts:
        reads[st.out] = set().union(*(reads[i] if i in inlined else {i} for i in st.inputs()))
        if inlinable(st, stmts, compute.outputs):
            trace.append(Inline(st.out))
            inlined.add(st.out)
            continue
        if st.out in folded:
            trace.append(ReduceEpilogue(st.out, folded[st.out]))
            continue
        if use_contraction and st.reduce == "+=":
            keep = None
            readers = [c for c, p in folded.items() if p == st.out]
            if readers:  # the dims every folded reduction keeps, named as this stage's dims
                from superopt.schedule.plan_check import reduce_epilogue_dims

                keep = frozenset(st.out_dims)
                for c in readers:
                    cs = next(x for x in stmts if x.out == c)
                    dims = reduce_epilogue_dims(cs, st) or {}
                    keep &= {dims[d] for d in cs.out_dims}
            try:
                sub = KnobRecorder(kn.overrides)
                trace += contraction_schedule(st, compute.inputs, target, consts=consts, knobs=sub, keep=keep,
                                              types=compute.type_of)
                kn.used.update(sub.used)
                kn.domains.update(sub.domains)
                tiled.add(st.out)
                continue
            except (ValueError, StopIteration):
                pass
        producers = sorted(reads[st.out] & tiled)
        position = {x.out: k for k, x in enumerate(stmts)}
        if use_epilogue and st.out != laid_copy and st.reduce == "=" and len(producers) == 1 and all(
                position.get(t, -1) <= position[producers[0]] for t in reads[st.out]):  # (none computed after it)
            trace.append(Epilogue(st.out, producers[0]))
            continue
        # (the simple sketch, the fallback of the others, without register-transposed blocks)
        trace += simple_schedule(st, target, knobs=kn, types=None if sketch == STAGES_SIMPLE else compute.type_of)
    return with_panel_packing(given, trace, target, tiled, consts, kn)
