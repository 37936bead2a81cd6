"""Every registered rewrite rule, on every one of its examples: it applies, and the rewritten graph
computes the same outputs as the original (reference interpreter, float64, random inputs)."""

import numpy as np
import pytest

from rewrite_rules import RULES, rewrite_greedy
from superopt.api import random_inputs
from superopt.interp import evaluate

CASES = [(rule, k) for rule in RULES for k in range(len(rule.examples()))]


@pytest.mark.parametrize("rule,k", CASES, ids=[f"{r.name}-{k}" for r, k in CASES])
def test_rule_preserves_semantics(rule, k):
    graph = rule.examples()[k]
    sites = rule.sites(graph)
    assert sites, f"{rule.name} does not match its example {k}"
    new = rule.apply(graph, sites[0])
    assert new.digest() != graph.digest()
    feed = random_inputs(graph, seed=k)
    want = evaluate(graph, feed, np.float64)
    got = evaluate(new, feed, np.float64)
    for o in graph.outputs:  # exact in real arithmetic; a precomputed constant is stored in float32
        scale = float(np.abs(want[o]).max(initial=1.0))
        np.testing.assert_allclose(got[o], want[o], rtol=1e-6, atol=1e-6 * scale)


def test_every_rule_states_its_math_and_has_examples():
    assert RULES
    for rule in RULES:
        assert rule.math and rule.family and rule.examples()


def test_greedy_rewrite_fuses_the_resnet_tail_into_one_op():
    from rewrite_rules.fusion import FUSE_ELEMENTWISE

    graph = FUSE_ELEMENTWISE.examples()[0]
    fused, report = rewrite_greedy(graph, RULES)
    assert len(graph.nodes) == 3 and len(fused.nodes) == 1
    assert report.applied.count("fuse_elementwise_into_producer") == 2 and report.stop_reason == "no rule applies"
    feed = random_inputs(graph)
    np.testing.assert_allclose(evaluate(fused, feed, np.float64)[graph.outputs[0]],
                               evaluate(graph, feed, np.float64)[graph.outputs[0]], rtol=1e-12)


def test_apply_at_a_stale_site_is_refused():
    from rewrite_rules import RuleNotApplicable
    from rewrite_rules.fusion import FUSE_ELEMENTWISE

    graph = FUSE_ELEMENTWISE.examples()[0]
    site = FUSE_ELEMENTWISE.sites(graph)[0]
    new = FUSE_ELEMENTWISE.apply(graph, site)
    with pytest.raises(RuleNotApplicable):
        FUSE_ELEMENTWISE.apply(new, site)


def test_graph_digest_ignores_names_and_independent_order_but_not_structure():
    from superopt.builder import GraphBuilder
    from superopt.ir.canonical import graph_digest

    def build(names, swap=False, op="+"):
        b = GraphBuilder(names[0])
        x = b.input(names[1], (3, 4))
        fs = [lambda: b.compute1("O[i,j] = tanh(X[i,j])", {"X": x}, names[2]),
              lambda: b.compute1("P[a,c] = exp(Y[a,c])", {"Y": x}, names[3])]
        u, v = (fs[1](), fs[0]()) if swap else (fs[0](), fs[1]())
        if swap:
            u, v = v, u
        return b.build([b.compute1(f"O[i,j] = A[i,j] {op} B[i,j]", {"A": u, "B": v}, "add")])

    g = build(["g", "x", "t", "e"])
    assert graph_digest(g) == graph_digest(build(["other", "inp", "th", "ex"], swap=True))
    assert graph_digest(g) != graph_digest(build(["g", "x", "t", "e"], op="*"))
