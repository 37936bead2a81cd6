"""The folding, merging and movement rule families on the graphs they are for: every BatchNorm of the light
resnet50 folded into its conv and every ReLU fused (through the default rewrite pipeline), and the
movement rules leaving nothing of transpose/reshape chains."""

import functools

import numpy as np
import onnx
import pytest

from rewrite_rules import rewrite_greedy
from rewrite_rules.folding import FOLD_AFFINE, FOLD_AFFINE_NODE, ONE, affine_in
from rewrite_rules.movement import RULES as MOVEMENT_RULES
from superopt.api import OptimizeConfig, rewrite_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.interp.inputs import random_inputs
from superopt.ir.expr import Access, Unary
from superopt.ir.graph import Graph

pytest.importorskip("onnxruntime")

from superopt.frontends.light_models import light_model_inputs, randomized_light_model, run_onnxruntime  # noqa: E402
from superopt.frontends.onnx_frontend import import_onnx_model  # noqa: E402

# the default pipeline (backtracking graph search over every rule), with time to converge on a busy machine
# (it stops when converged; at the default 2 s budget one expansion may be all it gets)
SEARCH = OptimizeConfig(graph_budget_s=60.0)


@functools.cache
def _resnet50():
    model = randomized_light_model("resnet50")
    imported = import_onnx_model(model)
    return model, imported, rewrite_graph(imported.graph, SEARCH)


def _constant_affine_chain(graph: Graph, node) -> list[tuple[int, list]]:
    """Per contraction with constant weights (a sum of products reading a constant) of a node: the statements
    after it that are affine in it with constant coefficients (their scale expressions), following sole readers."""
    op = node.op
    consts = {local for local, g in zip(op.inputs, node.inputs) if g in graph.constant}
    out = []
    for k, st in enumerate(op.statements):
        if st.reduce != "+=" or not any(a.tensor in consts for a in st.expr.accesses()):
            continue
        chain, cur = [], st.out
        while cur not in op.outputs:
            readers = [s for s in op.statements if any(a.tensor == cur for a in s.expr.accesses())]
            form = affine_in(readers[0].expr, cur) if len(readers) == 1 and readers[0].reduce == "=" else None
            if form is None or any(isinstance(a, Access) and a.tensor not in consts for x in form if x is not None
                                   for a in x.walk()):
                break
            chain.append(form[0])
            cur = readers[0].out
        out.append((k, chain))
    return out


def test_resnet50_every_batchnorm_folded_and_every_relu_fused():
    model, imported, (graph, applied) = _resnet50()
    bn = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    bn_nodes = [n for n in imported.graph.nodes if n.name.startswith("batch_norm")]  # as the frontend names them
    params = {i for n in bn_nodes for i in n.inputs[1:]}
    assert len(bn) == len(bn_nodes) == 53 and len(params) == 4 * 53 and params <= set(imported.graph.constant)
    # no statement reads a batch norm's scale, shift, mean or variance: all went into folded weights and one bias
    read = {g for n in graph.nodes if not n.is_extern for local, g in zip(n.op.inputs, n.inputs)
            if any(a.tensor == local for st in n.op.statements for a in st.expr.accesses())}
    assert not params & read
    assert applied.count(FOLD_AFFINE.name) + applied.count(FOLD_AFFINE_NODE.name) >= len(bn)
    contractions = 0
    for node in graph.nodes:
        if node.is_extern:
            continue
        for _, chain in _constant_affine_chain(graph, node):
            contractions += 1
            assert len(chain) <= 1 and all(a == ONE for a in chain), f"{node.name}: per-channel arithmetic left"
        temporaries = set(node.op.temporaries)
        for st in node.op.statements:  # a relu reads what its own node computed
            for e in st.expr.walk():
                if isinstance(e, Unary) and e.fn == "relu":
                    assert {a.tensor for a in e.x.accesses()} <= temporaries, f"{node.name}: relu not fused"
    assert contractions >= len(bn) + 1  # 53 convs and the final gemm
    assert sum(1 for n in graph.nodes for st in ([] if n.is_extern else n.op.statements)
               for e in st.expr.walk() if isinstance(e, Unary) and e.fn == "relu") == \
        sum(n.op_type == "Relu" for n in model.graph.node)


def _prefix(model: onnx.ModelProto, index: int, op_type: str = "Relu") -> onnx.ModelProto:
    """The model up to its ``index``-th node of ``op_type`` (whose output is the only output)."""
    cut = [k for k, n in enumerate(model.graph.node) if n.op_type == op_type][index]
    sub = onnx.ModelProto()
    sub.CopyFrom(model)
    del sub.graph.node[cut + 1:]
    used = {i for n in sub.graph.node for i in n.input}
    keep = [t for t in sub.graph.initializer if t.name in used]
    del sub.graph.initializer[:]
    sub.graph.initializer.extend(keep)
    del sub.graph.output[:]
    sub.graph.output.append(onnx.helper.make_tensor_value_info(model.graph.node[cut].output[0], onnx.TensorProto.FLOAT, None))
    return sub


def test_resnet50_folded_prefix_matches_onnxruntime():
    """The first two bottleneck blocks (8 batch norms, the projection shortcut) after the rewrites: float64
    reference interpreter against onnxruntime and against the unrewritten graph."""
    model = _prefix(randomized_light_model("resnet50"), 6)
    imported = import_onnx_model(model)
    graph, applied = rewrite_graph(imported.graph, SEARCH)
    assert applied.count(FOLD_AFFINE.name) + applied.count(FOLD_AFFINE_NODE.name) == 8
    feed = light_model_inputs(model)
    want = run_onnxruntime(model, feed)[0]
    inputs = {g: feed[n] for g, n in zip(graph.inputs, imported.input_names)}
    got = evaluate(graph, inputs, np.float64)[graph.outputs[0]]
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    unfolded = evaluate(imported.graph, inputs, np.float64)[imported.graph.outputs[0]]
    np.testing.assert_allclose(got, unfolded, rtol=1e-6, atol=1e-6 * float(np.abs(unfolded).max()))


def test_batchnorm_folds_before_elementwise_fusion():
    """On the IR as the frontend emits it (conv node -> batch_norm node), with fusion off: the fold still happens."""
    graph = FOLD_AFFINE_NODE.examples()[0]
    folded, report = rewrite_greedy(graph, [FOLD_AFFINE_NODE, FOLD_AFFINE])
    assert report.applied == (FOLD_AFFINE_NODE.name,)
    (conv, relu) = folded.nodes
    p, tail = conv.op.statements  # P += X * W'; O = P + b: the scale went into the weight
    assert (p.reduce, tail.reduce) == ("+=", "=") and affine_in(tail.expr, p.out)[0] == ONE
    assert relu.op.statements[0].expr.fn == "relu"
    feed = random_inputs(graph, seed=3)
    np.testing.assert_allclose(evaluate(folded, feed, np.float64)[graph.outputs[0]],
                               evaluate(graph, feed, np.float64)[graph.outputs[0]], rtol=1e-6, atol=1e-6)


def test_transpose_chains_and_reshape_chains_vanish():
    b = GraphBuilder("chains")
    x = b.input("x", (2, 3, 4))
    t = b.compute1("O[a,j,i] = X[a,i,j]", {"X": x}, "transpose")
    t2 = b.compute1("O[a,j,i] = X[a,i,j]", {"X": t}, "transpose2")  # transpose of transpose: identity
    (r,) = b.extern("reshape", [t2], shape=(6, 4))
    (r2,) = b.extern("reshape", [r], shape=(2, 12))  # reshape of reshape
    (r3,) = b.extern("reshape", [r2], shape=(2, 3, 4))  # back to the start: identity
    w = b.constant(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32), "w")
    wt = b.compute1("O[k,j] = W[j,k]", {"W": w}, "transpose_w")  # a transposed weight read by a contraction
    y = b.compute1("O[a,i,j] += X[a,i,k] * W[k,j]", {"X": r3, "W": wt}, "matmul")
    graph = b.build([y])
    rewritten, report = rewrite_greedy(graph, MOVEMENT_RULES)
    assert len(graph.nodes) == 7 and len(rewritten.nodes) == 1, rewritten.text()
    (mm,) = rewritten.nodes
    assert mm.inputs == ("x", "w")  # x and the weight itself, the transpose in the index map
    feed = random_inputs(graph, seed=1)
    np.testing.assert_allclose(evaluate(rewritten, feed, np.float64)[graph.outputs[0]],
                               evaluate(graph, feed, np.float64)[graph.outputs[0]], rtol=1e-12)


def test_inception_parallel_1x1_convs_merged():
    """inception_v1 up to the first module's Concat, greedy rewrites: the 1x1, 3x3-reduce and 5x5-reduce convs
    of the module (each + bias + relu, all reading the pooled input) are one conv over 64+96+16 channels (in
    NCHW: blocked, the merged conv would read the input through a conversion)."""
    model = _prefix(randomized_light_model("inception_v1"), 0, "Concat")
    imported = import_onnx_model(model)
    graph, applied = rewrite_graph(imported.graph, OptimizeConfig(graph_search="greedy", layout="nchw"))
    assert applied.count("merge_parallel_contractions") == 1
    pooled = [n for n in imported.graph.nodes if n.name.startswith("max_pool")][1].outputs[0]
    readers = [n for n in graph.nodes if pooled in n.inputs and not n.is_extern
               and any(st.reduce == "+=" for st in n.op.statements)]
    assert len(readers) == 1 and graph.type_of[readers[0].outputs[0]].shape[1] == 64 + 96 + 16
    feed = light_model_inputs(model)
    got = evaluate(graph, {g: feed[n] for g, n in zip(graph.inputs, imported.input_names)}, np.float64)[graph.outputs[0]]
    assert np.allclose(got, run_onnxruntime(model, feed)[0], rtol=1e-4, atol=1e-5)
