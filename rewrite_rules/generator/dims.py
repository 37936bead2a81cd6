"""Symbolic extents: polynomials over dimension symbols with integer coefficients, spelled as strings.

``"p"``, ``"2*q"``, ``"p+q"``, ``"p*q"``, ``"3"``: a canonical spelling (terms sorted, factors sorted) so
equal polynomials compare equal as strings. A whole shape may also be the tuple variable ``"*S"``
(rank-generic elementwise rules).
"""

from __future__ import annotations

from collections.abc import Mapping

Poly = dict[tuple[str, ...], int]  # monomial (sorted symbols) -> coefficient

SHAPE_VARIABLE = "*S"


def parse(s: str) -> Poly:
    poly: Poly = {}
    for term in s.replace(" ", "").split("+"):
        coef, syms = 1, []
        for f in term.split("*"):
            if f.isdigit():
                coef *= int(f)
            else:
                if not f.isidentifier():
                    raise ValueError(f"bad extent expression {s!r}")
                syms.append(f)
        mono = tuple(sorted(syms))
        poly[mono] = poly.get(mono, 0) + coef
    return {m: c for m, c in poly.items() if c}


def fmt(poly: Poly) -> str:
    if not poly:
        return "0"
    terms = []
    for mono in sorted(poly, key=lambda m: (len(m) == 0, m)):
        c = poly[mono]
        parts = ([str(c)] if c != 1 or not mono else []) + list(mono)
        terms.append("*".join(parts))
    return "+".join(terms)


def canon(s: str | int) -> str:
    return fmt(parse(str(s)))


def add(a: str, b: str) -> str:
    p = parse(a)
    for m, c in parse(b).items():
        p[m] = p.get(m, 0) + c
    return fmt({m: c for m, c in p.items() if c})


def mul(a: str, b: str) -> str:
    out: Poly = {}
    for m1, c1 in parse(a).items():
        for m2, c2 in parse(b).items():
            m = tuple(sorted(m1 + m2))
            out[m] = out.get(m, 0) + c1 * c2
    return fmt(out)


def units(s: str) -> list[str]:
    """A sum as its unit parts in canonical order: ``"2*q+p"`` -> ``["p", "q", "q"]`` (monomials repeated)."""
    out: list[str] = []
    for mono, c in sorted(parse(s).items(), key=lambda mc: (len(mc[0]) == 0, mc[0])):
        if c < 0:
            return [s]
        out += [fmt({mono: 1})] * c
    return out


def symbols(s: str) -> set[str]:
    return {x for m in parse(s) for x in m}


def value(s: str, binding: Mapping[str, int]) -> int:
    total = 0
    for mono, c in parse(s).items():
        v = c
        for x in mono:
            v *= binding[x]
        total += v
    return total


def rename(s: str, names: Mapping[str, str]) -> str:
    return fmt({tuple(sorted(names.get(x, x) for x in m)): c for m, c in parse(s).items()})


def factor_pairs(s: str) -> list[tuple[str, str]]:
    """Ordered ways to write a single monomial (coefficient 1) as a product of two non-trivial monomials."""
    poly = parse(s)
    if len(poly) != 1:
        return []
    ((mono, c),) = poly.items()
    if c != 1 or len(mono) < 2:
        return []
    out = set()
    n = len(mono)
    for mask in range(1, (1 << n) - 1):
        a = tuple(m for i, m in enumerate(mono) if mask >> i & 1)
        b = tuple(m for i, m in enumerate(mono) if not mask >> i & 1)
        out.add((fmt({a: 1}), fmt({b: 1})))
    return sorted(out)
