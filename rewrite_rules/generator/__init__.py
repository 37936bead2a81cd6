"""TASO-style rule generation: enumerate small op programs, fingerprint, pair, verify, prune, store as data.

Pipeline (:func:`generate`):

1. :mod:`.enumerate` - per *world* (matrix: matmul/add/mul/relu/transpose/concat/slice over 2-D inputs;
   conv: 3x3 conv/add/relu/concat over NCHW inputs and OIHW weights; conv_bias / conv_same: same-padded
   convs of any odd kernel with / without bias; batched: 3-D activations by 2-D weights, per-column bias;
   columns; reshape: flatten/unflatten with add/mul/relu/transpose), every program of up to 3 ops built
   from representatives, fingerprinted on
   random inputs (float64, plus exact residues for polynomial programs);
2. :mod:`.prune` - fingerprint-equal pairs become oriented candidate rules; trivial ones, unmatchable
   ones, renamed duplicates and instances of more general rules are dropped;
2b. :mod:`.multi` - from rules whose one side concatenates two siblings (same ops, own inputs): multi-output
   merges (n = 2, 3 siblings sharing an input = one op over concatenated inputs, then a split; also with a
   1x1-to-3x3 kernel enlargement, and followed by an op that commutes with the concat, as a bias add) and the
   rule for an n-ary concat (n = 3, 4);
3. verification - each candidate becomes a :class:`~rewrite_rules.Rule` (:mod:`.match`: it matches
   real graphs by recognising nodes as core ops) and must pass :func:`rewrite_rules.verify.verify_rule`
   on its examples (the left side built at two or three extents) in float64 and over the finite field;
4. the survivors are written as JSON (:mod:`.pattern`), loaded by ``rewrite_rules.generated``.

Regenerate with ``python -m rewrite_rules.generator --out rewrite_rules/generated.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from rewrite_rules.generator.enumerate import WORLDS, World, enumerate_world
from rewrite_rules.generator.match import make_rule
from rewrite_rules.generator.multi import Distributor, distributors, merge_rules, through
from rewrite_rules.generator.pattern import RuleData
from rewrite_rules.generator.prune import candidates, rule_data


@dataclass
class GenerationReport:
    rules: list[RuleData]
    terms: int = 0
    pairs: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (math, why) of candidates that failed verification
    seconds: float = 0.0

    def summary(self) -> str:
        fam: dict[str, int] = {}
        for r in self.rules:
            fam[r.family] = fam.get(r.family, 0) + 1
        pruned = ", ".join(f"{k} {v}" for k, v in self.pruned.items())
        return (f"{self.terms} programs enumerated, {self.pairs} fingerprint-equal pairs; pruned: {pruned}; "
                f"{len(self.failed)} failed verification; kept {len(self.rules)} ({fam}) in {self.seconds:.1f} s")


def generate(worlds: tuple[World, ...] = WORLDS, max_ops: int | None = None, ops: tuple[str, ...] | None = None,
             verify: bool = True) -> GenerationReport:
    """Run the pipeline; ``max_ops`` and ``ops`` restrict the enumeration (for a quick subset)."""
    from rewrite_rules.verify import RuleVerificationError, verify_rule

    t0 = time.perf_counter()
    report = GenerationReport([])
    seen: set[str] = set()
    dists: list[Distributor] = []

    def keep(data) -> None:
        """Add the rule to the report when it verifies (with ``verify``), else record its failure."""
        if verify:
            try:
                verify_rule(make_rule(data), seeds=(0,), field_seeds=(0,))
            except RuleVerificationError as err:
                report.failed.append((data.math, str(err)))
                return
        report.rules.append(data)

    for world in worlds:
        e = enumerate_world(world, max_ops=max_ops, ops=ops)
        report.terms += len(e.terms)
        report.pairs += len(e.pairs)
        kept, stats = candidates(e)
        dists += distributors(world, kept)
        for k, v in stats.items():
            if k != "pairs":
                report.pruned[k] = report.pruned.get(k, 0) + v
        for data in [rule_data(c) for c in kept] + merge_rules(world, kept):
            key = json.dumps([data.to_json()[k] for k in ("inputs", "lhs", "rhs")])
            if key in seen:
                report.pruned["same_rule_in_another_world"] = report.pruned.get("same_rule_in_another_world", 0) + 1
                continue
            seen.add(key)
            keep(data)
    # merges followed by a per-sibling op that commutes with the concat (biases): across worlds
    merges = [r for r in report.rules if len(r.lhs.outputs) > 1]
    for d in sorted(set(dists), key=repr):
        for m in merges:
            data = through(m, d)
            if data is not None:
                keep(data)
    report.seconds = time.perf_counter() - t0
    return report


def write_rules(rules: list[RuleData], path: str) -> None:
    doc = {"about": "Rewrite rules generated by `python -m rewrite_rules.generator` (TASO-style: enumerated, "
                    "fingerprinted, verified, pruned). Do not edit by hand; regenerate.",
           "rules": [r.to_json() for r in rules]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def read_rules(path: str) -> list[RuleData]:
    with open(path) as f:
        return [RuleData.from_json(d) for d in json.load(f)["rules"]]


__all__ = ["GenerationReport", "generate", "read_rules", "write_rules"]
