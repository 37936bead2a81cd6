"""The block tests a loop runs under: a partial reduction's write-back is one loop nest per kind of block (first,
middle, last; ``GuardCond.block``), every statement of which is under the same tests, constant over the nest's
loops. A printer tests them once, around the nest (a branch per register tile), instead of once per element: a
branch per element was GCC's to unswitch or thread, which cost it as much as a copy of the whole reduction."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from superopt.ir.expr import Affine
from superopt.loopnest.index import GuardCond
from superopt.loopnest.loop import Loop
from superopt.loopnest.statements import Epilogue, Guard, Node


def _tests(n: Node, inside: set[str]) -> set[GuardCond] | None:
    """The block tests every statement under ``n`` has (None: no constraint, as for an empty loop), the
    variables of ``inside`` (the loops around, within the nest) in none of them."""
    if isinstance(n, Loop):
        inside = inside | {n.var}
        got: set[GuardCond] | None = None
        for c in n.body:
            t = _tests(c, inside)
            if t is not None:
                got = t if got is None else got & t
        return got
    if isinstance(n, Epilogue):
        return _tests(n.body, inside)
    if isinstance(n, Guard):
        return {c for c in n.conds if c.block and not set(c.index.vars()) & inside}
    return set()


def hoisted_tests(lp: Loop) -> tuple[GuardCond, ...]:
    """The block tests that every statement in ``lp`` is under and no loop in it changes: ``lp`` runs only
    where they hold (in their order in the first statement's guard)."""
    common = _tests(lp, set())
    if not common:
        return ()
    first = _first_guard(lp)
    return tuple(c for c in first.conds if c in common) if first is not None else ()


def _first_guard(n: Node) -> Guard | None:
    if isinstance(n, Guard):
        return n
    if isinstance(n, Epilogue):
        return _first_guard(n.body)
    if isinstance(n, Loop):
        for c in n.body:
            g = _first_guard(c)
            if g is not None:
                return g
    return None


def without_tests(n: Node, tests: tuple[GuardCond, ...]) -> Node:
    """``n`` with ``tests`` taken off every guard under it (a guard left with none is its statement)."""
    if isinstance(n, Loop):
        return replace(n, body=tuple(without_tests(c, tests) for c in n.body))
    if isinstance(n, Epilogue):
        return replace(n, body=without_tests(n.body, tests))
    if isinstance(n, Guard):
        conds = tuple(c for c in n.conds if c not in tests)
        return replace(n, conds=conds) if conds else n.body
    return n


def block_share(conds: tuple[GuardCond, ...], loops: tuple[Loop, ...], most: int = 4096) -> float:
    """The share of the iterations of ``loops`` (around a statement under ``conds``) in which its block tests
    hold: a write-back of one kind of block runs in that share of the blocks (the first in one of them). 1.0
    where it has none, or where they range over loops not given or over more than ``most`` iterations."""
    tests = [c for c in conds if c.block]
    if not tests:
        return 1.0
    names = sorted(set().union(*(c.index.vars() for c in tests)))
    extent = {lp.var: lp.extent for lp in loops}
    if any(v not in extent for v in names) or math.prod(extent[v] for v in names) > most:
        return 1.0
    hits = total = 0
    for values in itertools.product(*(range(extent[v]) for v in names)):
        at = {v: Affine.of({}, x) for v, x in zip(names, values)}
        total += 1
        hits += all(c.index.substitute(at).bounds({})[0] < c.limit for c in tests)
    return hits / total
