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
    merges = 0
    for r in rules:
        assert r.family in ("generated", "exploration") and r.math and len(r.bindings) >= 2
        lhs, rhs = len(r.lhs.steps), len(r.rhs.steps)
        if len(r.lhs.outputs) > 1:  # a merge: one op over concatenated inputs, an output sliced per sibling
            merges += 1
            assert r.family == "exploration" and len(r.rhs.outputs) == len(r.lhs.outputs) <= lhs, r.math
            assert all(r.rhs.step_of[o].op == "slice" for o in r.rhs.outputs), r.math
        else:
            assert lhs > rhs if r.family == "generated" else lhs == rhs, r.math
        assert r.polynomial == all(op != "relu" for op in r.lhs.ops() + r.rhs.ops())
    assert sum(r.family == "generated" for r in rules) >= 50 and merges >= 20


def test_merge_and_n_ary_rules_are_derived_from_sibling_concats_verified_and_reproducible():
    worlds = {w.name: w for w in WORLDS}
    t0 = time.perf_counter()
    report = generate((worlds["conv_bias"], worlds["batched"]), ops=("convb", "matmul", "concat"))
    again = generate((worlds["batched"],), ops=("matmul", "concat"), verify=False)
    assert time.perf_counter() - t0 < 30
    found = {r.math: r for r in report.rules}
    for math in ("(convb(X, W0, B0), convb(X, W1, B1)) = split1(convb(X, concat0(W0, W1), concat0(B0, B1)), [o, o1])",
                 "(X @ W0, X @ W1, X @ W2) = split2(X @ concat1(W0, W1, W2), [r, r1, r2])",
                 "concat1(convb(X, W0, B0), convb(X, W1, B1), convb(X, W2, B2)) = "
                 "convb(X, concat0(W0, W1, W2), concat0(B0, B1, B2))"):
        assert math in found, f"{math} not generated; got {sorted(found)}"
    assert not report.failed
    stored = {r.name: r.to_json() for r in read_rules(str(DATA))}
    assert all(stored.get(r.name) == r.to_json() for r in report.rules)  # the stored data is this generator's
    batched = [r.to_json() for r in report.rules if r.inputs[0][1] == ("b", "p", "q")]
    assert batched and all(r.to_json() in batched for r in again.rules if r.inputs[0][1] == ("b", "p", "q"))


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

    class Batched(torch.nn.Module):  # batched matmul against a transposed batch, transposed back
        def forward(self, q, k):
            return (q @ k.transpose(-1, -2)).transpose(-1, -2)

    graph = load_graph(Batched(), (torch.randn(2, 3, 4), torch.randn(2, 3, 4)))  # (the rule: A, B of one shape)
    rule = BY_MATH["(A @ B^T(last two))^T(last two) = B @ A^T(last two)"]
    (site,) = rule.sites(graph)
    _same_outputs(graph, rule.apply(graph, site), _feed(graph))

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


# ---- real model graphs: the generated rules find the sites that matter -------------------------------------------

def _fragment(graph, first: str, last: str):
    """The nodes from ``first`` to ``last`` (graph order) as a graph of their own: what they read is its input."""
    from superopt.ir.graph import Graph

    names = [n.name for n in graph.nodes]
    nodes = graph.nodes[names.index(first): names.index(last) + 1]
    made = {o for n in nodes for o in n.outputs}
    read = {i for n in nodes for i in n.inputs}
    inputs = tuple(sorted(read - made - set(graph.constant)))
    outputs = tuple(sorted(o for o in made if not any(o in n.inputs for n in nodes)))
    keep = read | made
    return Graph(inputs, outputs, nodes, tuple((n, t) for n, t in graph.types if n in keep),
                 tuple((n, c) for n, c in graph.constants if n in read), f"{graph.name}_{first}")


def _merge_sites(graph):
    """{frozenset of merged nodes: (rule, site)} for the generated merge rules."""
    out = {}
    for r in GENERATED_RULES:
        if r.name.startswith("gen_merge_"):
            k = next(len(d.lhs.outputs) for d in read_rules(str(DATA)) if d.name == r.name)
            for site in r.sites(graph):
                out[frozenset(site[:k])] = (r, site)
    return out


def test_generated_rules_match_inception_v1_as_imported_and_keep_what_it_computes():
    from rewrite_rules.merging import MERGE_PARALLEL
    from superopt.api import load_graph
    from superopt.frontends.light_models import randomized_light_model
    from superopt.ir.prune import prune_graph

    graph = prune_graph(load_graph(randomized_light_model("inception_v1")))
    merges = _merge_sites(graph)
    triples = [k for k in merges if len(k) == 3]
    assert len(triples) == 9 and len(merges) == 9 + 3 * 9  # per module: its three 1x1 convs, and each pair of them
    for roots in triples:  # 1x1 convs with a bias reading one tensor
        nodes = [n for n in graph.nodes if n.name in roots]
        assert len({n.inputs[0] for n in nodes}) == 1 and all(graph.type_of[n.inputs[1]].shape[2:] == (1, 1) for n in nodes)
    assert {frozenset(s) for s in MERGE_PARALLEL.sites(graph)} <= set(merges)  # the hand-written merge's sites too
    nary = BY_MATH["concat1(relu(X0), relu(X1), relu(X2), relu(X3)) = relu(concat1(X0, X1, X2, X3))"]
    assert len(nary.sites(graph)) == 9  # each module's four-way concat of ReLUs
    # one inception module (3a) rewritten by both, against the original, float64
    frag = _fragment(graph, "conv_14", "concat")
    rule, site = merges[frozenset(("conv_14", "conv_18", "conv_26"))]
    merged = rule.apply(frag, site)
    (nsite,) = nary.sites(merged)
    new = nary.apply(merged, nsite)
    assert sum(n.name.startswith("conv") for n in new.nodes) == sum(n.name.startswith("conv") for n in frag.nodes) - 2
    assert len(frag.constants) + 2 == len(new.constants)  # the merged weights and biases: folded constants
    _same_outputs(frag, new, _feed(frag))


def test_generated_rules_merge_the_bert_encoders_q_k_v_projections_matching_onnxruntime():
    pytest.importorskip("torch")
    from rewrite_rules.merging import MERGE_PARALLEL
    from superopt.api import load_graph
    from superopt.ir.prune import prune_graph
    from superopt.testing.exported_models import export_model, ort_session

    model, feed = export_model("bert_encoder")
    graph = prune_graph(load_graph(model))
    merges = _merge_sites(graph)
    # Q/K/V: the triple and the 3 pairs, as matmuls and as matmuls with their bias adds
    assert len(merges) == 8 and frozenset(("matmul", "matmul_2", "matmul_8")) in merges
    assert {frozenset(s) for s in MERGE_PARALLEL.sites(graph)} <= set(merges)  # the hand-written merge's sites too
    rule, site = merges[frozenset(("add", "add_4", "add_10"))]
    assert rule.math.startswith("(addb((X @ W0), Z0), addb((X @ W1), Z1), addb((X @ W2), Z2)) = ")
    new = rule.apply(graph, site)
    assert sum(n.name.startswith("matmul") for n in new.nodes) == sum(n.name.startswith("matmul") for n in graph.nodes) - 2
    assert sum(n.name.startswith("add") for n in new.nodes) == sum(n.name.startswith("add") for n in graph.nodes) - 2
    x = {graph.inputs[0]: next(iter(feed.values()))}
    _same_outputs(graph, new, x)
    (want,) = ort_session(model).run(None, {k: v for k, v in feed.items()})
    got = evaluate(new, x, np.float64)[new.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_generated_merge_of_a_1x1_and_a_3x3_conv_matches_squeezenets_fire_modules():
    from superopt.api import load_graph
    from superopt.frontends.light_models import randomized_light_model
    from superopt.ir.prune import prune_graph

    graph = prune_graph(load_graph(randomized_light_model("squeezenet")))
    rule = BY_MATH["(convb(X, W0, B0), convb(X, W1, B1)) = "
                   "split1(convb(X, concat0(enlarge(W0), W1), concat0(B0, B1)), [o, o1])"]
    sites = rule.sites(graph)
    assert len(sites) == 8  # each fire module's expand 1x1 and expand 3x3 over the squeeze output
    frag = _fragment(graph, "conv_6", "concat")  # fire2's expand convs, ReLUs and concat
    (site,) = rule.sites(frag)
    new = rule.apply(frag, site)
    merged = [n for n in new.nodes if n.name.startswith("conv")]
    assert len(merged) == 1 and new.type_of[merged[0].inputs[1]].shape[2:] == (3, 3)  # the 1x1 kernel enlarged
    _same_outputs(frag, new, _feed(frag))


def test_a_merge_with_its_slices_swapped_is_caught_by_the_verifier():
    from dataclasses import replace

    from rewrite_rules.generator.match import make_rule
    from rewrite_rules.verify import RuleVerificationError

    data = next(r for r in read_rules(str(DATA)) if r.math.startswith("(X @ W0, X @ W1) = split2("))
    verify_rule(make_rule(data), seeds=(0,), field_seeds=(0,))
    swapped = replace(data, name="planted_swapped_merge", rhs=replace(data.rhs, outputs=data.rhs.outputs[::-1]))
    with pytest.raises((RuleVerificationError, RuleNotApplicable), match="planted_swapped_merge"):
        verify_rule(make_rule(swapped), seeds=(0,), field_seeds=(0,))
