"""Useful floating-point work of a compute op: the numerator of every GFLOP/s figure."""

from __future__ import annotations

import math

from superopt.ir.compute import Compute
from superopt.ir.expr import Binary, Compare, Unary, Where
from superopt.ir.statement import Statement


def flop_count(compute: Compute) -> int:
    """Arithmetic operations over every statement's iteration box: each unary, binary, compare or
    select is one, and a reduction's combine is one more (so a matmul counts 2*M*N*K)."""
    return sum(statement_flops(st) for st in compute.statements)


def statement_flops(st: Statement) -> int:
    """:func:`flop_count` of one statement."""
    ops = sum(isinstance(x, (Unary, Binary, Compare, Where)) for x in st.expr.walk())
    if st.reduce != "=":
        ops += 1
    return ops * math.prod(n for _, n in st.extents)
