"""TASO-style rule generation (``rewrite_rules.generator``): a small run finds known identities, verified; the
stored rules are data the generator reproduces; generated rules match and rewrite graphs from the ONNX and
torch frontends and hand-written index notation, preserving what they compute."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from rewrite_rules import EXPLORATION_FAMILIES, RuleNotApplicable, rewrite_greedy
from rewrite_rules.generated import DATA, GENERATED_RULES
from rewrite_rules.generator import generate, read_rules
from rewrite_rules.generator.enumerate import WORLDS
from rewrite_rules.verify import verify_rule
from superopt.builder import GraphBuilder
from superopt.interp import evaluate

BY_MATH = {r.math: r for r in GENERATED_RULES}
SHRINKING = [r for r in GENERATED_RULES if r.family not in EXPLORATION_FAMILIES]


def _feed(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}


def _same_outputs(a, b, feed):
    want, got = evaluate(a, feed, np.float64), evaluate(b, feed, np.float64)
    for o in a.outputs:
        np.testing.assert_allclose(got[o], want[o], rtol=1e-9, atol=1e-9)


def test_a_small_run_finds_known_identities_and_verifies_them():
    t0 = time.perf_counter()
    report = generate(WORLDS[:1], max_ops=3, ops=("add", "mul", "transpose"))
    assert time.perf_counter() - t0 < 20
    found = {r.math: r for r in report.rules}
    for identity in ("A^T^T = A", "(A * B) + (A * C) = A * (B + C)", "A^T + B^T = (A + B)^T"):
        assert identity in found, f"{identity} not generated; got {sorted(found)}"
        assert found[identity].family == "generated" and found[identity].polynomial
    assert not report.failed and report.pruned["renamed_duplicates"] > 0 and report.pruned["trivial"] > 0
    # the stored data came from this generator: the same rules, by name, are in it
    stored = {r.name for r in read_rules(str(DATA))}
    assert {r.name for r in report.rules} <= stored


def test_verification_rejects_a_fingerprint_coincidence():
    # at the fingerprint extents (r <= p) slicing rows [0, r) of concat0(A, X) only reads A; at others it does not
    report = generate(WORLDS[:1], max_ops=3, ops=("matmul", "concat", "slice"))
    assert any("concat0(A, (C @ B))[0:r on axis 0]" in math and "float64 outputs differ" in why
               for math, why in report.failed), report.failed


def test_stored_rules_are_data_with_at_least_fifty_verified_generated_rules():
    doc = json.loads(DATA.read_text())
    rules = read_rules(str(DATA))
    assert len(rules) == len(doc["rules"]) == len(GENERATED_RULES) >= 50
    assert len({r.name for r in rules}) == len(rules)
    for r in rules:
        assert r.family in ("generated", "exploration") and r.math and len(r.bindings) >= 2
        lhs, rhs = len(r.lhs.steps), len(r.rhs.steps)
        assert lhs > rhs if r.family == "generated" else lhs == rhs, r.math
        assert r.polynomial == all(op != "relu" for op in r.lhs.ops() + r.rhs.ops())
    assert sum(r.family == "generated" for r in rules) >= 50


def _onnx_model():
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["a", "b"], ["x"]), helper.make_node("MatMul", ["a", "c"], ["y"]),
             helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Transpose", ["z"], ["t1"], perm=[1, 0]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]), helper.make_node("Relu", ["t2"], ["r"]),
             helper.make_node("Relu", ["r"], ["out"])]
    g = helper.make_graph(nodes, "g", [vi("a", TensorProto.FLOAT, [3, 4]), vi("b", TensorProto.FLOAT, [4, 5]),
                                       vi("c", TensorProto.FLOAT, [4, 5])], [vi("out", TensorProto.FLOAT, [3, 5])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_generated_rules_rewrite_an_onnx_frontend_graph_and_match_onnxruntime():
    import onnxruntime as ort

    from superopt.frontends.onnx_frontend import import_onnx_model

    model = _onnx_model()
    graph = import_onnx_model(model).graph
    for math in ("relu(relu(A)) = relu(A)", "A^T^T = A", "(C @ A) + (C @ B) = C @ (A + B)"):
        assert BY_MATH[math].sites(graph), f"{math} does not match the imported graph"
    rewritten, report = rewrite_greedy(graph, SHRINKING)
    assert len(graph.nodes) == 7 and len(rewritten.nodes) == 3 and report.stop_reason == "no rule applies"
    feed = _feed(graph)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, dict(zip(["a", "b", "c"], [feed[n] for n in graph.inputs])))
    got = evaluate(rewritten, feed, np.float32)[rewritten.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_generated_rules_match_torch_export_and_hand_written_index_notation():
    torch = pytest.importorskip("torch")
    from superopt.api import load_graph

    class Module(torch.nn.Module):
        def forward(self, x, w1, w2):
            return (x @ w1 + x @ w2).t().t()

    graph = load_graph(Module(), (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5)))
    assert BY_MATH["(C @ A) + (C @ B) = C @ (A + B)"].sites(graph) and BY_MATH["A^T^T = A"].sites(graph)

    b = GraphBuilder("hand_written")  # any dimension names, any operand order of a commutative op
    x, y = b.input("x", (2, 6, 3, 3)), b.input("y", (2, 6, 3, 3))
    w = b.input("w", (4, 6, 3, 3))
    conv = "O[n,o,r,s] += X[n,c,r+u-1,s+v-1] * W[o,c,u,v]"
    cx = b.compute1(conv, {"X": x, "W": w}, "cx", padding={"X": 0.0}, extents={"r": 3, "s": 3})
    cy = b.compute1(conv, {"X": y, "W": w}, "cy", padding={"X": 0.0}, extents={"r": 3, "s": 3})
    g = b.build([b.compute1("Z[a,b,c,d] = P[a,b,c,d] + Q[a,b,c,d]", {"P": cy, "Q": cx}, "sum")])
    rule = BY_MATH["conv3x3(B, A) + conv3x3(C, A) = conv3x3((B + C), A)"]
    sites = rule.sites(g)
    assert sites and all(s[0] == "sum" for s in sites)
    site = sites[0]
    new = rule.apply(g, site)
    assert len(new.nodes) == 2
    _same_outputs(g, new, _feed(g))
    with pytest.raises(RuleNotApplicable):
        rule.apply(new, site)


def test_a_generated_rule_leaves_shared_intermediates_and_graph_outputs_alone():
    b = GraphBuilder("shared")
    a = b.input("a", (3, 4))
    t = b.compute1("O[j,i] = X[i,j]", {"X": a}, "t1")
    tt = b.compute1("O[j,i] = X[i,j]", {"X": t}, "t2")
    g = b.build([tt, t])  # the inner transpose is also an output: A^T^T = A must not remove it
    assert not BY_MATH["A^T^T = A"].sites(g)
    g2 = b.build([tt])
    (site,) = BY_MATH["A^T^T = A"].sites(g2)
    new = BY_MATH["A^T^T = A"].apply(g2, site)  # the output keeps its name: a copy of a
    assert new.outputs == g2.outputs and len(new.nodes) == 1
    _same_outputs(g2, new, _feed(g2))


def test_every_generated_rule_passes_the_verifier_at_its_example_extents():
    # (the registry test does this too; here with a second seed on a sample, to keep it cheap)
    for rule in GENERATED_RULES[::25]:
        check = verify_rule(rule, seeds=(1,), field_seeds=(1,))
        assert check.examples >= 2 and check.sites >= check.examples


def test_the_regeneration_command_writes_the_rules(tmp_path):
    out = tmp_path / "rules.json"
    proc = subprocess.run([sys.executable, "-m", "rewrite_rules.generator", "--out", str(out), "--worlds", "reshape",
                           "--max-ops", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rules = read_rules(str(out))
    assert "reshape(flatten(A), p,q) = A" in {r.math for r in rules}
    assert f"wrote {len(rules)} rules" in proc.stdout and "failed verification" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "rewrite_rules.generator", "--out", str(out), "--worlds", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown world(s) ['nope']" in bad.stderr
