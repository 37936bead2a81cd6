"""Knobs: the numeric and boolean parameters of a sketch, named by role so they stay stable.

A sketch builder asks ``knobs.get("C.rows", heuristic_value, domain)`` for each parameter it needs.
The name is the stage and the role of the parameter (never a loop name), so changing one knob never
invalidates another. With no overrides the builder produces the default heuristic's trace, and the
recorder collects every knob it asked for with its domain: that is the sketch's parameter space.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KnobRecorder:
    """Answers knob queries from ``overrides`` (falling back to the heuristic's value) and records
    what was asked: ``used`` (name -> value) and ``domains`` (name -> tuple of legal values)."""

    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.used: dict[str, Any] = {}
        self.domains: dict[str, tuple] = {}

    def get(self, name: str, default: Any, domain: tuple | list) -> Any:
        dom = tuple(dict.fromkeys(domain))  # ordered, unique
        if default not in dom:
            dom = (default, *dom)
        value = self.overrides.get(name, default)
        self.used[name] = value
        self.domains[name] = dom
        return value


def divisor_like(n: int, lo: int, hi: int, step: int = 1) -> list[int]:
    """Candidate tile sizes in [lo, hi] that are multiples of ``step``: the divisors of n first, then powers of two."""
    out = [d for d in range(max(step, lo), min(n, hi) + 1, step) if n % d == 0]
    p = max(step, 1)
    while p <= min(n, hi):
        if p >= lo:
            out.append(p)
        p *= 2
    return sorted(set(out))
