"""Where a loop nest reads and writes: flattened buffer accesses and register references.

A :class:`BufferAccess` is one element of a contiguous row-major buffer at a :class:`FlatIndex`: a
linear expression over loop variables (an :class:`~superopt.ir.expr.Affine`, possibly with div/mod
atoms of fused loops) plus, for packed layouts whose split cannot be folded, ``stride * (expr / k)``
or ``stride * (expr % k)`` terms. Strides per loop variable are read off the linear part.
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt.ir.expr import Affine
from superopt.schedule.kernel_plan import PackLayout


@dataclass(frozen=True)
class WrappedTerm:
    """``stride * (inner / divisor)`` (op ``"/"``) or ``stride * (inner % divisor)`` (op ``"%"``)."""

    stride: int
    inner: Affine
    op: str
    divisor: int


@dataclass(frozen=True)
class FlatIndex:
    """Element offset into a buffer: ``linear + sum(wrapped)``."""

    linear: Affine
    wrapped: tuple[WrappedTerm, ...] = ()

    def vars(self) -> set[str]:
        out = set(self.linear.vars())
        for w in self.wrapped:
            out |= w.inner.vars()
        return out

    def stride(self, var: str) -> int | None:
        """Elements the offset moves when ``var`` grows by one, or None when that is not constant
        (``var`` under a div/mod, e.g. of a fused loop or a packed split axis). 0: ``var`` is not used."""
        if var not in self.vars():
            return 0
        if any(var in w.inner.vars() for w in self.wrapped):
            return None
        if any(not isinstance(a, str) and a.var == var for a, _ in self.linear.terms):
            return None
        return self.linear.coeff(var)


@dataclass(frozen=True)
class BufferAccess:
    """One element of a tensor's buffer (an argument, a workspace or a local buffer)."""

    buffer: str
    index: FlatIndex
    dtype: str
    layout: PackLayout | None = None  # the packed layout of a packed kernel input

    def stride(self, var: str) -> int | None:
        return self.index.stride(var)


@dataclass(frozen=True)
class RegisterRef:
    """An accumulator: a scalar register (``index`` None) or one element of a register tile."""

    name: str
    index: Affine | None = None


@dataclass(frozen=True)
class InBounds:
    """A padding check on one axis of a padded read: ``index >= 0`` (when ``lower``) and ``index < upper``."""

    index: Affine
    lower: bool
    upper: int | None


@dataclass(frozen=True)
class GuardCond:
    """``index < limit``: a tail of a non-dividing split that no loop bound could absorb, or (``block``) which
    block of a partial reduction a write-back runs in (the first stores its tile, the later ones combine it,
    the last runs the epilogue). A block test is constant over the write-back's loops: the write-back is one
    loop nest per block kind (``_Builder.loops``), which the printers run under the test, and the loop of
    the blocks is not split on it (``index_sets``), which would copy the whole reduction once per kind."""

    index: Affine
    limit: int
    block: bool = False
