"""Seconds per pipeline phase: one :class:`PhaseTimer` is passed down the passes of one ``optimize``.

Phases nest (code generation and C compilation run inside the build): the clock of the enclosing phase
pauses while an inner one runs, and the bookkeeping between phases is charged to ``other``, so every
second since the timer was made is charged to exactly one phase and the phases sum to the span.
A leaf module (the standard library only): every layer may take a timer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# the phases of ``superopt.optimize``, in pipeline order (a report lists them in this order, then any other)
OTHER = "other"  # the time outside every named phase
PHASES = ("load", "rewrite", "ceilings", "schedule", "codegen", "compile", "build", "verify", "cache", OTHER)


class PhaseTimer:
    """Wall seconds per phase (exclusive of the phases nested in it) and counters (kernels compiled)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._stack: list[str] = []
        self._mark = time.perf_counter()

    def _charge(self, now: float) -> None:
        top = self._stack[-1] if self._stack else OTHER
        self.seconds[top] = self.seconds.get(top, 0.0) + (now - self._mark)
        self._mark = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._charge(time.perf_counter())
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge(time.perf_counter())
            self._stack.pop()

    def add(self, counter: str, n: int = 1) -> None:
        self.counts[counter] = self.counts.get(counter, 0) + n

    @property
    def total_s(self) -> float:
        """Seconds charged so far (up to the last phase boundary or :meth:`ordered`)."""
        return sum(self.seconds.values())

    def ordered(self) -> dict[str, float]:
        """Seconds by phase up to now, in pipeline order; they sum to :attr:`total_s`."""
        self._charge(time.perf_counter())
        known = [p for p in PHASES if p in self.seconds]
        return {p: self.seconds[p] for p in known + sorted(set(self.seconds) - set(PHASES))}

    def line(self) -> str:
        """``load 0.41s, rewrite 1.20s, ...``"""
        return ", ".join(f"{p} {s:.2f}s" for p, s in self.ordered().items())


@contextmanager
def phase(timer: PhaseTimer | None, name: str) -> Iterator[None]:
    """``timer.phase(name)``, or nothing when no timer is given."""
    if timer is None:
        yield
    else:
        with timer.phase(name):
            yield
