"""Graph rewrite rules as named data, one module per family, driven by any search.

A :class:`Rule` offers ``matches(graph)``, yielding the *sites* where it applies (hashable tuples
of plain values: node names, indices), and ``apply(graph, site)``, returning the rewritten graph
(or raising :class:`RuleNotApplicable` when the site no longer matches). It also carries the one
line of math it states and a few example graphs it applies to. ``polynomial`` marks rules whose
touched ops are polynomial (+, -, *, sums, constants): they are also checked exactly over a
finite field. ``tests/test_rewrite_rules.py`` verifies every registered rule on its examples.

Drivers: :func:`rewrite_greedy` (first site of the first rule that matches, to a fixed point);
the graph search in ``search/graph/search.py`` explores alternatives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from superopt.ir.graph import Graph

Site = tuple[Hashable, ...]


class RuleNotApplicable(ValueError):
    """``apply`` was given a site where the rule does not (or no longer) match."""


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    math: str  # what the rule states, in one line
    matches: Callable[[Graph], Iterator[Site]] = field(repr=False)
    apply: Callable[[Graph, Site], Graph] = field(repr=False)
    examples: Callable[[], list[Graph]] = field(repr=False)
    polynomial: bool = False  # every op the rule touches is polynomial: checkable exactly over a finite field

    def sites(self, graph: Graph) -> list[Site]:
        return list(self.matches(graph))

    def first(self, graph: Graph) -> Graph | None:
        """The graph rewritten at the first site, or None when the rule matches nowhere."""
        for site in self.matches(graph):
            try:
                return self.apply(graph, site)
            except RuleNotApplicable:
                continue
        return None


@dataclass(frozen=True)
class RewriteReport:
    applied: tuple[str, ...]  # rule names, in order
    stop_reason: str


# families whose rules grow the graph or undo each other (a layout conversion and its inverse): moves
# for the graph search only, never given to a greedy driver (which would not terminate or would undo itself)
EXPLORATION_FAMILIES: tuple[str, ...] = ("layout_choice", "exploration", "algorithm", "layout_pass")
# families applied as passes of their own after the layout choice, not by the graph search (their sites, blocked
# convs, exist only then): ``search.graph.rewrite.search_rewrites``
PASS_FAMILIES: tuple[str, ...] = ("algorithm", "layout_pass")  # layout_pass: inside search.graph.layout


def fresh_name(base: str, used: set[str]) -> str:
    """``base``, or ``base2``, ``base3``... whichever ``used`` lacks first; the name is added to ``used``."""
    name, k = base, 2
    while name in used:
        name, k = f"{base}{k}", k + 1
    used.add(name)
    return name


def rewrite_greedy(graph: Graph, rules: Sequence[Rule], max_steps: int = 10_000) -> tuple[Graph, RewriteReport]:
    """Apply the rules, first site of the first matching rule first, until none applies (every
    rule given to this driver must shrink the graph by some measure, or it may not terminate: rules of
    :data:`EXPLORATION_FAMILIES`, which do not, are left out here)."""
    rules = [r for r in rules if r.family not in EXPLORATION_FAMILIES]
    applied: list[str] = []
    for _ in range(max_steps):
        for rule in rules:
            new = rule.first(graph)
            if new is not None:
                graph = new
                applied.append(rule.name)
                break
        else:
            return graph, RewriteReport(tuple(applied), "no rule applies")
    return graph, RewriteReport(tuple(applied), f"step budget of {max_steps} spent")


def node_named(graph: Graph, name: str):
    """The node called ``name``; :class:`RuleNotApplicable` when the graph has none."""
    for n in graph.nodes:
        if n.name == name:
            return n
    raise RuleNotApplicable(f"no node named {name!r}")


def _registry() -> list[Rule]:
    from rewrite_rules import (
        algebraic,
        dim_merge,
        folding,
        fusion,
        grouped_conv,
        layout,
        layout_choice,
        merging,
        moments,
        movement,
        pixel_merge,
        reshape_fusion,
        vertical_fusion,
        winograd,
    )

    return [*algebraic.RULES, *fusion.RULES, *layout.RULES, *folding.RULES, *merging.RULES, *movement.RULES,
            *layout_choice.RULES, *grouped_conv.RULES, *pixel_merge.RULES, *dim_merge.RULES, *reshape_fusion.RULES,
            *vertical_fusion.RULES, *winograd.RULES, *moments.RULES]


RULES: list[Rule] = _registry()


def __getattr__(name: str):  # ALL_RULES = RULES + GENERATED_RULES (rewrite_rules/generated.json), loaded on first use
    if name == "ALL_RULES":
        from rewrite_rules.generated import GENERATED_RULES

        globals()["ALL_RULES"] = [*RULES, *GENERATED_RULES]
        return globals()["ALL_RULES"]
    raise AttributeError(f"module 'rewrite_rules' has no attribute {name!r}")

__all__ = ["EXPLORATION_FAMILIES", "PASS_FAMILIES", "RULES", "Rule", "RuleNotApplicable", "RewriteReport", "Site", "fresh_name",
           "node_named", "rewrite_greedy"]
