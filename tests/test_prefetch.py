"""Prefetch: the next reduction step's weights fetched while a step computes (a hint that changes no value)."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate_compute
from superopt.lang import compile_op
from superopt.loopnest import Loop, Prefetch, build_loopnest, walk
from superopt.runtime.kernel import build_kernels
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Prefetch as PrefetchPrim
from superopt.schedule.primitives import trace_from_json, trace_to_json
from superopt.schedule.space import Point, ScheduleSpace, check
from superopt.target import host_target

BLOCKED_CONV = "O[n,cb,y,x,c] += X[n,ib,y+kh,x+kw,i] * W[cb,ib,kh,kw,i,c]"


def blocked_conv(cb: int, ib: int, hw: int, k: int = 1):
    return compile_op(BLOCKED_CONV, {"X": (1, ib, hw + k - 1, hw + k - 1, 16), "W": (cb, ib, k, k, 16, 16)})


def _prefetches(trace):
    return [p for p in trace if isinstance(p, PrefetchPrim)]


def test_default_prefetches_large_1x1_weights_only():
    """On by default for a 1x1 conv whose weights outgrow a core's L2 (2048 -> 512 channels at 7x7: 4 MiB),
    off for small weights and for 3x3 windows; a knob either way."""
    t = replace(host_target(2), l2_bytes=2 << 20)
    big = ScheduleSpace(blocked_conv(32, 128, 7), t, frozenset({"W"}))
    (p,) = _prefetches(big.trace(big.default_point()))
    assert p.tensor == "W" and p.loop == "ib_o"
    off = Point.of(big.default_point().sketch, {"O.prefetch": False})
    assert not _prefetches(big.trace(off))
    for c in (blocked_conv(8, 8, 7), blocked_conv(32, 32, 7, 3)):
        space = ScheduleSpace(c, t, frozenset({"W"}))
        assert not _prefetches(space.trace(space.default_point()))


def _value(e, env: dict[str, int]) -> int:
    """An affine offset at ``env`` (div/mod atoms of fused loops included)."""
    out = e.const
    for a, c in e.terms:
        x = env[a] if isinstance(a, str) else (env[a.var] // a.divisor if a.op == "/" else env[a.var] % a.divisor)
        out += c * x
    return out


def test_the_fetches_of_an_iteration_cover_the_next_iterations_reads():
    """Every cache line of W that reduction step ``s + 1`` reads is fetched during step ``s``, once per line."""
    from superopt.loopnest.build import _Builder

    t = host_target(2)
    c = blocked_conv(8, 16, 6)
    space = ScheduleSpace(c, t, frozenset({"W"}))
    trace = space.trace(Point.of(space.default_point().sketch, {"O.prefetch": True, "O.red_block": 4, "O.par": 1}))
    (p,) = _prefetches(trace)
    plan = lower(c, trace, t)
    stage = plan.stages["O"]
    names = [lp.name for lp in stage.loops]
    extents = {lp.name: lp.extent for lp in stage.loops}
    builder = _Builder(plan)
    (node,) = builder.prefetch(stage, "W", p.loop, stage.loop(p.spread, p))
    line = t.cache_line_bytes // 4
    for step in range(extents[p.loop] - 1):
        env = {n: 0 for n in names} | {p.loop: step}
        fetched: list[int] = []

        def issue(n, env, fetched=fetched):
            if isinstance(n, Loop):
                for i in range(n.extent):
                    for b in n.body:
                        issue(b, env | {n.var: i})
            else:
                assert isinstance(n, Prefetch)
                fetched.append(_value(n.access.index.linear, env) // line)
        for s in range(extents[p.spread]):
            issue(node, env | {p.spread: s})
        (read,) = [a for a in c.statements[0].expr.accesses() if a.tensor == "W"]
        offset = builder.access(stage, "W", read.index).index.linear
        inner = names[names.index(p.loop) + 1:]
        wanted = {_value(offset, env | {p.loop: step + 1} | dict(zip(inner, vals))) // line
                  for vals in itertools.product(*(range(extents[n]) for n in inner))}
        assert wanted <= set(fetched), sorted(wanted - set(fetched))[:5]
        assert len(fetched) == len(set(fetched)) <= 1.25 * len(wanted)  # a few lines past a run's end at most


@pytest.mark.parametrize("knobs", [{"O.prefetch": True}, {"O.prefetch": True, "O.red_block": 2, "O.y_rows": 2},
                                   {"O.prefetch": True, "O.panel_outer": False}])
def test_prefetching_schedules_match_the_reference(knobs, kernel_cache):
    t = host_target(2)
    cases = []
    for c in (blocked_conv(8, 16, 7), blocked_conv(4, 8, 5, 3)):
        space = ScheduleSpace(c, t, frozenset({"W"}))
        trace = space.trace(Point.of(space.default_point().sketch, {"O.red_block": 4, **knobs}))
        assert _prefetches(trace), trace
        cases.append((c, trace))
        assert "__builtin_prefetch(&W[" in emit_c(lower(c, trace, t)).code
    rng = np.random.default_rng(3)
    for (c, trace), kernel in zip(cases, build_kernels(cases, kernel_cache, 2, t)):
        args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
        (ref,) = evaluate_compute(c, args, np.float64)
        np.testing.assert_allclose(kernel(*args)[0], ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def test_bad_prefetches_are_schedule_errors_and_traces_round_trip():
    t = host_target(2)
    c = blocked_conv(8, 16, 7)
    space = ScheduleSpace(c, t, frozenset({"W"}))
    trace = space.trace(Point.of(space.default_point().sketch, {"O.prefetch": True, "O.red_block": 4}))
    assert trace_from_json(trace_to_json(trace)) == tuple(trace)
    (p,) = _prefetches(trace)
    base = [x for x in trace if x is not p]
    for bad, why in [(replace(p, tensor="O"), "not a kernel input"), (replace(p, spread=p.loop), "not inside"),
                     (replace(p, spread="c"), "not be vectorized|inside the accumulator"),
                     (replace(p, loop="nope"), "no loop"), (replace(p, spread=3), "must be str")]:
        with pytest.raises(ScheduleError, match=why):
            check(c, [*base, bad], t)
    with pytest.raises(ScheduleError, match="already prefetched"):
        check(c, [*base, p, p], t)


def test_an_outer_loop_nest_shows_its_fetches():
    from superopt.loopnest import outline

    t = host_target(2)
    c = blocked_conv(8, 16, 7)
    space = ScheduleSpace(c, t, frozenset({"W"}))
    trace = space.trace(Point.of(space.default_point().sketch, {"O.prefetch": True, "O.red_block": 4}))
    text = outline(build_loopnest(lower(c, trace, t)))
    assert "prefetch W locality 2" in text and any(isinstance(n.node, Loop) and n.node.var == "pf_l"
                                         for n in walk(build_loopnest(lower(c, trace, t))))
