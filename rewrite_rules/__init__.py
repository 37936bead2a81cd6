"""Graph rewrite rules as named data, one module per family.

A rule is a function from a Graph to a rewritten Graph (one rewrite, at the first place it
matches) or None, plus the one line of math it states and a few example graphs it applies to.
``tests/test_rewrite_rules.py`` walks :data:`RULES` and checks every rule on its examples for
numeric equivalence with the reference interpreter, so no rule goes untested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from superopt.ir.graph import Graph


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    math: str  # what the rule states, in one line
    apply: Callable[[Graph], Graph | None] = field(repr=False)
    examples: Callable[[], list[Graph]] = field(repr=False)


@dataclass(frozen=True)
class RewriteReport:
    applied: tuple[str, ...]  # rule names, in order
    stop_reason: str


def fresh_name(base: str, used: set[str]) -> str:
    """``base``, or ``base2``, ``base3``... whichever ``used`` lacks first; the name is added to ``used``."""
    name, k = base, 2
    while name in used:
        name, k = f"{base}{k}", k + 1
    used.add(name)
    return name


def rewrite_greedy(graph: Graph, rules: Sequence[Rule], max_steps: int = 10_000) -> tuple[Graph, RewriteReport]:
    """Apply the rules, first match first, until none applies (every rule here shrinks the graph)."""
    applied: list[str] = []
    for _ in range(max_steps):
        for rule in rules:
            new = rule.apply(graph)
            if new is not None:
                graph = new
                applied.append(rule.name)
                break
        else:
            return graph, RewriteReport(tuple(applied), "no rule applies")
    return graph, RewriteReport(tuple(applied), f"step budget of {max_steps} spent")


def _registry() -> list[Rule]:
    from rewrite_rules import algebraic, fusion, layout

    return [*algebraic.RULES, *fusion.RULES, *layout.RULES]


RULES: list[Rule] = _registry()

__all__ = ["RULES", "Rule", "RewriteReport", "fresh_name", "rewrite_greedy"]
