"""A BERT-like encoder layer exported from PyTorch to ONNX, through the default rewrite pipeline: Q/K/V merged
into one contraction, bias + GELU fused into the FFN's first contraction, each residual add fused with its
LayerNorm, the attention (scores, softmax, weighted sum) one node; the compiled program matches onnxruntime
within rtol 1e-4."""

import functools

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from onnx import numpy_helper  # noqa: E402

from superopt.api import OptimizeConfig, optimize, rewrite_graph  # noqa: E402
from superopt.frontends.onnx_frontend import import_onnx_model  # noqa: E402
from superopt.ir.expr import Access, Binary, Unary  # noqa: E402
from superopt.testing.exported_models import export_model, max_rel_error, ort_session  # noqa: E402

# the default pipeline (backtracking graph search; given time to converge on a busy machine, it stops when
# converged) and the greedy driver (every shrinking rule to a fixed point)
PIPELINES = {"search": OptimizeConfig(graph_budget_s=30.0), "greedy": OptimizeConfig(graph_search="greedy")}


@functools.cache
def _exported():
    model, feed = export_model("bert_encoder")
    return model, feed, import_onnx_model(model)


@functools.cache
def _encoder(pipeline: str = "search"):
    model, feed, imported = _exported()
    return model, feed, imported, rewrite_graph(imported.graph, PIPELINES[pipeline])


def _fns(node) -> set[str]:
    return {e.fn for st in node.op.statements for e in st.expr.walk() if isinstance(e, Unary)}


def _contractions_with_constant(graph, node) -> list:
    consts = {local for local, g in zip(node.op.inputs, node.inputs) if g in graph.constant}
    return [st for st in node.op.statements if st.reduce == "+=" and any(a.tensor in consts for a in st.expr.accesses())]


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_qkv_projections_merged_into_one_contraction(pipeline):
    model, _, imported, (graph, applied) = _encoder(pipeline)
    x = graph.inputs[0]
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # the three projections of the input, in Q, K, V order (the exported MatMuls reading the input)
    weights = [init[n.input[1]] for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == model.graph.input[0].name]
    assert len(weights) == 3
    readers = [n for n in graph.nodes if x in n.inputs and any(  # contractions of x with constant weights
        a.tensor == n.op.inputs[n.inputs.index(x)] for st in _contractions_with_constant(graph, n) for a in st.expr.accesses())]
    assert len(readers) == 1, "Q/K/V still separate"
    (qkv,) = readers
    merged = [graph.constant[g].array for g in qkv.inputs if g in graph.constant and graph.constant[g].array.ndim == 2]
    assert len(merged) == 1 and np.array_equal(merged[0], np.concatenate(weights, axis=1))  # X @ [Wq | Wk | Wv]
    assert "merge_parallel_contractions" in applied


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_bias_gelu_fused_into_its_contraction(pipeline):
    _, _, _, (graph, _) = _encoder(pipeline)
    (ffn,) = [n for n in graph.nodes if not n.is_extern and "erf" in _fns(n)]
    (mm,) = _contractions_with_constant(graph, ffn)
    bias = [st for st in ffn.op.statements if st.reduce == "=" and any(a.tensor == mm.out for a in st.expr.accesses())]
    assert len(bias) == 1 and isinstance(bias[0].expr, Binary) and bias[0].expr.op == "+"  # P + b, then GELU: one node


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_residual_add_and_layer_norm_fused(pipeline):
    _, _, imported, (graph, _) = _encoder(pipeline)
    norms = [n for n in graph.nodes if not n.is_extern and "rsqrt" in _fns(n)]
    assert len(norms) == 2
    for node in norms:
        op = node.op
        temps = set(op.temporaries)
        activations = {lo for lo, g in zip(op.inputs, node.inputs) if g not in graph.constant}
        # the residual add: an elementwise sum of the node's input activation and what the node computed
        residual = [st for st in op.statements if st.reduce == "=" and isinstance(st.expr, Binary) and st.expr.op == "+"
                    and all(isinstance(x, Access) for x in (st.expr.a, st.expr.b))
                    and {st.expr.a.tensor, st.expr.b.tensor} & activations and {st.expr.a.tensor, st.expr.b.tensor} & temps]
        assert len(residual) == 1, f"{node.name}: no residual add in the layer norm's node"
        # the layer norm's mean reads the residual sum inside the node
        sums = [st for st in op.statements if st.reduce == "+=" and any(a.tensor == residual[0].out for a in st.expr.accesses())]
        assert sums and residual[0].out in temps


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_attention_is_one_node(pipeline):
    """scores = Q K^T / sqrt(d), softmax, and the weighted sum of V: one node (rewrite_rules.vertical_fusion), once
    the movement rules have split the softmax's row loop (the frontend flattens its rows with a reshape)."""
    _, _, _, (graph, applied) = _encoder(pipeline)
    (attn,) = [n for n in graph.nodes if not n.is_extern and "exp" in _fns(n)]
    sums = [st for st in attn.op.statements if st.reduce == "+="]
    scores, weighted = sums[0], sums[-1]
    assert len(sums) == 3  # Q K^T, the softmax's denominator, P V
    # P V is the output, or the output is P V scaled by 1 / denominator (rewrite_rules.algebraic.factor_out_of_sum)
    last = attn.op.statements[-1]
    assert weighted.out in attn.op.outputs or (last.out in attn.op.outputs and weighted.out in last.inputs()
                                                and "factor_out_of_sum" in applied)
    assert any(st.reduce == "max=" for st in attn.op.statements)
    assert all(a.tensor not in attn.op.temporaries for a in scores.expr.accesses())  # reads Q and K themselves
    assert "fuse_attention" in applied


def test_encoder_matches_onnxruntime():
    model, feed, _ = _exported()
    prog = optimize(model, feed, OptimizeConfig(cost_model=None))
    want = ort_session(model).run(None, feed)
    for got, w in zip(prog(**feed), want):
        assert got.shape == w.shape and max_rel_error(got, w) <= 1e-4
    other = {k: np.random.default_rng(5).standard_normal(v.shape).astype(v.dtype) for k, v in feed.items()}
    for got, w in zip(prog(**other), ort_session(model).run(None, other)):
        assert max_rel_error(got, w) <= 1e-4
