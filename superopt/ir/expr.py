"""Scalar expressions evaluated at one point of a statement's iteration space.

An index into a tensor is an :class:`Affine` combination of named dimensions (the same class, with
:class:`DivMod` atoms, indexes lowered loop nests); values are built
from tensor accesses, constants, index values and the operators below, grouped by kind.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

UNARY_FNS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "neg", "relu", "floor", "ceil",
    "reciprocal", "sin", "cos", "round", "not", "sign",
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "isnan", "isinf", "bitnot",
)
# ``mod`` is floor modulo (the sign of the divisor, numpy/Python); ``fmod`` truncates (the sign of the
# dividend, C); ``bitand``..``shr`` are the integer bit operators (``shr`` is arithmetic on signed types)
BINARY_OPS = ("+", "-", "*", "/", "max", "min", "pow", "and", "or", "mod",
              "fmod", "bitand", "bitor", "bitxor", "shl", "shr")
BOOL_FNS = ("isnan", "isinf")  # unary functions whose result is bool whatever their operand
SAME_TYPE_FNS = ("not", "neg", "abs", "sign", "bitnot")  # computed in the operand's own type (ints stay ints)
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")


@dataclass(frozen=True)
class DivMod:
    """``var / divisor`` (op ``"/"``, floor quotient) or ``var % divisor`` (op ``"%"``): the two parts of
    a loop variable fused from an outer and an inner loop (``outer = f / n_inner``, ``inner = f % n_inner``)."""

    op: str
    var: str
    divisor: int

    def __str__(self) -> str:
        return f"({self.var} {self.op} {self.divisor})"


Atom = str | DivMod  # a dimension / loop variable name, or a quotient or remainder of one


def _term_order(term: tuple[Atom, int]) -> tuple[int, str]:
    return _atom_order(term[0])


def _atom_order(atom: Atom) -> tuple[int, str]:
    """Names first, by name; then div/mod atoms by the text of ``(op, var, divisor)`` (the printed order
    of generated C depends on it, so it never changes)."""
    if isinstance(atom, str):
        return 0, atom
    return 1, repr((atom.op, atom.var, atom.divisor))


@dataclass(frozen=True)
class Affine:
    """sum(coeff * atom) + const with integer coefficients: the one linear index expression of the code base.

    In the IR an atom is a named dimension; in lowered loop nests it is a loop variable or a
    :class:`DivMod` of one (left by a fuse). Terms are sorted (names by name, then div/mod atoms) and
    have no zero coefficients, so equal expressions are equal objects."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms: Mapping[Atom, int] | None = None, const: int = 0) -> Affine:
        # (the most called constructor of the compiler: lowering and featurizing a schedule builds hundreds
        # of thousands; names alone sort by name, which is their _atom_order)
        if not terms:
            return Affine((), int(const))
        items = [(d, int(c)) for d, c in terms.items() if c != 0]
        if len(items) > 1:
            try:
                items.sort()  # (all names: sorted by name; a coefficient never decides, the names differ)
            except TypeError:  # a div/mod atom among them
                items.sort(key=_term_order)
            else:
                if not isinstance(items[0][0], str):  # (div/mod atoms alone: their own order)
                    items.sort(key=_term_order)
        return Affine(tuple(items), int(const))

    @staticmethod
    def dim(name: Atom) -> Affine:
        return Affine(((name, 1),), 0)

    var = dim  # a loop variable (or div/mod atom) with coefficient 1

    def coeff(self, atom: Atom) -> int:
        return dict(self.terms).get(atom, 0)

    @property
    def map(self) -> dict[Atom, int]:
        return dict(self.terms)

    @property
    def dims(self) -> tuple[Atom, ...]:
        return tuple(d for d, _ in self.terms)

    def vars(self) -> set[str]:
        """The variables the expression depends on (also those inside div/mod atoms)."""
        return {a if isinstance(a, str) else a.var for a, _ in self.terms}

    @property
    def is_plain_dim(self) -> bool:
        return self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1 and isinstance(self.terms[0][0], str)

    def __add__(self, other: Affine) -> Affine:
        t = dict(self.terms)
        for d, c in other.terms:
            t[d] = t.get(d, 0) + c
        return Affine.of(t, self.const + other.const)

    def scale(self, k: int) -> Affine:
        return Affine.of({d: c * k for d, c in self.terms}, self.const * k)

    def substitute(self, mapping: Mapping[str, Affine]) -> Affine:
        """Replace variables by expressions; a div/mod atom of a replaced variable is rewritten when the
        replacement is ``m*outer + inner`` with ``m`` a multiple of the divisor (else ValueError)."""
        t: dict[Atom, int] = {}
        const = self.const
        for d, c in self.terms:
            part = mapping.get(d) if isinstance(d, str) else \
                _split_divmod(d, mapping[d.var]) if d.var in mapping else None
            if part is None:
                t[d] = t.get(d, 0) + c
                continue
            const += part.const * c
            for a, k in part.terms:
                t[a] = t.get(a, 0) + k * c
        return Affine.of(t, const)

    def simplify(self) -> Affine:
        """Fold ``k*(v/k)*c + (v%k)*c`` into ``v*c`` (a fused loop over contiguous axes keeps unit stride)."""
        t = self.map
        for a in list(t):
            if isinstance(a, DivMod) and a.op == "%" and a in t:
                d = DivMod("/", a.var, a.divisor)
                c = t[a]
                if t.get(d) == c * a.divisor:
                    del t[a], t[d]
                    t[a.var] = t.get(a.var, 0) + c
        return Affine.of(t, self.const)

    def bounds(self, extents: Mapping[str, int]) -> tuple[int, int]:
        """Smallest and largest value over the box 0 <= var < extent (KeyError for a variable not in it)."""
        lo = hi = self.const
        for d, c in self.terms:
            if isinstance(d, str):
                top = extents[d] - 1
            elif d.op == "%":
                top = d.divisor - 1
            else:
                top = (extents[d.var] - 1) // d.divisor
            lo += min(0, c * top)
            hi += max(0, c * top)
        return lo, hi

    def __str__(self) -> str:
        s = ""
        for d, c in self.terms:
            term = str(d) if abs(c) == 1 else f"{abs(c)}*{d}"
            s += ("-" if c < 0 else ("+" if s else "")) + term
        if self.const or not s:
            s += f"+{self.const}" if (s and self.const > 0) else str(self.const)
        return s


def flat_offset(index: Sequence[Affine], shape: Sequence[int]) -> Affine:
    """The row-major element offset of ``index`` (one expression per axis) into a buffer of ``shape``."""
    out, stride = Affine.of(), 1
    for ix, n in reversed(list(zip(index, shape))):
        out = out + ix.scale(stride)
        stride *= n
    return out


def exact_divmod(lin: Affine, f: int, extents: Mapping[str, int]) -> tuple[Affine | None, Affine | None]:
    """``(q, r)`` with ``lin = f*q + r`` exactly, where the remainder's terms stay in ``[0, f)`` over the box
    ``0 <= var < extent``; ``(None, None)`` when no such split exists (or a variable is not in ``extents``)."""
    q, r = {}, {}
    for a, c in lin.simplify().terms:
        if c % f == 0:
            q[a] = c // f
        else:
            r[a] = c
    rl = Affine.of(r, lin.const % f)
    try:
        lo, hi = rl.bounds(extents)
    except KeyError:
        return None, None
    if lo >= 0 and hi < f:
        return Affine.of(q, lin.const // f), rl
    return None, None


def box_split(lin: Affine, inner: set[str], extents: Mapping[str, int]) -> tuple[Affine, Affine, int]:
    """``lin`` as ``origin + local``: ``local`` over the variables of ``inner`` (shifted to start at 0), ``origin``
    over the rest; and the extent ``local`` spans over the box ``0 <= var < extent`` (the box a loop's iterations
    read of one axis: an origin per iteration of the loops outside, a range inside)."""
    # (by terms: a div/mod atom of a variable inside, a fused loop's part, is local whole)
    org = Affine.of({a: c for a, c in lin.terms if (a if isinstance(a, str) else a.var) not in inner},
                    lin.const).simplify()
    loc = (lin + org.scale(-1)).simplify()
    lo, hi = loc.bounds(extents)
    return (org + Affine.of({}, lo)).simplify(), (loc + Affine.of({}, -lo)).simplify(), hi - lo + 1


def _split_divmod(atom: DivMod, repl: Affine) -> Affine:
    """(v / k) or (v % k) with v = m*outer + inner, m a multiple of k (and inner < m)."""
    k = atom.divisor
    terms = repl.map
    inner = [a for a, c in terms.items() if c == 1 and isinstance(a, str)]
    for i in inner:
        rest = {a: c for a, c in terms.items() if a != i}
        if len(rest) == 1 and repl.const == 0:
            (outer, m), = rest.items()
            if isinstance(outer, str) and m % k == 0:
                if atom.op == "/":
                    return Affine.of({outer: m // k, DivMod("/", i, k): 1})
                return Affine.of({DivMod("%", i, k): 1})
    raise ValueError(f"cannot substitute {atom.var} = {repl} under {atom}")


class Expr:
    """Base of scalar expression nodes."""

    def children(self) -> tuple[Expr, ...]:
        return ()

    def walk(self) -> Iterator[Expr]:
        yield self
        for c in self.children():
            yield from c.walk()

    def accesses(self) -> list[Access]:
        return [e for e in self.walk() if isinstance(e, Access)]


def _fmt_const(v: float | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if math.isnan(v):
        return "nan"
    r = repr(float(v))
    return r


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool
    dtype: str = "float32"

    def __str__(self) -> str:
        return _fmt_const(self.value)


@dataclass(frozen=True)
class IndexValue(Expr):
    """The value of an affine index expression, used as a number (for masks and iotas)."""

    index: Affine

    def __str__(self) -> str:
        return f"({self.index})"


@dataclass(frozen=True)
class Access(Expr):
    tensor: str
    index: tuple[Affine, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(map(str, self.index))}]"


@dataclass(frozen=True)
class Unary(Expr):
    fn: str
    x: Expr

    def __post_init__(self) -> None:
        if self.fn not in UNARY_FNS:
            raise ValueError(f"unknown unary function {self.fn!r}")

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def __str__(self) -> str:
        return f"{self.fn}({self.x})"


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown binary operator {self.op!r}")

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def __str__(self) -> str:
        if self.op in ("+", "-", "*", "/"):
            return f"({self.a} {self.op} {self.b})"
        return f"{self.op}({self.a}, {self.b})"


@dataclass(frozen=True)
class Compare(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in COMPARE_OPS:
            raise ValueError(f"unknown comparison {self.op!r}")

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def __str__(self) -> str:
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)

    def __str__(self) -> str:
        return f"where({self.cond}, {self.a}, {self.b})"


@dataclass(frozen=True)
class Cast(Expr):
    dtype: str
    x: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def __str__(self) -> str:
        return f"cast_{self.dtype}({self.x})"


def map_expr(e: Expr, fn) -> Expr:
    """Rebuild ``e`` bottom-up, applying ``fn`` to every rebuilt node."""
    if isinstance(e, Unary):
        e = Unary(e.fn, map_expr(e.x, fn))
    elif isinstance(e, Binary):
        e = Binary(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Compare):
        e = Compare(e.op, map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Where):
        e = Where(map_expr(e.cond, fn), map_expr(e.a, fn), map_expr(e.b, fn))
    elif isinstance(e, Cast):
        e = Cast(e.dtype, map_expr(e.x, fn))
    return fn(e)


def substitute_dims(e: Expr, mapping: Mapping[str, Affine]) -> Expr:
    """Replace dimensions by affine expressions in every index of ``e``."""

    def sub(n: Expr) -> Expr:
        if isinstance(n, Access):
            return Access(n.tensor, tuple(a.substitute(mapping) for a in n.index))
        if isinstance(n, IndexValue):
            return IndexValue(n.index.substitute(mapping))
        return n

    return map_expr(e, sub)


def rename_tensors(e: Expr, mapping: Mapping[str, str]) -> Expr:
    return map_expr(e, lambda n: Access(mapping.get(n.tensor, n.tensor), n.index) if isinstance(n, Access) else n)


def product_accesses(e: Expr) -> list[Access] | None:
    """The reads of ``e`` when it is a bare read or a product of bare reads (``A[i,k] * B[k,j]``), else None."""
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Binary) and e.op == "*":
        a, b = product_accesses(e.a), product_accesses(e.b)
        if a is not None and b is not None:
            return a + b
    return None
