"""Generated rewrite rules (TASO-style), loaded from ``generated.json`` as :class:`~rewrite_rules.Rule` s.

The data is written by ``python -m rewrite_rules.generator --out rewrite_rules/generated.json`` (see
:mod:`rewrite_rules.generator`): each rule's two sides are small op programs over inputs with symbolic
shapes. A loaded rule matches any graph whose nodes compute those ops as the op functions of
:mod:`superopt.ops` build them (ONNX and torch frontends, GraphBuilder index notation alike), binds
the symbolic extents from the matched tensors, and builds its right-hand side with the same op
functions. Family ``generated`` rules shrink the graph (fewer ops); family ``exploration`` rules
rewrite to an equal-size alternative (for search, never for :func:`~rewrite_rules.rewrite_greedy`).
"""

from __future__ import annotations

from pathlib import Path

from rewrite_rules import Rule
from rewrite_rules.generator import read_rules
from rewrite_rules.generator.match import make_rule

DATA = Path(__file__).with_name("generated.json")


def load(path: Path = DATA) -> list[Rule]:
    return [make_rule(d) for d in read_rules(str(path))]


GENERATED_RULES: list[Rule] = load()

__all__ = ["DATA", "GENERATED_RULES", "load"]
