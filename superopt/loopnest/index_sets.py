"""Index-set splitting: a loop whose body tests its own variable runs as consecutive loops, one per range
where every such test has a single outcome, with the tests resolved there.

The tests are a padded read's bounds (``InBounds``), comparisons of an index with a constant (the
select of a concatenation: ``where(16*c + l < 64, A[..], B[c-4, ..])``) and a statement's tail guards (not
the tests of which reduction block a register tile's write-back runs in, ``GuardCond.block``: that write-back
is a loop nest per kind of block, run under its test once per tile, and a split of the loop of the blocks
would copy the whole reduction, which made most of the C compiler's time on a conv). Per element they cost a compare
and a select, and a padded read inside a select clamps its index as well (see ``c_emit.c_value``); a
concat over blocked channels ran at 2.8 GB/s that way. Split at the ranges' ends, each loop reads one
tensor with no test at all::

    for (c = 0; c < 8; ++c) out[c] = c < 4 ? A[c] : B[c - 4]
    ->  for (c = 0; c < 4; ++c) out[c] = A[c];   for (c = 0; c < 4; ++c) out[c + 4] = B[c]

A test's outcome on a range must hold for every iteration of the loops inside (their full extents: a
tail only shrinks them), so a test that also depends on an enclosing loop's variable, or on a div/mod
of a fused one, is left alone. Each test's outcome is monotone in the variable, so its changes are
found by binary search (the cost does not grow with the loop's extent). Only serial, parallel and
vectorized loops without tails are split, into at most :data:`MAX_PIECES` loops; each piece's variable
counts from 0 again (the body is shifted by the range's start), so every printer and walker sees plain
loops. A vectorized loop's pieces stay vectorized: an NCHW padded copy vectorized along its rows,
``O[c,y,x] = X[c,y-1,x-1]`` over x, then loads contiguous vectors in the interior, where the bounds
test per lane had made masked gathers.
"""

from __future__ import annotations

from dataclasses import replace

from superopt.ir.expr import Affine
from superopt.loopnest.index import GuardCond, InBounds
from superopt.loopnest.kernel import LoopNest
from superopt.loopnest.loop import Loop
from superopt.loopnest.rebuild import GONE, map_nodes, node_children, node_fields
from superopt.loopnest.statements import Epilogue, Guard, Node, Scope, SplitIndex, StageNest
from superopt.loopnest.values import IndexNumber, Literal, Load, Op

MAX_PIECES = 4
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_HOLDS = {"<": lambda x, k: x < k, "<=": lambda x, k: x <= k, ">": lambda x, k: x > k, ">=": lambda x, k: x >= k}

# a test: (index, op, constant) meaning ``index op constant``
Test = tuple[Affine, str, int]


def _tests_of(x: object, memo: dict[int, tuple[object, dict[object, tuple[Test, ...]]]]) -> dict[object, tuple[Test, ...]]:
    """Every resolvable test under ``x``, keyed by the node it belongs to (an InBounds, a GuardCond or a
    comparison Op). ``memo`` (id -> (node, tests)) holds the subtrees already walked: an outer loop's body
    contains its inner loops' bodies, so one split walks each node once, not once per enclosing loop."""
    if isinstance(x, InBounds):
        tests = ((x.index, ">=", 0),) if x.lower else ()
        return {x: tests + (((x.index, "<", x.upper),) if x.upper is not None else ())}
    if isinstance(x, GuardCond):
        # (a write-back's block test: its nest runs under it, and a split would copy the whole reduction)
        return {} if x.block else {x: ((x.index, "<", x.limit),)}
    if not isinstance(x, tuple) and node_fields(x) is None:
        return {}
    children = node_children(x)
    hit = memo.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    out: dict[object, tuple[Test, ...]] = {}
    if isinstance(x, Op) and x.op in _HOLDS and len(x.args) == 2:
        a, b = x.args
        if isinstance(a, IndexNumber) and isinstance(b, Literal) and isinstance(b.value, int):
            out[x] = ((a.index, x.op, int(b.value)),)
        elif isinstance(b, IndexNumber) and isinstance(a, Literal) and isinstance(a.value, int):
            out[x] = ((b.index, _FLIP[x.op], int(a.value)),)
    for c in children:
        if isinstance(c, tuple) or node_fields(c) is not None:  # (InBounds and GuardCond are dataclasses)
            out.update(_tests_of(c, memo))
    memo[id(x)] = (x, out)  # the node is kept: its id is not reused while the memo lives
    return out


def _inner_extents(body: tuple[Node, ...], out: dict[str, int]) -> dict[str, int]:
    for n in body:
        if isinstance(n, Loop):
            out[n.var] = n.extent
        if isinstance(n, (Loop, StageNest, Scope)):
            _inner_extents(n.body, out)
    return out


def _outcome(tests: tuple[Test, ...], var: str, value: int, inner: dict[str, int]) -> bool | None:
    """True (False) when every test holds (one fails) for all inner iterations at ``var = value``; None: mixed."""
    result: bool | None = True
    for index, op, k in tests:
        rest = index.substitute({var: Affine.of({}, value)})
        lo, hi = rest.bounds(inner)
        at_lo, at_hi = _HOLDS[op](lo, k), _HOLDS[op](hi, k)  # monotone in the index: the ends decide
        if at_lo and at_hi:
            continue
        if not at_lo and not at_hi:
            return False
        result = None
    return result


def _resolve(x: object, outcome: dict[object, bool]) -> object:
    """``x`` with the decided tests replaced: a read whose bounds hold loses its check, one that fails
    becomes its fill; a decided comparison a literal, and a select on a literal its branch; a guarded
    statement whose guards hold loses them, one with a failing guard is dropped."""
    def fn(n: object) -> object | None:
        if isinstance(n, Epilogue) and isinstance(n.body, Guard):
            body = fn(n.body)
            return GONE if body is GONE else replace(n, body=body)
        if isinstance(n, Guard):
            if any(outcome.get(c) is False for c in n.conds):
                return GONE
            conds = tuple(c for c in n.conds if outcome.get(c) is not True)
            return replace(n, conds=conds) if conds else n.body
        if isinstance(n, Load) and n.checks:
            if any(outcome.get(c) is False for c in n.checks):
                return n.fill
            return replace(n, checks=tuple(c for c in n.checks if outcome.get(c) is not True))
        if isinstance(n, Op):
            if n in outcome:
                return Literal(outcome[n], "bool")
            args = tuple(map_nodes(a, fn) for a in n.args)
            if n.op == "where" and isinstance(args[0], Literal):
                return args[1] if args[0].value else args[2]
            return replace(n, args=args)
        return None

    return map_nodes(x, fn)


def _shift(x: object, var: str, start: int) -> object:
    """``x`` with ``var`` replaced by ``var + start``."""
    moved = Affine.of({var: 1}, start)
    def fn(n: object) -> object | None:
        if isinstance(n, Affine):
            return n.substitute({var: moved}) if var in n.vars() else n
        return None

    return map_nodes(x, fn)


def _changes(test: Test, var: str, extent: int, inner: dict[str, int]) -> set[int]:
    """Where one test's outcome over ``var``'s range changes: it is monotone (all true, mixed, all false, or
    the reverse), so two binary searches find both ends of the mixed part."""
    def at(v: int) -> bool | None:
        return _outcome((test,), var, v, inner)

    first, last = at(0), at(extent - 1)

    def search(lo: int, hi: int, stay) -> int:  # the first v in [lo, hi] where stay(v) is false (hi if none)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if stay(mid) else (lo, mid)
        return lo

    a = search(0, extent - 1, lambda v: at(v) == first)
    b = search(a, extent - 1, lambda v: at(v) != last)
    return {a, b} - {0}


def _named_by_split(body: tuple[Node, ...], var: str) -> bool:
    """Whether a SplitIndex in ``body`` rebuilds a variable from ``var`` (its text would not be shifted)."""
    for n in body:
        if isinstance(n, SplitIndex) and var in (n.outer, n.inner):
            return True
        if isinstance(n, (Loop, StageNest, Scope)) and _named_by_split(n.body, var):
            return True
    return False


def _ranges(lp: Loop, memo: dict) -> list[tuple[int, int, dict[object, bool]]] | None:
    """(start, stop, decided tests) per piece of ``lp``, or None when splitting gains nothing."""
    if _named_by_split(lp.body, lp.var):
        return None
    found = _tests_of(lp.body, memo)
    inner = _inner_extents(lp.body, {})
    allowed = set(inner) | {lp.var}
    mine = {key: tests for key, tests in found.items()
            if tests and any(lp.var in t[0].vars() for t in tests)
            and all(set(t[0].vars()) <= allowed and all(isinstance(a, str) for a in t[0].dims) for t in tests)}
    if any(not isinstance(key, GuardCond) for key in found):
        # a write-back's guards run once per tile: the copy budget goes to the reads' tests further in
        mine = {key: tests for key, tests in mine.items() if not isinstance(key, GuardCond)}
    if not mine:
        return None
    cuts = sorted({0} | {c for tests in mine.values() for t in tests for c in _changes(t, lp.var, lp.extent, inner)})
    pieces: list[tuple[int, int, dict[object, bool]]] = []
    for start, stop in zip(cuts, [*cuts[1:], lp.extent]):
        sig = {key: o for key, tests in mine.items() if (o := _outcome(tests, lp.var, start, inner)) is not None}
        if pieces and pieces[-1][2] == sig:
            pieces[-1] = (pieces[-1][0], stop, sig)
        else:
            pieces.append((start, stop, sig))
    if len(pieces) > MAX_PIECES or len(pieces) == 1 and not pieces[0][2]:
        return None
    return pieces


def _split(n: Node, copies: int, min_parallel: int, memo: dict) -> tuple[Node, ...]:
    """``n`` split; ``copies``: how many copies of any one statement the splits below may still make."""
    if isinstance(n, (StageNest, Scope)):
        return (replace(n, body=tuple(c for x in n.body for c in _split(x, copies, min_parallel, memo))),)
    if not isinstance(n, Loop):
        return (n,)
    pieces = _ranges(n, memo) if n.kind in ("serial", "parallel", "vectorized") and not n.tail else None
    if pieces is not None and (len(pieces) > copies or n.kind == "parallel"
                               and any(stop - start < min_parallel for start, stop, _ in pieces)):
        pieces = None  # too many copies of the body, or a parallel piece too short to share among the threads
    if pieces is None:
        return (replace(n, body=tuple(c for x in n.body for c in _split(x, copies, min_parallel, memo))),)
    out: list[Node] = []
    for start, stop, decided in pieces:
        body = _shift(_resolve(n.body, decided), n.var, start)
        inner = copies // len(pieces)
        out.append(replace(n, extent=stop - start, body=tuple(c for x in body for c in _split(x, inner, min_parallel, memo))))
    return tuple(out)


def split_index_sets(nest: LoopNest, max_copies: int = 9, min_parallel: int = 4) -> LoopNest:
    """``nest`` with every loop that tests its own variable split into ranges of one outcome per test:
    at most ``max_copies`` copies of a statement in all (a 3 x 3 split of a padded image's rows and
    columns), and parallel loops only into pieces of at least ``min_parallel`` iterations."""
    memo: dict = {}
    return replace(nest, body=tuple(s for st in nest.body for s in _split(st, max_copies, min_parallel, memo)))
