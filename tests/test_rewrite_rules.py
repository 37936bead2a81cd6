"""Every registered rewrite rule is machine-verified on its examples (``rewrite_rules.verify``): at every
site, the rewritten graph computes the same outputs as the original in float64 on random inputs and,
for polynomial rules, exactly over a finite field. Planted wrong rules are caught, with a message naming them."""

import numpy as np
import pytest

import rewrite_rules
from rewrite_rules import RULES, Rule, node_named, rewrite_greedy
from rewrite_rules.verify import ModP, RuleVerificationError, evaluate_field, field_inputs, verify_rule
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.inputs import random_inputs

REGISTERED = list(getattr(rewrite_rules, "ALL_RULES", RULES))


@pytest.mark.parametrize("rule", REGISTERED, ids=[r.name for r in REGISTERED])
def test_rule_is_verified_on_every_site_of_its_examples(rule):
    check = verify_rule(rule, seeds=(0,), field_seeds=(0,))
    assert check.sites >= 1 and check.float_evaluations >= check.sites
    assert check.field_evaluations == (check.sites if rule.polynomial else 0)


def test_every_rule_states_its_math_and_has_examples():
    assert RULES
    names = [r.name for r in REGISTERED]
    assert len(set(names)) == len(names), "two rules share a name"
    for rule in REGISTERED:
        assert rule.math and rule.family and rule.examples()


# ---- planted wrong rules --------------------------------------------------------------------------------------------

def _one_node_rule(name: str, src: str, wrong_src: str, shapes: dict[str, tuple[int, ...]], polynomial: bool) -> Rule:
    """A rule that matches the node called ``f`` computing ``src`` and rewrites it to ``wrong_src``."""

    def build(source: str, shape_of: dict[str, tuple[int, ...]]):
        b = GraphBuilder(name)
        ins = {k: b.input(k.lower(), s) for k, s in shape_of.items()}
        return b, b.compute1(source, ins, "f")

    def examples():
        out = []
        for scale in (1, 2):
            b, y = build(src, {k: tuple(d * scale for d in s) for k, s in shapes.items()})
            out.append(b.build([y]))
        return out

    def matches(graph):
        if any(n.name == "f" for n in graph.nodes):
            yield ("f",)

    def apply(graph, site):
        node = node_named(graph, site[0])
        shape_of = {k: graph.type_of[t].shape for k, t in zip(node.op.inputs, node.inputs)}
        b, _ = build(wrong_src, shape_of)
        return graph.replace(nodes=tuple(n if n is not node else node.__class__(
            node.name, b.nodes[0].op, node.inputs, node.outputs) for n in graph.nodes))

    return Rule(name, "planted", f"{src} = {wrong_src} (wrong)", matches, apply, examples, polynomial)


WRONG_DISTRIBUTION = _one_node_rule("planted_wrong_distribution", "O[i,j] = A[i,j] * (B[i,j] + C[i,j])",
                                    "O[i,j] = A[i,j] * B[i,j] + C[i,j]", {"A": (3, 4), "B": (3, 4), "C": (3, 4)}, True)
DROPPED_TRANSPOSE = _one_node_rule("planted_dropped_transpose", "O[i,j] += A[k,i] * B[k,j]",
                                   "O[i,j] += A[i,k] * B[k,j]", {"A": (3, 3), "B": (3, 4)}, True)
# off by 1e-12 of C: below any float tolerance, but a different polynomial
TINY_ERROR = _one_node_rule("planted_tiny_error", "O[i,j] = A[i,j] + B[i,j] + C[i,j] * 0.0",
                            "O[i,j] = A[i,j] + B[i,j] + C[i,j] * 1e-12",
                            {"A": (2, 3), "B": (2, 3), "C": (2, 3)}, True)


@pytest.mark.parametrize("rule", [WRONG_DISTRIBUTION, DROPPED_TRANSPOSE], ids=lambda r: r.name)
@pytest.mark.parametrize("check", ["float64", "field"])
def test_a_planted_wrong_rule_is_caught_naming_it(rule, check):
    with pytest.raises(RuleVerificationError) as err:
        verify_rule(rule, checks=(check,))
    msg = str(err.value)
    assert "\n" not in msg and rule.name in msg and "example 0" in msg and "site ('f',)" in msg
    assert ("float64 outputs differ" in msg and "max error" in msg) if check == "float64" else "finite-field" in msg


def test_an_error_below_float_tolerance_is_caught_exactly_over_the_field():
    verify_rule(TINY_ERROR, checks=("float64",))  # rounding hides it
    with pytest.raises(RuleVerificationError, match="planted_tiny_error.*finite-field"):
        verify_rule(TINY_ERROR, checks=("field",))


def test_the_field_check_treats_non_polynomial_ops_as_uninterpreted_functions():
    # tanh and relu are deterministic but arbitrary functions over the field: a rule moving data around them passes,
    # dropping one fails (float64 agrees on both)
    reordered = _one_node_rule("planted_reordered", "O[i,j] = tanh(A[j,i]) + relu(B[i,j])",
                               "O[i,j] = relu(B[i,j]) + tanh(A[j,i])", {"A": (3, 2), "B": (2, 3)}, True)
    assert verify_rule(reordered).field_evaluations == 2
    dropped = _one_node_rule("planted_dropped_relu", "O[i,j] = relu(A[i,j]) + B[i,j]", "O[i,j] = A[i,j] + B[i,j]",
                             {"A": (2, 3), "B": (2, 3)}, True)
    with pytest.raises(RuleVerificationError, match="planted_dropped_relu.*finite-field check failed"):
        verify_rule(dropped, checks=("field",))


def test_a_rule_that_changes_nothing_or_the_interface_is_refused():
    same = Rule("planted_identity", "planted", "x = x", WRONG_DISTRIBUTION.matches, lambda g, s: g,
                WRONG_DISTRIBUTION.examples, True)
    with pytest.raises(RuleVerificationError, match="planted_identity.*changed nothing"):
        verify_rule(same)
    renamed = Rule("planted_renamed_output", "planted", "x = x", WRONG_DISTRIBUTION.matches,
                   lambda g, s: g.replace(outputs=g.inputs[:1]), WRONG_DISTRIBUTION.examples, True)
    with pytest.raises(RuleVerificationError, match="planted_renamed_output.*outputs changed"):
        verify_rule(renamed)


def test_field_evaluation_is_exact_modular_arithmetic():
    b = GraphBuilder("mm")
    x, w = b.input("x", (2, 3)), b.input("w", (3, 2))
    g = b.build([b.compute1("O[i,j] += X[i,k] * W[k,j] * 0.5", {"X": x, "W": w}, "mm")])
    feed = field_inputs(g, 0)
    (out,) = evaluate_field(g, feed).values()
    p = 2 ** 61 - 1
    want = (np.array(feed["x"].tolist(), dtype=object) @ np.array(feed["w"].tolist(), dtype=object)) * pow(2, -1, p) % p
    assert [[ModP.of(v).v for v in row] for row in out] == [[int(v) for v in row] for row in want]


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
