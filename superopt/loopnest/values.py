"""Typed scalar values of loop-nest statements.

Every node carries the element type it is computed in, decided while building the nest (the
printer never infers types). Operators are :class:`Op` with the IR's operator names: unary
functions (``exp``, ``relu``, ``neg``, ...), binary operators (``+``, ``max``, ``pow``, ``mod``,
``and``, ...), comparisons (``<``, ``==``, ...), ``where`` (cond, a, b) and ``cast``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from superopt.ir.expr import Affine
from superopt.loopnest.index import BufferAccess, InBounds, RegisterRef


@dataclass(frozen=True)
class Literal:
    value: float | int | bool
    dtype: str


@dataclass(frozen=True)
class IndexNumber:
    """The value of a linear index expression, as a number of ``dtype`` (int64 unless a float)."""

    index: Affine
    dtype: str


@dataclass(frozen=True)
class Load:
    """Read a buffer element or an accumulator; a padded read checks ``checks`` and else yields ``fill``."""

    source: BufferAccess | RegisterRef
    checks: tuple[InBounds, ...] = ()
    fill: Literal | None = None


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple[Value, ...]
    dtype: str  # the type the operation computes in (bool for comparisons)


Value = Literal | IndexNumber | Load | Op


def value_nodes(v: Value) -> Iterator[Value]:
    """Pre-order over a value tree."""
    yield v
    if isinstance(v, Op):
        for a in v.args:
            yield from value_nodes(a)


def op_counts(v: Value) -> Counter[str]:
    """Operations in one evaluation of ``v``, by operator name."""
    return Counter(n.op for n in value_nodes(v) if isinstance(n, Op))


def loads(v: Value) -> list[Load]:
    return [n for n in value_nodes(v) if isinstance(n, Load)]


def _index_only(v: Value) -> bool:
    return not any(isinstance(n, Load) for n in value_nodes(v))


def weighted_loads(v: Value, uniform: Callable[[Value], bool] = _index_only) -> list[tuple[Load, float]]:
    """Every load of ``v`` with the share of evaluations that perform it. A chain of ``where`` whose conditions
    ``uniform`` accepts (by default: conditions on loop indices only, which an unrolled loop folds to constants,
    as in a Winograd transform's rows ``where(r == 0, ..., where(r == 1, ...))``) runs one of its n branches per
    evaluation: each branch's loads count a 1/n share; anything else counts whole."""
    out: list[tuple[Load, float]] = []

    def go(n: Value, w: float) -> None:
        if isinstance(n, Load):
            out.append((n, w))
            return
        if not isinstance(n, Op):
            return
        if n.op == "where" and uniform(n.args[0]):
            branches: list[Value] = []
            conds: list[Value] = []
            cur: Value = n
            while isinstance(cur, Op) and cur.op == "where" and uniform(cur.args[0]):
                conds.append(cur.args[0])
                branches.append(cur.args[1])
                cur = cur.args[2]
            branches.append(cur)
            for c in conds:
                go(c, w)
            for b in branches:
                go(b, w / len(branches))
            return
        for a in n.args:
            go(a, w)

    go(v, 1.0)
    return out
