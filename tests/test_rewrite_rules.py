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
    new = rule.apply(graph)
    assert new is not None, f"{rule.name} does not apply to its example {k}"
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
