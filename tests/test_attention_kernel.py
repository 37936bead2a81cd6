"""Attention as one kernel: scores, masked and scaled softmax, weighted sum merged into one compute op
(``rewrite_rules.vertical_fusion``) and scheduled per query row (``rows+contraction``), so the score
matrix is never stored: the memory plan holds no buffer of its size, only row buffers on the stack.
Checked against the reference interpreter and, for an exported BERT-like attention block, onnxruntime.
"""

import io

import numpy as np
import pytest

from rewrite_rules import EXPLORATION_FAMILIES, RULES, rewrite_greedy
from rewrite_rules.vertical_fusion import FUSE_ATTENTION
from superopt.api import load_graph
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.ir.prune import prune_graph
from superopt.ops.attention import scaled_dot_product_attention
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.default import ROWS_INTO_CONTRACTION, default_schedule, sketch_names
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.primitives import ComputeAt
from superopt.schedule.rows_contraction import ROW_BLOCK
from superopt.target import host_target


def _compile(graph, kernel_cache) -> GraphExecutor:
    """The graph as it is (no rewrites), default schedules, 2 threads."""
    target = host_target(2)
    return GraphExecutor(graph, default_schedules(graph, target), ExecutorConfig(2, kernel_cache, target))


def _score_bytes(batch: int, heads: int, seq: int) -> int:
    return batch * heads * seq * seq * 4


def _no_score_matrix(ex, node: str, batch: int, heads: int, seq: int) -> None:
    """No buffer of the score matrix's size (outputs and packed copies of inputs aside), and the kernel's
    local buffers hold a block of score rows at most."""
    big = [b for b in ex.memory.buffers if b.nbytes >= _score_bytes(batch, heads, seq)
           and b.kind not in ("output", "packed", "packed_per_call")]
    assert not big, str(ex.memory)
    rows = [b for b in ex.memory.of_node(node) if b.kind == "local"]
    assert rows and max(b.nbytes for b in rows) <= min(ROW_BLOCK, seq) * seq * 4, str(ex.memory)


@pytest.mark.parametrize("shape, mask, causal", [((2, 4, 16, 16), True, False), ((1, 3, 17, 8), False, True),
                                                 ((2, 2, 5, 7), True, False)])
def test_attention_op_runs_per_row_and_matches_reference(shape, mask, causal, kernel_cache):
    b = GraphBuilder("sdpa")
    q, k, v = (b.input(n, shape) for n in "qkv")
    m = b.input("m", (shape[0], 1, 1, shape[2])) if mask else None
    graph = b.build([scaled_dot_product_attention(b, q, k, v, m, is_causal=causal)])
    (node,) = graph.nodes
    assert sketch_names(node.op, host_target(2))[0] == ROWS_INTO_CONTRACTION
    trace = default_schedule(node.op, host_target(2))
    assert any(isinstance(p, ComputeAt) for p in trace)
    ex = _compile(graph, kernel_cache)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    got, ref = ex(feed)[graph.outputs[0]], evaluate(graph, feed, np.float64)[graph.outputs[0]]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    _no_score_matrix(ex, ex.graph.nodes[0].name, shape[0], shape[1], shape[2])


def test_rule_merges_its_examples_into_one_node():
    for g in FUSE_ATTENTION.examples():
        (site,) = FUSE_ATTENTION.sites(g)
        merged = FUSE_ATTENTION.apply(g, site)
        assert len([n for n in merged.nodes if not n.is_extern]) == 1 and merged.outputs == g.outputs
        rng = np.random.default_rng(1)
        feed = {n: rng.standard_normal(g.type_of[n].shape).astype(np.float32) for n in g.inputs}
        np.testing.assert_allclose(evaluate(merged, feed, np.float64)[g.outputs[0]],
                                   evaluate(g, feed, np.float64)[g.outputs[0]], rtol=1e-12)


def _export_attention(batch: int, heads: int, seq: int, hd: int):
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5 + mask, -1) @ v

    gen = torch.Generator().manual_seed(seq)
    args = tuple(torch.randn(batch, heads, seq, hd, generator=gen) for _ in range(3))
    mask = torch.where(torch.rand(batch, 1, 1, seq, generator=gen) < 0.25, -1e4, 0.0)
    f = io.BytesIO()
    torch.onnx.export(Attention(), (*args, mask), f, dynamo=False, opset_version=17,
                      input_names=["q", "k", "v", "mask"])
    return onnx.load_from_string(f.getvalue()), [a.numpy() for a in (*args, mask)]


@pytest.mark.parametrize("seq", [16, 37, 128])
def test_exported_bert_attention_is_one_kernel_matching_onnxruntime(seq, kernel_cache):
    """MatMul, Div, Add (mask), Softmax, MatMul as ONNX exports them: one compute node after the registered
    rules (the greedy driver: the graph search's choice depends on its cost and budget), no buffer of the
    score matrix's size, outputs within rtol 1e-4 of onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    batch, heads, hd = 2, 4, 16
    model, arrays = _export_attention(batch, heads, seq, hd)
    graph = load_graph(model, arrays)
    rewritten, report = rewrite_greedy(prune_graph(graph), [r for r in RULES if r.family not in EXPLORATION_FAMILIES])
    assert "fuse_attention" in report.applied
    computes = [n for n in rewritten.nodes if not n.is_extern]
    assert len(computes) == 1, [n.name for n in rewritten.nodes]
    ex = _compile(rewritten, kernel_cache)
    got = ex(dict(zip(graph.inputs, arrays)))[graph.outputs[0]]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, dict(zip(["q", "k", "v", "mask"], arrays)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    _no_score_matrix(ex, computes[0].name, batch, heads, seq)


def test_rows_sketch_refuses_a_temporary_that_is_not_per_row(kernel_cache):
    """W depends on no query row: attached to the row loop it would be recomputed for every row, so the
    rows+contraction sketch does not apply and W keeps its own loops."""
    b = GraphBuilder("not_per_row")
    q, k, v = b.input("q", (6, 8)), b.input("k", (10, 8)), b.input("v", (8, 5))
    src = ("T[i,j] += Q[i,e] * K[j,e]\nM[i,u] max= T[i,j]\nE[i,j] = exp(T[i,j] - M[i,0])\n"
           "W[j,f] += K[j,e] * V[e,f]\nO[i,f] += E[i,j] * W[j,f]")
    graph = b.build([b.compute1(src, {"Q": q, "K": k, "V": v}, "op", extents={"u": 1})])
    (node,) = graph.nodes
    trace = default_schedule(node.op, host_target(2))
    assert not any(isinstance(p, ComputeAt) and p.stage == "W" for p in trace)
    ex = _compile(graph, kernel_cache)
    rng = np.random.default_rng(2)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    np.testing.assert_allclose(ex(feed)[graph.outputs[0]], evaluate(graph, feed, np.float64)[graph.outputs[0]],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, row_block", [((2, 4, 16, 16), None), ((1, 3, 17, 8), None), ((2, 2, 5, 7), 1),
                                              ((1, 2, 40, 16), 1)])
def test_normalization_factored_out_runs_at_the_write_back(shape, row_block, kernel_cache):
    """With the softmax's division by Z moved after the weighted sum (``divide_after_sum``), the op ends in
    ``O = S / Z``: the rows+contraction sketch still applies, computing that division as the weighted sum's
    epilogue (reading Z, a row temporary), with blocks of rows and with one row at a time."""
    from rewrite_rules.algebraic import DIVIDE_AFTER_SUM
    from superopt.schedule.graph_defaults import constant_inputs
    from superopt.schedule.primitives import Epilogue
    from superopt.schedule.space import Point, ScheduleSpace

    b = GraphBuilder("sdpa")
    q, k, v = (b.input(n, shape) for n in "qkv")
    graph = b.build([scaled_dot_product_attention(b, q, k, v, None)])
    graph = DIVIDE_AFTER_SUM.first(graph)
    (node,) = graph.nodes
    last = node.op.statements[-1]
    assert last.reduce == "=" and sketch_names(node.op, host_target(2))[0] == ROWS_INTO_CONTRACTION
    space = ScheduleSpace(node.op, host_target(2), constant_inputs(graph, node))
    point = space.default_point()
    if row_block is not None:
        weighted = node.op.statements[-2].out
        point = Point.of(point.sketch, {**point.knob_map, f"{weighted}.row_block": row_block})
    trace = list(space.trace(point))
    assert any(isinstance(p, Epilogue) and p.stage == last.out for p in trace)
    target = host_target(2)
    ex = GraphExecutor(graph, {node.name: trace}, ExecutorConfig(2, kernel_cache, target))
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    np.testing.assert_allclose(ex(feed)[graph.outputs[0]], evaluate(graph, feed, np.float64)[graph.outputs[0]],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scale, inlined", [("8.0", True), ("0.125", True), ("3.0", False)])
def test_scores_scaled_by_a_power_of_two_are_recomputed_not_stored(scale, inlined, kernel_cache):
    """``T / 8`` is as cheap as a multiply (the compiler multiplies by the exact reciprocal), so the rows
    sketch inlines the scaled scores into the max and the exponent instead of storing a second score block;
    a division by 3 stays a stored stage. Either way the kernel matches the reference."""
    from superopt.schedule.primitives import Inline

    b = GraphBuilder("scaled")
    q, k, v = b.input("q", (2, 24, 16)), b.input("k", (2, 24, 16)), b.input("v", (2, 24, 8))
    src = (f"T[h,i,j] += Q[h,i,e] * K[h,j,e]\nS[h,i,j] = T[h,i,j] / {scale}\nM[h,i,u] max= S[h,i,j]\n"
           "E[h,i,j] = exp(S[h,i,j] - M[h,i,0])\nZ[h,i,u] += E[h,i,j]\nP[h,i,j] = E[h,i,j] / Z[h,i,0]\n"
           "O[h,i,f] += P[h,i,j] * V[h,j,f]")
    graph = b.build([b.compute1(src, {"Q": q, "K": k, "V": v}, "op", extents={"u": 1})])
    (node,) = graph.nodes
    trace = default_schedule(node.op, host_target(2))
    assert any(isinstance(p, Inline) and p.stage == "S" for p in trace) == inlined
    ex = _compile(graph, kernel_cache)
    rng = np.random.default_rng(4)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    np.testing.assert_allclose(ex(feed)[graph.outputs[0]], evaluate(graph, feed, np.float64)[graph.outputs[0]],
                               rtol=1e-4, atol=1e-5)
