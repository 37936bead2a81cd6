"""Collapsing nested reduction loops that every access walks as one: a loop ``o`` whose whole body is a loop ``i``,
where each buffer access moves ``extent(i)`` times as far per step of ``o`` as per step of ``i``, runs as one loop
of ``extent(o) * extent(i)`` steps::

    for (o = 0; o < 23; ++o) for (i = 0; i < 6; ++i) acc += A[a + 6*o + i] * B[b + 288*o + 48*i]
    ->  for (o_i = 0; o_i < 138; ++o_i) acc += A[a + o_i] * B[b + 48*o_i]

A contraction's reduction dims that are apart in the tensors it reads (``A[o,i,m,n,j,p] * B[k,o,n,l,p,m]``) come
together in the panels a schedule packs them into, in the order the micro-kernel reads them: there the register
tile's reduction is one stream through both panels, walked by one loop where it was walked by four short ones,
each of which restarted the C compiler's address arithmetic and split the tile's stream of loads into short runs.
The schedule's dims stay as they are (a trace cannot fuse a fused loop again): the loop nest, once every layout is
known, is where the contiguity shows.

Only serial reduction loops without tails collapse, and only where the two variables appear in nothing but the
linear part of buffer offsets (no tail, guard, register index, index value or div/mod of them): the accesses are
then the same addresses in the same order, so the values and the rounding of every sum are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from superopt.ir.expr import Affine
from superopt.loopnest.index import FlatIndex
from superopt.loopnest.kernel import LoopNest
from superopt.loopnest.loop import Loop
from superopt.loopnest.rebuild import map_nodes, node_children
from superopt.loopnest.statements import SplitIndex


def _collapsible(lp: Loop) -> bool:
    return lp.kind == "serial" and lp.reduce and not lp.tail and not lp.reductions and lp.extent > 1


def _innermost_reduction(lp: Loop) -> bool:
    """No serial reduction loop runs inside ``lp`` (register tile loops may)."""
    return not any(isinstance(n, Loop) and (n.kind == "serial" and n.reduce or not _innermost_reduction(n))
                   for n in lp.body)


def _walks_as_one(body: object, outer: Loop, inner: Loop) -> bool:
    """Every mention of the two loops' variables in ``body`` is a plain term of a flat offset, the outer's
    coefficient ``inner.extent`` times the inner's."""
    names = {outer.var, inner.var}
    ok = True

    def visit(x: object) -> None:
        nonlocal ok
        if not ok:
            return
        if isinstance(x, FlatIndex):
            if any(names & w.inner.vars() for w in x.wrapped):
                ok = False
            elif names & x.linear.vars():
                if any(not isinstance(a, str) and a.var in names for a, _ in x.linear.terms):
                    ok = False  # (a div/mod of one of them)
                elif x.linear.coeff(outer.var) != inner.extent * x.linear.coeff(inner.var):
                    ok = False
            return
        if isinstance(x, Affine):
            ok = not (names & x.vars())
            return
        if isinstance(x, SplitIndex):
            ok = not (names & {x.var, x.outer, x.inner})
            return
        if isinstance(x, Loop) and x.var in names:
            ok = False
            return
        for c in node_children(x):
            visit(c)

    visit(body)
    return ok


def _variables(x: object, out: set[str]) -> set[str]:
    if isinstance(x, Loop):
        out.add(x.var)
    for c in node_children(x):
        _variables(c, out)
    return out


def _fresh(name: str, used: set[str]) -> str:
    """``name``, or with the first free suffix where a loop already has it (the peeled copies of one chain, the
    full tiles' and the tails', each collapse under a name of their own)."""
    out, k = name, 2
    while out in used:
        out, k = f"{name}_{k}", k + 1
    used.add(out)
    return out


def _chain(lp: Loop, used: set[str]) -> Loop | None:
    """``lp`` and the reduction loops nested in it as one loop, where every pair walks as one; ``lp`` itself where
    no reduction loop runs inside it; None where they do not all collapse (a loop left inside the collapsed ones
    would only move the C compiler's scheduling around, which measured as often slower as faster)."""
    if _innermost_reduction(lp):
        return lp
    if len(lp.body) != 1 or not isinstance(lp.body[0], Loop) or not _collapsible(lp.body[0]) \
            or lp.body[0].stage != lp.stage:
        return None
    inner = _chain(lp.body[0], used)
    if inner is None or not _walks_as_one(inner.body, lp, inner):
        return None
    name = _fresh(f"{lp.var}_{inner.var}", used)
    drop, rename = lp.var, {inner.var: Affine.var(name)}

    def fn(x: object) -> object | None:
        if isinstance(x, FlatIndex):
            # (outer = fused / n, inner = fused % n: the outer's term is the inner's times n, so the pair's terms
            # are the inner's coefficient times the fused variable)
            linear = Affine.of({a: c for a, c in x.linear.terms if a != drop}, x.linear.const)
            return replace(x, linear=linear.substitute(rename))
        return None

    return replace(inner, var=name, extent=lp.extent * inner.extent, body=map_nodes(inner.body, fn))


def collapse_reductions(nest: LoopNest) -> LoopNest:
    """``nest`` with each chain of nested serial reduction loops that its accesses walk as one loop made one."""
    used = _variables(nest.body, set())

    def fn(x: object) -> object | None:
        if isinstance(x, Loop) and _collapsible(x):
            return _chain(x, used) or x  # (nothing inside a reduction chain is collapsed apart from it)
        return None

    body = map_nodes(nest.body, fn)
    return nest if body is nest.body else replace(nest, body=body)
