"""Integer linear expressions over loop variables, the index algebra of lowered kernels.

An atom is a loop variable name, or ``("/", v, k)`` / ``("%", v, k)`` for loops eliminated by a
fuse (``a = f / Eb``, ``b = f % Eb``). ``k*(f/k) + f%k`` simplifies back to ``f``, so fused loops
over contiguous axes keep unit-stride addressing (and vectorize).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Atom = str | tuple


@dataclass(frozen=True)
class Lin:
    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms: Mapping[Atom, int] | None = None, const: int = 0) -> Lin:
        t = {a: c for a, c in (terms or {}).items() if c != 0}
        return Lin(tuple(sorted(t.items(), key=lambda kv: repr(kv[0]))), const)

    @staticmethod
    def var(name: Atom) -> Lin:
        return Lin(((name, 1),), 0)

    @property
    def map(self) -> dict[Atom, int]:
        return dict(self.terms)

    def __add__(self, o: Lin) -> Lin:
        t = self.map
        for a, c in o.terms:
            t[a] = t.get(a, 0) + c
        return Lin.of(t, self.const + o.const)

    def scale(self, k: int) -> Lin:
        return Lin.of({a: c * k for a, c in self.terms}, self.const * k)

    def substitute(self, var: str, repl: Lin) -> Lin:
        out = Lin.of({}, self.const)
        for a, c in self.terms:
            if a == var:
                out = out + repl.scale(c)
            elif isinstance(a, tuple) and a[1] == var:
                out = out + _split_atom(a, repl).scale(c)
            else:
                out = out + Lin.of({a: c})
        return out

    def vars(self) -> set[str]:
        return {a if isinstance(a, str) else a[1] for a, _ in self.terms}

    def simplify(self) -> Lin:
        """Fold k*(v/k)*c + (v%k)*c into v*c."""
        t = self.map
        for a in list(t):
            if isinstance(a, tuple) and a[0] == "%" and a in t:
                d = ("/", a[1], a[2])
                c = t[a]
                if t.get(d) == c * a[2]:
                    del t[a], t[d]
                    t[a[1]] = t.get(a[1], 0) + c
        return Lin.of(t, self.const)

    def bounds(self, extents: Mapping[str, int]) -> tuple[int, int]:
        lo = hi = self.const
        for a, c in self.terms:
            if isinstance(a, str):
                top = extents[a] - 1
            elif a[0] == "%":
                top = a[2] - 1
            else:
                top = (extents[a[1]] - 1) // a[2]
            lo += min(0, c * top)
            hi += max(0, c * top)
        return lo, hi

    def c(self) -> str:
        s = self.simplify()
        parts: list[str] = []
        for a, c in s.terms:
            atom = a if isinstance(a, str) else f"({a[1]} {a[0]} {a[2]})"
            mag = abs(c)
            term = atom if mag == 1 else f"{mag}*{atom}"
            if not parts:
                parts.append(term if c > 0 else f"-{term}")
            else:
                parts.append(f" + {term}" if c > 0 else f" - {term}")
        if s.const or not parts:
            if not parts:
                parts.append(str(s.const))
            else:
                parts.append(f" + {s.const}" if s.const > 0 else f" - {-s.const}")
        return "".join(parts)


def _split_atom(atom: tuple, repl: Lin) -> Lin:
    """(v / k) or (v % k) with v = m*outer + inner, m a multiple of k (and inner < m)."""
    op, _, k = atom
    terms = repl.map
    inner = [a for a, c in terms.items() if c == 1 and isinstance(a, str)]
    for i in inner:
        rest = {a: c for a, c in terms.items() if a != i}
        if len(rest) == 1 and repl.const == 0:
            (outer, m), = rest.items()
            if isinstance(outer, str) and m % k == 0:
                if op == "/":
                    return Lin.of({outer: m // k, ("/", i, k): 1})
                return Lin.of({("%", i, k): 1})
    raise ValueError(f"cannot substitute under {atom}")
