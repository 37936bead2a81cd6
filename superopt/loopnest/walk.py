"""Walking a loop nest: every node with the loops around it, and the summaries a cost model needs.

    for visit in walk(nest):            # pre-order, stages in kernel order, attached stages in place
        visit.node, visit.loops, visit.stage
    for a in accesses(nest):            # every buffer read and write of a statement
        a.access.buffer, a.is_write, a.strides     # strides: per enclosing loop (var -> stride or None)
    allocations(nest)                   # Alloc nodes (register tiles, locals, workspace)
    statement_ops(nest)                 # (node, loops, Counter of arithmetic ops per execution)

Accumulator and NaN-flag updates are not buffer accesses (they are registers); a read of a padded
tensor counts once, whether or not its padding check passes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from superopt.loopnest.alloc import Alloc
from superopt.loopnest.block_tests import block_share
from superopt.loopnest.index import BufferAccess
from superopt.loopnest.kernel import LoopNest
from superopt.loopnest.loop import Loop
from superopt.loopnest.statements import (
    Accumulate,
    Assign,
    Epilogue,
    Guard,
    Node,
    PeeledLoop,
    Scope,
    StageNest,
    WriteBack,
)
from superopt.loopnest.values import IndexNumber, Load, Value, op_counts, value_nodes, weighted_loads

_COMBINE_OP = {"+=": "+", "*=": "*", "max=": "max", "min=": "min"}


@dataclass(frozen=True)
class Visit:
    node: Node
    loops: tuple[Loop, ...]  # enclosing loops, outermost first
    stage: str | None  # the innermost enclosing stage nest


def _children(n: Node) -> tuple[Node, ...]:
    if isinstance(n, (StageNest, Scope, Loop)):
        return n.body
    if isinstance(n, (Epilogue, Guard)):
        return (n.body,)
    if isinstance(n, PeeledLoop):  # the full-tile loop: what almost every tile runs (same accesses as the rest)
        return (n.loop,)
    return ()


def walk(nest: LoopNest) -> Iterator[Visit]:
    """Pre-order over the kernel body (workspace allocations first, pack routines not included)."""
    for a in nest.workspace:
        yield Visit(a, (), None)

    def go(n: Node, loops: tuple[Loop, ...], stage: str | None) -> Iterator[Visit]:
        if isinstance(n, StageNest):
            stage = n.stage
        yield Visit(n, loops, stage)
        inner = loops + (n,) if isinstance(n, Loop) else loops
        for c in _children(n):
            yield from go(c, inner, stage)

    for s in nest.body:
        yield from go(s, (), None)


@dataclass(frozen=True)
class AccessVisit:
    access: BufferAccess
    is_write: bool
    loops: tuple[Loop, ...]
    stage: str | None
    # the share of the statement's executions that perform the access: under a chain of where on loop
    # indices (not on the vector loop's, which a vector computes both sides of), one branch per execution
    weight: float = 1.0
    # the share of the executions of the loops around it in which its statement runs at all: a write-back of
    # one kind of reduction block (first, middle, last) runs in that share of the blocks (block_tests)
    runs: float = 1.0

    @property
    def strides(self) -> dict[str, int | None]:
        """Stride of the access in elements per iteration of each enclosing loop (None: not constant)."""
        return {lp.var: self.access.stride(lp.var) for lp in self.loops}


def _values(n: Node) -> list[Value]:
    if isinstance(n, (Assign, Accumulate)):
        return [n.value]
    return []


def accesses(nest: LoopNest) -> list[AccessVisit]:
    out: list[AccessVisit] = []
    share: dict[int, float] = {}  # a guarded statement (by id) -> the share of blocks its block tests let it run in
    for v in walk(nest):
        n = v.node
        if isinstance(n, Guard):  # (visited before its statement)
            share[id(n.body)] = block_share(n.conds, v.loops)
        runs = share.get(id(n), 1.0)
        vector = {lp.var for lp in v.loops if lp.kind == "vectorized"}

        def uniform(cond: Value, vector: set[str] = vector) -> bool:
            nodes = list(value_nodes(cond))
            return not any(isinstance(x, Load) for x in nodes) and not any(
                isinstance(x, IndexNumber) and x.index.vars() & vector for x in nodes)

        for val in _values(n):
            for ld, w in weighted_loads(val, uniform):
                if isinstance(ld.source, BufferAccess):
                    out.append(AccessVisit(ld.source, False, v.loops, v.stage, w, runs))
        if isinstance(n, Accumulate) and isinstance(n.target, BufferAccess):
            out.append(AccessVisit(n.target, False, v.loops, v.stage, runs=runs))  # read-modify-write
        if isinstance(n, WriteBack) and n.op is not None:
            out.append(AccessVisit(n.target, False, v.loops, v.stage, runs=runs))
        if isinstance(n, (Assign, Accumulate, WriteBack)) and isinstance(n.target, BufferAccess):
            out.append(AccessVisit(n.target, True, v.loops, v.stage, runs=runs))
    return out


def allocations(nest: LoopNest) -> list[Alloc]:
    return [v.node for v in walk(nest) if isinstance(v.node, Alloc)]


def statement_ops(nest: LoopNest) -> list[tuple[Node, tuple[Loop, ...], Counter[str]]]:
    """Arithmetic operations per execution of each statement (the reduction's combine included)."""
    out = []
    for v in walk(nest):
        n = v.node
        if isinstance(n, (Assign, Accumulate, WriteBack)):
            ops: Counter[str] = Counter()
            for val in _values(n):
                ops += op_counts(val)
            if isinstance(n, Accumulate) or (isinstance(n, WriteBack) and n.op is not None):
                ops[_COMBINE_OP[n.op]] += 1
            out.append((n, v.loops, ops))
    return out
