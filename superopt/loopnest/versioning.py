"""Peeling register tiles: full tiles get constant trip counts, only the last one keeps its tail.

A register tile (a :class:`Scope` that allocates a ``register_tile``) inside a non-dividing split
runs its unrolled row and vector column loops to ``min(extent, limit - offset)``. gcc keeps the
accumulator array in registers only when every access to it has a constant index, so one tail slows
down every tile (a 13-row image in tiles of 4 rows: 3.7x on a 1000-channel 1x1 conv). The loop
that walks the tiles is therefore peeled::

    for (v = 0; v < full; ++v) { the tile, its tails dropped: constant trip counts }
    for (v = full; v < extent; ++v) { the tile as it was }

When the rest is a single tile (``full == extent - 1``) its tails are constants too, and are printed so; under
an enclosing loop's tail, so they are wherever that tail is inactive (a copy of the last tile for those blocks).

A tail on an enclosing loop's variable (the last panel of columns, ``j < n - 64*j_o``) makes ``full`` 0 for that
panel. Where such tails bound only write-back loops (the accumulation runs over the zero-filled panel whole),
the panel gets a middle copy: the tiles with this loop's own tails dropped and the enclosing ones kept, so
its register tiles still have constant rows and a constant accumulation, and only their stores are bounded.

A tail that bounds the accumulation itself, on the variable of a serial loop that walks the tiles through a
loop inside it (the last block of a tiled reduction, ``k_i < K - 96*k_o``; the last panel of an unpacked column
operand, its panels in turn outside the rows), leaves no copy of the tiles below that loop free of it. That
loop is peeled first, from the outside: its full iterations run the body with the tail dropped, and its last
the body with the tail a constant (``K mod 96`` steps), each then peeled as above. Without it every tile of
that last iteration is a float array bounded at run time.

``full`` is the number of leading iterations for which every tail of the tile is inactive (a
constant, or 0 when a tail on an outer loop's variable is active for this block). A condition
inside the tile (``if (full) ... else ...``) would be simpler, but gcc then no longer unrolls the
tile completely. The fast copy is exact: wherever it runs, each dropped tail bound equals the extent.

A parallel loop peeled so is two parallel regions, and each whose iterations the threads share unevenly leaves
one idle: 3 full panels and the last on 2 threads take 3 panels' time where 2 would do. Where that costs the threads
:data:`ONE_REGION_GAIN` or more rounds of iterations, the loop stays one, each iteration running one copy or the
other (``PeeledLoop.branch``, :func:`one_parallel_region`).
"""

from __future__ import annotations

from dataclasses import replace

from superopt.loopnest.alloc import Alloc
from superopt.loopnest.kernel import LoopNest
from superopt.loopnest.loop import Loop, TailLimit
from superopt.loopnest.statements import Accumulate, Epilogue, Guard, Node, PeeledLoop, Scope, StageNest

Tail = tuple[int, TailLimit]  # (the extent of the loop it cuts, the tail)

# how many more rounds of iterations two parallel regions must take than one before a peeled parallel loop is
# printed as one (its iterations branching): over 2 threads 3 full panels and a last are 3 rounds against 2, 1.43x
# on the contraction it was written from; 31 and a last, 17 against 16, ran slower as one region
ONE_REGION_GAIN = 1.1


def one_parallel_region(extent: int, split: int, threads: int) -> bool:
    """Whether a parallel loop of ``extent`` iterations peeled at ``split`` runs as one parallel region: the rounds
    of ``threads`` iterations its full and its other iterations take as two regions, against as one."""
    t = max(1, threads)
    return -(-split // t) + -(-(extent - split) // t) >= ONE_REGION_GAIN * -(-extent // t)


def _children(n: Node) -> tuple[Node, ...]:
    if isinstance(n, (StageNest, Scope, Loop)):
        return n.body
    if isinstance(n, (Epilogue, Guard)):
        return (n.body,)
    return ()


def _bound_inside(n: Node, out: set[str]) -> set[str]:
    if isinstance(n, Loop):
        out.add(n.var)
    for c in _children(n):
        _bound_inside(c, out)
    return out


def _tile_tails(n: Node, inner: set[str], found: dict[Tail, None]) -> None:
    """Every tail in the tile whose offset is fixed while the tile runs (write-back loops too: one
    read of the accumulator array at a run-time index keeps all of it in memory)."""
    if isinstance(n, Loop):
        found.update({(n.extent, t): None for t in n.tail if not (t.offset.vars() & inner)})
    for c in _children(n):
        _tile_tails(c, inner, found)


def _accumulating_tails(n: Node, found: dict[Tail, None]) -> bool:
    """Whether ``n`` accumulates; adds to ``found`` the tails of the loops around an accumulation."""
    if isinstance(n, Accumulate):
        return True
    acc = False
    for c in _children(n):
        acc = _accumulating_tails(c, found) or acc
    if acc and isinstance(n, Loop):
        found.update({(n.extent, t): None for t in n.tail})
    return acc


def _tiles_accumulating_tails(body: tuple[Node, ...], found: dict[Tail, None]) -> dict[Tail, None]:
    for c in body:
        if _is_tile(c):
            _accumulating_tails(c, found)
        elif isinstance(c, (Loop, StageNest, Scope)):
            _tiles_accumulating_tails(c.body, found)
    return found


def _strip(n: Node, dropped: set[TailLimit]) -> Node:
    if isinstance(n, Loop):
        return replace(n, tail=tuple(t for t in n.tail if t not in dropped),
                       body=tuple(_strip(c, dropped) for c in n.body))
    if isinstance(n, (StageNest, Scope)):
        return replace(n, body=tuple(_strip(c, dropped) for c in n.body))
    return n


def _is_tile(n: Node) -> bool:
    return isinstance(n, Scope) and any(isinstance(c, Alloc) and c.kind == "register_tile" for c in n.body)


def _tiles_tails(body: tuple[Node, ...], found: dict[Tail, None] | None = None) -> dict[Tail, None]:
    """The invariant tails of the register tiles in ``body``, also under loops between (a unit batch loop);
    tiles already peeled by an inner loop are left alone."""
    found = {} if found is None else found
    for c in body:
        if _is_tile(c):
            _tile_tails(c, _bound_inside(c, set()), found)
        elif isinstance(c, (Loop, StageNest, Scope)):
            _tiles_tails(c.body, found)
    return found


def _strip_tiles(n: Node, dropped: set[TailLimit]) -> Node:
    if _is_tile(n):
        return _strip(n, dropped)
    if isinstance(n, (Loop, StageNest, Scope)):
        return replace(n, body=tuple(_strip_tiles(c, dropped) for c in n.body))
    return n


def _resolve_tails(n: Node, var: str, value: int, tails: set[TailLimit]) -> Node:
    """``n`` with each of ``tails`` (offsets in ``var`` only) evaluated at ``var = value``: the loop it cuts
    gets the constant extent ``min(extent, limit - offset)`` instead of the run-time bound."""
    if isinstance(n, Loop):
        ext = n.extent
        for t in n.tail:
            if t in tails:
                ext = min(ext, max(0, t.limit - t.offset.const - t.offset.coeff(var) * value))
        return replace(n, extent=ext, tail=tuple(t for t in n.tail if t not in tails),
                       body=tuple(_resolve_tails(c, var, value, tails) for c in n.body))
    if isinstance(n, (StageNest, Scope)):
        return replace(n, body=tuple(_resolve_tails(c, var, value, tails) for c in n.body))
    return n


def _full_iterations(lp: Loop, tails: list[Tail]) -> int | None:
    """Leading iterations of ``lp`` for which each tail (offset ``c * var + const``, c > 0) is inactive."""
    n = lp.extent
    for extent, t in tails:
        c, const = t.offset.coeff(lp.var), t.offset.const
        if c <= 0 or set(t.offset.vars()) != {lp.var} or len(t.offset.terms) != 1:
            return None
        n = min(n, max(0, (t.limit - extent - const) // c + 1))
    return n


def _peel(lp: Loop, outer: tuple[Loop, ...], threads: int) -> Node:
    """``lp`` with its body's tiles peeled when their tails depend on ``lp`` (and maybe outer loops)."""
    found = _tiles_tails(lp.body)
    if not found or lp.kind not in ("serial", "parallel"):
        return lp
    own = [(e, t) for e, t in found if lp.var in t.offset.vars()]
    rest = [(e, t) for e, t in found if lp.var not in t.offset.vars()]
    outer_vars = {o.var for o in outer}
    if not own or any(not t.offset.vars() <= outer_vars for _, t in rest):
        return lp
    split = _full_iterations(lp, own)
    if split is None or split == 0:
        return lp
    dropped = {t for _, t in found}
    fast = replace(lp, body=tuple(_strip_tiles(c, dropped) for c in lp.body))
    general = lp.body
    if not rest and split == lp.extent - 1 and not lp.tail:
        # the rest is one tile, at ``var = split``: its tails are constants there, so it too gets constant
        # trip counts (a register tile of the last rows; gcc keeps it in registers, and the vector printer
        # takes it) instead of run-time bounds
        general = tuple(_resolve_tails(c, lp.var, split, {t for _, t in own}) for c in lp.body)
    middle = None
    if rest and not {t for _, t in rest} & {t for _, t in _tiles_accumulating_tails(lp.body, {})}:
        # (the enclosing loops' tails bound only the stores: tiles of this loop's full iterations stay constant)
        own_tails = {t for _, t in own}
        middle = tuple(_strip_tiles(c, own_tails) for c in lp.body)
        if split == lp.extent - 1 and not lp.tail:
            # after the middle copy ``general`` runs one tile, at ``var = split``: its own tails are constants
            # there, and only the enclosing ones stay run-time bounds on its stores (the last rows of the last
            # panel of columns: a register tile, not a float array bounded at run time)
            general = tuple(_resolve_tails(c, lp.var, split, own_tails) for c in lp.body)
    last = None
    if rest and split == lp.extent - 1 and not lp.tail:
        # where the enclosing loops' tails are inactive (every panel of columns but the last), the one tile left
        # has constant tails too: the last rows of a grouped 1x1 conv (34 rows in tiles of 6: 4) stay a register
        # tile instead of a float array bounded at run time in every panel
        own_tails = {t for _, t in own}
        last = tuple(_resolve_tails(_strip_tiles(c, {t for _, t in rest}), lp.var, split, own_tails)
                     for c in lp.body)
    branch = lp.kind == "parallel" and not rest and not lp.tail and one_parallel_region(lp.extent, split, threads)
    return PeeledLoop(fast, general, split, tuple(rest), middle, last, branch)


def _tile_loop_inside(body: tuple[Node, ...]) -> bool:
    """Whether a loop in ``body`` (under scopes) walks register tiles: ``body``'s loop is not the tiles' own."""
    for c in body:
        if isinstance(c, Loop) and _holds_tile(c.body):
            return True
        if isinstance(c, (StageNest, Scope)) and not _is_tile(c) and _tile_loop_inside(c.body):
            return True
    return False


def _holds_tile(body: tuple[Node, ...]) -> bool:
    return any(_is_tile(c) or isinstance(c, (Loop, StageNest, Scope)) and _holds_tile(c.body) for c in body)


def _peel_from_outside(lp: Loop) -> PeeledLoop | None:
    """``lp`` run as its full iterations and its last one, when it walks the tiles through a loop inside it (a
    block of the reduction, a panel of columns outside the rows): the tiles' tails that depend on ``lp`` only,
    dropped, then constants. Peeled after the loop inside it (see _peel), such a tail would stay a run-time
    bound in every tile; None where there is nothing to peel."""
    if lp.kind != "serial" or lp.tail or not _tile_loop_inside(lp.body):
        return None
    tails = {t for _, t in _tiles_accumulating_tails(lp.body, {}) if set(t.offset.vars()) == {lp.var}}
    split = _full_iterations(lp, [(e, t) for e, t in _tiles_tails(lp.body) if t in tails]) if tails else None
    if split is None or split != lp.extent - 1:
        return None
    return PeeledLoop(replace(lp, body=tuple(_strip_tiles(c, tails) for c in lp.body)),
                      tuple(_resolve_tails(c, lp.var, split, tails) for c in lp.body), split)


def _walk(n: Node, outer: tuple[Loop, ...], threads: int) -> Node:
    if isinstance(n, Loop) and (pl := _peel_from_outside(n)) is not None:
        return replace(pl, loop=replace(pl.loop, body=tuple(_walk(c, outer + (n,), threads) for c in pl.loop.body)),
                       general=tuple(_walk(c, outer + (n,), threads) for c in pl.general))
    if isinstance(n, Loop):
        n = replace(n, body=tuple(_walk(c, outer + (n,), threads) for c in n.body))
        return _peel(n, outer, threads)
    if isinstance(n, (StageNest, Scope)):
        return replace(n, body=tuple(_walk(c, outer, threads) for c in n.body))
    return n


def peel_tile_tails(nest: LoopNest, threads: int = 1) -> LoopNest:
    """``nest`` with each loop over register tiles that have tails peeled into full tiles (constant
    trip counts) and the rest (a no-op for nests without such tiles); ``threads``: those that share its parallel
    loops (:func:`one_parallel_region`)."""
    return replace(nest, body=tuple(_walk(s, (), threads) for s in nest.body))
