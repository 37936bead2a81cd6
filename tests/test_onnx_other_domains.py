"""Ops of other ONNX domains lowered natively (ai.onnx.preview FlexAttention, ai.onnx.preview.training optimizers,
ai.onnx.ml Binarizer/ArrayFeatureExtractor), the Optional ops over tensors, and MeanVarianceNormalization at its
default axes; each compiled and compared with onnx.reference on cases the conformance tests do not cover."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import superopt.backend as backend
from superopt.frontends.onnx_frontend import import_onnx_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, domains=(), inits=(), opset=26):
    g = helper.make_graph(nodes, "dom", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops)


def _check(m, feed, mode="compiled", rtol=1e-5, atol=1e-6):
    got = backend.prepare(m, mode=mode).run(feed)
    want = ReferenceEvaluator(m).run(None, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("op, states, attrs", [
    ("Adagrad", 1, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.0}),
    ("Adam", 2, {"alpha": 0.9, "beta": 0.99, "epsilon": 1e-4, "norm_coefficient": 0.01, "norm_coefficient_post": 0.1}),
])
def test_training_optimizers_two_tensors(op, states, attrs, t):
    """Two updated tensors of different shapes; T = 0 takes the first-update branches (Momentum's beta,
    Adam's bias correction)."""
    shapes = [(3,), (2, 2)]
    names = ["R", "T"] + [f"{k}{i}" for k in ["X", "G", "V", "H"][:2 + states] for i in range(2)]
    outs = [f"{k}{i}_new" for k in ["X", "V", "H"][:1 + states] for i in range(2)]
    node = helper.make_node(op, names, outs, domain="ai.onnx.preview.training", **attrs)
    inputs = [("R", F, ()), ("T", TensorProto.INT64, ())] + [(n, F, shapes[int(n[-1])]) for n in names[2:]]
    m = _model([node], inputs, [(o, F, shapes[int(o[1])]) for o in outs], ["ai.onnx.preview.training"])
    feed = {"R": np.array(0.1, np.float32), "T": np.array(t, np.int64)}
    for n in names[2:]:
        v = _f(*shapes[int(n[-1])])
        feed[n] = np.abs(v) if n[0] == "H" else v  # accumulated squares are not negative
    _check(m, feed)


def test_binarizer_and_array_feature_extractor_of_a_vector():
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.25)
    m = _model([node], [("x", F, (2, 5))], [("y", F, (2, 5))], ["ai.onnx.ml"])
    _check(m, {"x": _f(2, 5)})
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    m = _model([node], [("x", F, (5,)), ("i", TensorProto.INT64, (3,))], [("y", F, None)], ["ai.onnx.ml"])
    (y,) = _check(m, {"x": _f(5), "i": np.array([4, 0, 4], np.int64)})
    assert y.shape == (1, 3)  # a vector gives one row


def test_flex_attention_gqa_with_both_modifiers_in_double():
    """Six query heads over two K/V heads, a causal score_mod reading the scores' shape, a prob_mod weighing the
    probabilities by a tensor of its own, an explicit scale, float64 throughout."""
    d = TensorProto.DOUBLE
    zero, one = numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one")
    ninf = numpy_helper.from_array(np.array(-np.inf), "ninf")
    score = helper.make_graph(
        [helper.make_node("Shape", ["s"], ["sh"]),
         helper.make_node("Gather", ["sh", "two"], ["L"], axis=0), helper.make_node("Gather", ["sh", "three"], ["S"], axis=0),
         helper.make_node("Range", ["zero", "L", "one"], ["qi"]), helper.make_node("Range", ["zero", "S", "one"], ["ki"]),
         helper.make_node("Unsqueeze", ["qi", "ax1"], ["q2"]),
         helper.make_node("GreaterOrEqual", ["q2", "ki"], ["mask"]), helper.make_node("Where", ["mask", "s", "ninf"], ["so"])],
        "causal", [helper.make_tensor_value_info("s", d, None)], [helper.make_tensor_value_info("so", d, None)],
        [zero, one, ninf, numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array(3, np.int64), "three"), numpy_helper.from_array(np.array([1], np.int64), "ax1")])
    prob = helper.make_graph([helper.make_node("Mul", ["p", "w"], ["po"])], "weigh",
                             [helper.make_tensor_value_info("p", d, None)], [helper.make_tensor_value_info("po", d, None)],
                             [numpy_helper.from_array(RNG.random((4, 5)), "w")])
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain="ai.onnx.preview", scale=0.3,
                            score_mod=score, prob_mod=prob)
    m = _model([node], [("q", d, (1, 6, 4, 8)), ("k", d, (1, 2, 5, 8)), ("v", d, (1, 2, 5, 3))], [("y", d, (1, 6, 4, 3))],
               ["ai.onnx.preview"])
    feed = {n: RNG.standard_normal(s) for n, s in (("q", (1, 6, 4, 8)), ("k", (1, 2, 5, 8)), ("v", (1, 2, 5, 3)))}
    _check(m, feed, rtol=1e-6, atol=1e-9)  # onnx.reference rounds sqrt(scale) to float32


def test_optional_ops_over_a_tensor():
    nodes = [helper.make_node("OptionalHasElement", ["x"], ["has"]), helper.make_node("OptionalGetElement", ["x"], ["got"]),
             helper.make_node("OptionalHasElement", [""], ["none"])]
    m = _model(nodes, [("x", F, (3,))], [("has", TensorProto.BOOL, ()), ("got", F, (3,)),
                                         ("none", TensorProto.BOOL, ())], opset=18)
    x = _f(3)
    has, got, none = backend.prepare(m, mode="reference").run({"x": x})
    assert has.shape == () and bool(has) and not bool(none)
    np.testing.assert_array_equal(got, x)
    assert not import_onnx_model(m).fallbacks


def test_mvn_at_its_default_axes():
    """MeanVarianceNormalization-13 without ``axes``: ONNX's own inference of the function body fails on the
    missing attribute (the importer states the default and infers again)."""
    m = _model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], [("x", F, (2, 3, 4, 5))],
               [("y", F, (2, 3, 4, 5))], opset=13)
    _check(m, {"x": _f(2, 3, 4, 5)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_two_trees_every_mode(aggregate):
    """Two trees (one a single leaf), every comparison mode, a set-membership node, NaN features routed by
    nodes_missing_value_tracks_true, three targets (one reached by no leaf), each aggregate function."""
    modes = np.array([0, 1, 2, 3, 4, 5, 6], np.uint8)  # node k: mode k; node 6 is the set membership
    # tree 0: a chain 0 -> 1 -> ... -> 6 along the true branches; each false branch ends in leaf k
    true_ids, true_leafs = [1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 1]
    false_ids, false_leafs = [0, 1, 2, 3, 4, 5, 6], [1] * 7
    true_ids += [7]  # tree 1 (root node 7): one leaf, both branches on leaf 7 (onnx.reference reads the root's
    false_ids += [7]  # index as the leaf's, the spec the branches': they agree here)
    true_leafs += [1]
    false_leafs += [1]
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=3, aggregate_function=aggregate,
        tree_roots=[0, 7], nodes_modes=numpy_helper.from_array(np.append(modes, 0).astype(np.uint8)),
        nodes_featureids=[0, 1, 2, 0, 1, 2, 0, 0],
        nodes_splits=numpy_helper.from_array(np.array([2.0, 1.5, -1.0, -2.0, 0.5, 0.25, 0.0, 0.0], np.float32)),
        nodes_truenodeids=true_ids, nodes_trueleafs=true_leafs, nodes_falsenodeids=false_ids,
        nodes_falseleafs=false_leafs, nodes_missing_value_tracks_true=[1, 0, 1, 0, 0, 0, 1, 0],
        membership_values=numpy_helper.from_array(np.array([0.5, -3.0, np.nan], np.float32)),
        leaf_weights=numpy_helper.from_array(np.arange(1, 10, dtype=np.float32) * 1.5),
        leaf_targetids=[0, 1, 0, 1, 0, 1, 0, 1, 1])
    m = _model([node], [("x", F, (64, 3))], [("y", F, (64, 3))], ["ai.onnx.ml"])
    x = np.round(RNG.standard_normal((64, 3)) * 2) / 2  # ties with the splits happen
    x[RNG.random((64, 3)) < 0.1] = np.nan
    x[:8, 0] = [0.5, -3.0, 0.5, 1.0, -3.0, 2.0, 0.5, 0.25]  # members and non-members
    _check(m, {"x": x.astype(np.float32)})
