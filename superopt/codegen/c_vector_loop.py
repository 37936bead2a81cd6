"""A vectorized loop of whole vectors printed as vector statements: the C spelling of a loop GCC need not vectorize.

A ``vectorized`` loop is otherwise printed as an ``omp simd`` loop, which GCC's loop vectorizer turns into vector
code. Where the loop is exactly one vector (or two) of the target's float32 lanes and starts at 0 with no tail,
its statements are printed once per vector in a block where the loop variable is a constant (``const int v = 0;``),
as GCC vectors (the prelude's ``so_v16`` / ``so_v8``): a read contiguous along the loop is one unaligned vector
load (``so_ld16``), a read constant along it a scalar (GCC broadcasts a scalar operand of a vector operation), a
padded read whose checks do not involve the loop ``checks ? load : fill``, ``where`` of a condition that does not
involve the loop a select between two vectors, and the store one unaligned vector store (``so_st16``).

What for: a loop nest of many short vector loops (the tile transforms of a Winograd convolution, per padding
piece two unrolled loops of 6 around a loop of 16 lanes) costs GCC seconds of vectorizer analysis per kernel
that this spelling skips; the code it makes is the same vector arithmetic.

Anything else leaves the loop to the ``omp simd`` printing: a loop of another extent, a reduction, a statement
other than a float32 assignment, a read neither contiguous nor constant along the loop (another stride, a
div/mod of the loop), a check or condition that involves the loop, an operation with no vector spelling here.

A scalar is broadcast as ``x - (so_v16){0}``: ``x + 0`` would turn -0.0 into +0.0. The padded reads need not
clamp their index as the scalar printer's selects do (``c_value``'s ``clamp_guarded``): that works around GCC
if-converting a loop it vectorizes, and no loop is left here to vectorize; the condition is a scalar, so the load
runs only where it holds.
"""

from __future__ import annotations

from superopt.codegen.c_emit import c_checks, c_ref, c_value
from superopt.codegen.c_prelude import VECTOR_LANES, vector_op
from superopt.loopnest import Assign, BufferAccess, IndexNumber, Literal, Load, Loop, Op, RegisterRef, Value
from superopt.loopnest.values import value_nodes

__all__ = ["vector_loop_lines"]


class _NotVector(Exception):
    """The loop has something the vector spelling does not cover."""


def vector_loop_lines(lp: Loop, lanes: int | None, dtypes: dict[str, str]) -> list[tuple[int, str]] | None:
    """(relative indent, line) of vectorized loop ``lp`` (from 0, no run-time bound) as vector statements of
    ``lanes`` floats (the target's float32 lanes; None: no vectors), or None where it cannot be spelled so.
    ``dtypes``: the element type of every buffer and register in scope, by name."""
    if lanes not in VECTOR_LANES or lp.kind != "vectorized" or lp.tail or lp.reductions \
            or lp.extent not in (lanes, 2 * lanes) or not lp.body:
        return None
    spell = _Spelling(lp.var, lanes, dtypes)
    try:
        stores = [spell.assign(n) for n in lp.body]
    except _NotVector:
        return None
    lines: list[tuple[int, str]] = []
    for start in range(0, lp.extent, lanes):
        lines += [(0, f"{{  /* {lp.var} in [{start}, {start + lanes}): one vector */"),
                  (1, f"const int {lp.var} = {start};"), *[(1, s) for s in stores], (0, "}")]
    return lines


class _Spelling:
    def __init__(self, var: str, lanes: int, dtypes: dict[str, str]) -> None:
        self.var, self.lanes, self.dtypes = var, lanes, dtypes
        self.t = f"so_v{lanes}"

    def assign(self, n: object) -> str:
        if not isinstance(n, Assign) or self.dtype(n.value) != "float32":
            raise _NotVector
        text, is_vec = self.expr(n.value)
        return f"so_st{self.lanes}(&{self.contiguous(n.target)}, {text if is_vec else self.broadcast(text)});"

    def broadcast(self, scalar: str) -> str:
        return f"({scalar} - ({self.t}){{0}})"

    def contiguous(self, ref: BufferAccess | RegisterRef) -> str:
        """C of the element ``ref`` at the vector's first lane, where ``ref`` is a float32 element that moves by one
        along the loop."""
        if isinstance(ref, BufferAccess):
            ok = self.dtypes.get(ref.buffer) == "float32" and ref.stride(self.var) == 1
        else:
            ix = ref.index
            ok = self.dtypes.get(ref.name) == "float32" and ix is not None and ix.coeff(self.var) == 1 \
                and all(isinstance(a, str) for a, _ in ix.terms)
        if not ok:
            raise _NotVector
        return c_ref(ref)

    def dtype(self, v: Value) -> str | None:
        if isinstance(v, Load):
            src = v.source
            return self.dtypes.get(src.buffer if isinstance(src, BufferAccess) else src.name)
        return v.dtype

    def involves(self, v: Value) -> bool:
        """Whether ``v`` changes along the loop (reads, checks or index numbers of its variable)."""
        for n in value_nodes(v):
            if isinstance(n, IndexNumber) and self.var in n.index.vars():
                return True
            if isinstance(n, Load):
                src = n.source
                ix = src.index.vars() if isinstance(src, BufferAccess) else \
                    (src.index.vars() if src.index is not None else set())
                if self.var in ix or any(self.var in chk.index.vars() for chk in n.checks):
                    return True
        return False

    def expr(self, v: Value) -> tuple[str, bool]:
        """(C text, whether it is a vector) of float32 value ``v``."""
        if self.dtype(v) != "float32":
            raise _NotVector
        if not self.involves(v):
            return c_value(v), False  # (one scalar for every lane)
        if isinstance(v, Load):
            if any(self.var in chk.index.vars() for chk in v.checks):
                raise _NotVector
            vec = f"so_ld{self.lanes}(&{self.contiguous(v.source)})"
            if not v.checks:
                return vec, True
            fill = c_value(v.fill if v.fill is not None else Literal(0, "float32"))
            return f"({c_checks(v.checks)} ? {vec} : {self.broadcast(fill)})", True
        if not isinstance(v, Op):
            raise _NotVector
        if v.op == "where":
            cond, *branches = v.args
            if self.involves(cond):
                raise _NotVector
            a, b = (text if is_vec else self.broadcast(text) for text, is_vec in map(self.expr, branches))
            return f"({c_value(cond)} ? {a} : {b})", True
        text = vector_op(v.op, [self.expr(a)[0] for a in v.args], self.lanes)
        if text is None:
            raise _NotVector
        return text, True
