"""Blocks of rows: ``ComputeAt`` at the outer loop of a split computes the producer for the split's block
(lowering), and the ``rows+contraction`` sketch uses it for attention (flash-attention-like: a block of
query rows at a time, register-tiled scores and weighted sum, the score matrix never stored).
Checked against the reference interpreter on shapes that the blocks do not divide, with masks,
causal masking, batches and heads, and through the kernels' local buffers and the executor's memory plan.
"""

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.codegen.c_emit import emit_c
from superopt.interp import evaluate, evaluate_compute
from superopt.lang import compile_op
from superopt.ops.attention import scaled_dot_product_attention
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.runtime.kernel import build_kernels
from superopt.schedule.default import ROWS_INTO_CONTRACTION, default_schedule
from superopt.schedule.knobs import KnobRecorder
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import (
    CacheWrite,
    ComputeAt,
    Fuse,
    Parallel,
    Reorder,
    Split,
    Unroll,
    Vectorize,
)
from superopt.schedule.rows_contraction import ROW_BLOCK, rows_into_contraction
from superopt.schedule.space import Point, ScheduleSpace
from superopt.target import host_target

ROW_OP = "T[i,j] = exp(A[i,j])\nS[i,f] += T[i,j] * B[j,f]"


def _run(c, trace, kernel_cache, seed=0):
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    (kernel,) = build_kernels([(c, trace)], kernel_cache, threads=2)
    (got,) = kernel(*args)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"trace {trace}")


def _local_bytes(c, trace) -> dict[str, int]:
    return {name: n for kind, name, n in emit_c(lower(c, trace, host_target(2))).storage if kind == "local"}


@pytest.mark.parametrize("rows, block, inner", [(13, 8, 3), (16, 8, 4), (7, 4, 0)])
def test_compute_at_a_split_loop_computes_the_block(rows, block, inner, kernel_cache):
    """T attached at S's outer row loop holds ``block`` rows (the last block cut at the end of the rows);
    T may split its own loop over the block (``inner``), tails included."""
    c = compile_op(ROW_OP, {"A": (rows, 11), "B": (11, 16)})
    trace = [Split("S", "i", block), Reorder("S", ("i_o", "j", "i_i", "f")), CacheWrite("S", "j"),
             Unroll("S", "i_i"), Vectorize("S", "f"), Parallel("S", "i_o"), ComputeAt("T", "S", "i_o")]
    if inner:
        trace += [Split("T", "i", inner), Unroll("T", "i_i"), Vectorize("T", "j")]
    _run(c, trace, kernel_cache)
    assert _local_bytes(c, trace) == {"T": min(block, rows) * 11 * 4}


def test_block_of_two_nested_splits_and_a_split_tail(kernel_cache):
    """S's rows split by 5 then by 2: T attached at the outer loop computes blocks of 5 rows (not 6)."""
    c = compile_op(ROW_OP, {"A": (12, 9), "B": (9, 8)})
    trace = [Split("S", "i", 5), Split("S", "i_i", 2), Reorder("S", ("i_o", "i_i_o", "j", "i_i_i", "f")),
             CacheWrite("S", "j"), ComputeAt("T", "S", "i_o")]
    _run(c, trace, kernel_cache)
    assert _local_bytes(c, trace) == {"T": 5 * 9 * 4}


def test_block_dim_fused_by_the_producer_is_refused():
    c = compile_op(ROW_OP, {"A": (12, 9), "B": (9, 8)})
    trace = [Split("S", "i", 4), ComputeAt("T", "S", "i_o"), Fuse("T", "i", "j")]
    with pytest.raises(ScheduleError, match="may be split but not fused"):
        lower(c, trace, host_target(2))


def _sdpa(shape, mask=False, causal=False, keys=None):
    b = GraphBuilder("sdpa")
    q = b.input("q", shape)
    kv = shape[:2] + (keys or shape[2], shape[3])
    k, v = b.input("k", kv), b.input("v", kv)
    m = b.input("m", (shape[0], 1, 1, kv[2])) if mask else None
    return b.build([scaled_dot_product_attention(b, q, k, v, m, is_causal=causal)])


@pytest.mark.parametrize("shape, mask, causal", [((1, 3, 70, 32), True, False), ((2, 2, 45, 64), False, True),
                                                 ((1, 2, 33, 80), True, False), ((3, 1, 9, 16), False, False)])
def test_attention_in_row_blocks_matches_reference_without_score_matrix(shape, mask, causal, kernel_cache):
    graph = _sdpa(shape, mask, causal)
    (node,) = graph.nodes
    target = host_target(2)
    trace = default_schedule(node.op, target)
    final = node.op.statements[-1].out
    block = min(ROW_BLOCK, shape[2])
    assert Split(final, "i", block) in trace  # blocks of query rows, the temporaries computed per block
    assert all(p.loop.endswith("_o") for p in trace if isinstance(p, ComputeAt))
    ex = GraphExecutor(graph, {node.name: trace}, ExecutorConfig(2, kernel_cache, target))
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    if mask:
        feed["m"] = np.where(feed["m"] < -0.5, -1e4, 0.0).astype(np.float32)
    got, ref = ex(feed)[graph.outputs[0]], evaluate(graph, feed, np.float64)[graph.outputs[0]]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    scores = shape[0] * shape[1] * shape[2] * shape[2] * 4
    big = [b for b in ex.memory.buffers if b.nbytes >= scores and b.kind not in ("output", "packed", "packed_per_call")]
    assert not big, str(ex.memory)
    local = [b.nbytes for b in ex.memory.of_node(node.name) if b.kind == "local"]
    assert local and max(local) <= block * shape[2] * 4, str(ex.memory)  # a block of score rows at most


def test_keys_laid_out_seq_major_with_fused_batch_and_heads_are_packed(kernel_cache):
    """torch's multi-head attention hands K over as [seq, batch*heads, e] (read K[j, 4*b+h, e]): the key
    operand is still packed to [batch*heads, e, seq] so the score tile's vector run over keys is contiguous
    (unpacked it is a stride-(batch*heads*e) gather: 14x slower on the encoder benchmark)."""
    src = ("T[b,h,i,j] += Q[i,4*b+h,e] * K[j,4*b+h,e]\nU[b,h,i,j] = T[b,h,i,j] * 0.125\n"
           "M[b,h,i,r] max= U[b,h,i,j]\nE[b,h,i,j] = exp(U[b,h,i,j] - M[b,h,i,0])\nZ[b,h,i,r] += E[b,h,i,j]\n"
           "P[b,h,i,j] = E[b,h,i,j] / Z[b,h,i,0]\nO[b,h,i,f] += P[b,h,i,j] * V[b,h,j,f]")
    c = compile_op(src, {"Q": (40, 8, 16), "K": (40, 8, 16), "V": (2, 4, 40, 16)}, extents={"r": 1, "b": 2, "h": 4},
                   outputs=["O"])
    trace = default_schedule(c, host_target(2))
    (pack,) = [p for p in trace if getattr(p, "perm", None) is not None]
    assert pack.stage == "K" and pack.perm == (1, 2, 0)
    _run(c, trace, kernel_cache)


def test_keys_sliced_from_a_fused_projection_get_a_local_of_their_own_and_are_packed(kernel_cache):
    """Q, K and V as column slices of one fused projection (torch.compile's multi-head attention):
    untie_all_keys binds the key read to a new local of the same tensor, the schedule packs that local
    only (packing the shared one would scatter V's reads), and the result still matches the reference."""
    from rewrite_rules.vertical_fusion import untie_all_keys

    src = ("T[b,h,i,j] += X[b,i,16*h+e] * X[b,j,16*h+e+32]\nM[b,h,i,u] max= T[b,h,i,j]\n"
           "Ex[b,h,i,j] = exp(T[b,h,i,j] - M[b,h,i,0])\nZ[b,h,i,u] += Ex[b,h,i,j]\n"
           "P[b,h,i,j] = Ex[b,h,i,j] / Z[b,h,i,0]\nO[b,h,i,f] += P[b,h,i,j] * X[b,j,16*h+f+64]")
    b = GraphBuilder("fused_qkv")
    x = b.input("x", (2, 40, 96))
    out = b.compute1(src, {"X": x}, "attention", extents={"h": 2, "e": 16, "f": 16, "u": 1, "j": 40}, outputs=["O"])
    graph = b.build([out])
    untied = untie_all_keys(graph)
    (node,) = untied.nodes
    assert node.op.inputs == ("X", "X_keys") and node.inputs == ("x", "x")
    target = host_target(2)
    trace = default_schedule(node.op, target)
    assert [p.stage for p in trace if getattr(p, "perm", None) is not None] == ["X_keys"]
    assert untie_all_keys(untied) == untied  # once untied, nothing is shared any more
    ex = GraphExecutor(untied, {node.name: trace}, ExecutorConfig(2, kernel_cache, target))
    feed = {"x": np.random.default_rng(5).standard_normal((2, 40, 96)).astype(np.float32)}
    ref = evaluate(graph, feed, np.float64)[graph.outputs[0]]
    np.testing.assert_allclose(ex(feed)[untied.outputs[0]], ref, rtol=1e-4, atol=1e-5)


def test_more_keys_than_queries_and_one_row_knob(kernel_cache):
    """Cross-attention (keys != queries) in blocks; ``row_block = 1`` is the one-row structure, also legal."""
    graph = _sdpa((1, 2, 20, 16), keys=50)
    (node,) = graph.nodes
    target = host_target(2)
    space = ScheduleSpace(node.op, target)
    assert ROWS_INTO_CONTRACTION in space.sketches
    rng = np.random.default_rng(4)
    feed = {n: rng.standard_normal(graph.type_of[n].shape).astype(np.float32) for n in graph.inputs}
    ref = evaluate(graph, feed, np.float64)[graph.outputs[0]]
    final = node.op.statements[-1].out
    for knobs in ({}, {f"{final}.row_block": 1}, {f"{final}.row_block": 8, f"{final}.rows": 3,
                                                   f"{final}.key_block": 16}):
        trace = space.trace(Point.of(ROWS_INTO_CONTRACTION, knobs))
        ex = GraphExecutor(graph, {node.name: list(trace)}, ExecutorConfig(2, kernel_cache, target))
        np.testing.assert_allclose(ex(feed)[graph.outputs[0]], ref, rtol=1e-4, atol=1e-5, err_msg=str(knobs))
    kn = KnobRecorder({f"{final}.row_block": 1})
    one_row = rows_into_contraction(node.op, target, kn)
    assert not any(isinstance(p, Split) for p in one_row) and 1 in kn.domains[f"{final}.row_block"]


def test_sampled_points_of_the_attention_space_match_reference(kernel_cache):
    """Random knob assignments of the rows+contraction sketch (row blocks, tiles, key blocks, packing,
    inlining): every one that is legal computes the reference's result."""
    import random

    graph = _sdpa((1, 2, 40, 16), mask=True)
    (node,) = graph.nodes
    c = node.op
    space = ScheduleSpace(c, host_target(2))
    rng = random.Random(5)
    traces = []
    for _ in range(12):
        try:
            traces.append(space.trace(space.sample(rng, ROWS_INTO_CONTRACTION)))
        except ScheduleError:
            continue
    assert len(traces) >= 6
    args = [np.random.default_rng(6).standard_normal(c.type_of[i].shape).astype(np.float32) for i in c.inputs]
    (ref,) = evaluate_compute(c, args, np.float64)
    for trace, kernel in zip(traces, build_kernels([(c, t) for t in traces], kernel_cache, threads=2)):
        (got,) = kernel(*args)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=f"trace {trace}")
