"""Draw random legal schedule traces for a Compute.

Primitives are appended one at a time and kept only if the trace still lowers legally, so every
trace returned is legal. ``choose`` picks among options (``random.Random.choice`` or a hypothesis
draw), letting property tests and the search share one sampler.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from superopt.ir.compute import Compute
from superopt.schedule.kernel_plan import KernelPlan
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    Epilogue,
    Fuse,
    Inline,
    Pack,
    Parallel,
    Primitive,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)

Choose = Callable[[Sequence[Any]], Any]


def _try(compute: Compute, trace: list[Primitive], p: Primitive) -> KernelPlan | None:
    try:
        return lower(compute, trace + [p])
    except ScheduleError:
        return None


def random_trace(compute: Compute, choose: Choose, steps: int = 8) -> list[Primitive]:
    trace: list[Primitive] = []
    plan = lower(compute, trace)
    # structural choices first: inline or attach temporaries
    for st in compute.statements:
        if st.out in compute.outputs:
            continue
        kind = choose(["root", "inline", "attach"])
        if kind == "inline":
            cand = Inline(st.out)
        elif kind == "attach":
            readers = [s for s in plan.stages.values() if st.out in s.stmt.inputs()]
            if not readers:
                continue
            r = choose(readers)
            cand = ComputeAt(st.out, r.name, choose([lp.name for lp in r.loops] or [""]))
        else:
            continue
        got = _try(compute, trace, cand)
        if got is not None:
            trace.append(cand)
            plan = got
    for _ in range(steps):
        stages = [s for s in plan.stages.values() if s.loops]
        if not stages:
            break
        s = choose(stages)
        names = [lp.name for lp in s.loops]
        kind = choose(["split", "split", "reorder", "fuse", "cache", "unroll", "vector", "parallel", "pack"])
        cand: Primitive | None = None
        if kind == "split":
            lp = choose(s.loops)
            cand = Split(s.name, lp.name, choose([2, 3, 4, 5, 8, 16]))
        elif kind == "reorder" and len(names) > 1:
            order = list(names)
            for i in range(len(order) - 1, 0, -1):  # Fisher-Yates driven by choose
                j = choose(list(range(i + 1)))
                order[i], order[j] = order[j], order[i]
            cand = Reorder(s.name, tuple(order))
        elif kind == "fuse" and len(names) > 1:
            i = choose(list(range(len(names) - 1)))
            cand = Fuse(s.name, names[i], names[i + 1])
        elif kind == "cache" and s.stmt.reduce != "=":
            cand = CacheWrite(s.name, choose(names))
        elif kind == "unroll":
            cand = Unroll(s.name, choose(names))
        elif kind == "vector":
            cand = Vectorize(s.name, names[-1])
        elif kind == "parallel":
            cand = Parallel(s.name, names[0])
        elif kind == "pack" and compute.inputs:
            t = choose(list(compute.inputs))
            rank = compute.type_of[t].rank
            perm = list(range(rank))
            for i in range(rank - 1, 0, -1):
                j = choose(list(range(i + 1)))
                perm[i], perm[j] = perm[j], perm[i]
            axis = choose([-1] + list(range(rank)))
            cand = Pack(t, tuple(perm), axis, choose([2, 3, 4, 8]) if axis >= 0 else 1)
        if cand is None:
            continue
        got = _try(compute, trace, cand)
        if got is not None:
            trace.append(cand)
            plan = got
    # epilogues last: they need the producer's CacheWrite
    for s in list(plan.stages.values()):
        producers = [plan.stages[t] for t in s.stmt.inputs() if t in plan.stages and plan.stages[t].stmt.reduce != "="]
        if s.stmt.reduce == "=" and producers and choose([False, True]):
            cand = Epilogue(s.name, choose(producers).name)
            got = _try(compute, trace, cand)
            if got is not None:
                trace.append(cand)
                plan = got
    return trace


def sample_traces(compute: Compute, n: int, seed: int = 0, steps: int = 8) -> list[list[Primitive]]:
    rng = random.Random(seed)
    return [random_trace(compute, rng.choice, steps) for _ in range(n)]
