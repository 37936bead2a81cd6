"""Concatenation without copies: producers write into the slices of the concatenated buffer
(superopt/runtime/concat_slices.py), checked against the reference and the executor's memory plan."""

from __future__ import annotations

import numpy as np
import pytest

from superopt import ops
from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.runtime.concat_slices import concat_slices
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.graph_defaults import default_schedules
from superopt.target import host_target


def _executor(graph, cache, **kw) -> GraphExecutor:
    return GraphExecutor(graph, default_schedules(graph, host_target(2)), ExecutorConfig(compiler=cache, **kw))


def _branches(shape=(1, 8, 5, 6), axis=1, extra_reader=False, consumer="tanh"):
    """Two elementwise branches of one input, concatenated, then read by ``consumer``."""
    b = GraphBuilder("branches")
    x = b.input("x", shape)
    d = "n,c,y,x"
    a = b.compute1(f"A[{d}] = relu(X[{d}])", {"X": x}, "left")
    c = b.compute1(f"B[{d}] = X[{d}] * 3.0 - 1.0", {"X": x}, "right")
    cat = ops.concat(b, [a, c], axis)
    if consumer == "tanh":
        (out,) = [b.compute1(f"O[{d}] = tanh(C[{d}])", {"C": cat}, "after")]
    else:  # a numpy extern reads the concatenation
        (out,) = b.extern("cumulative", [cat], fn="sum", axis=1, exclusive=False, reverse=False)
    outs = [out] + ([b.compute1(f"S[{d}] = A[{d}] + 1.0", {"A": a}, "reread")] if extra_reader else [])
    feed = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    return b.build(outs), feed


def _concat_node(g):
    return next(n for n in g.nodes if n.name.startswith("concat"))


@pytest.mark.parametrize("extra_reader", [False, True])
@pytest.mark.parametrize("consumer", ["tanh", "extern"])
def test_producers_write_into_the_slices_and_the_concatenation_never_runs(kernel_cache, extra_reader, consumer):
    g, feed = _branches(extra_reader=extra_reader, consumer=consumer)
    cat = _concat_node(g)
    ex = _executor(g, kernel_cache)
    a, c = cat.inputs
    assert ex.memory.elided == {cat.name} and cat.name not in ex.node_kernel
    assert ex.root[a] == ex.root[c] == cat.outputs[0]
    assert ex.memory.offset_of == {a: 0, c: g.type_of[a].nbytes}
    assert cat.outputs[0] in ex.memory.holding(cat.outputs[0])[0].tensors
    ref = evaluate(g, feed, np.float64)
    for got in (ex(feed), ex.run_per_node(feed), ex(feed)):
        for o in g.outputs:
            np.testing.assert_allclose(got[o], ref[o], rtol=1e-5, atol=1e-5)
    plain = _executor(g, kernel_cache, elide_concats=False)
    assert plain.memory.elided == frozenset() and cat.name in plain.node_kernel


def test_a_slice_off_the_cache_line_is_written_in_place_too(kernel_cache):
    g, feed = _branches(shape=(1, 3, 5, 7))  # the second slice starts 420 bytes in
    ex = _executor(g, kernel_cache)
    assert ex.memory.elided and ex.memory.offset_of[_concat_node(g).inputs[1]] % 64 != 0
    got, ref = ex(feed), evaluate(g, feed, np.float64)
    np.testing.assert_allclose(got[g.outputs[0]], ref[g.outputs[0]], rtol=1e-5, atol=1e-5)


def test_a_concatenation_that_interleaves_its_inputs_is_run_as_a_kernel(kernel_cache):
    for shape, axis in [((2, 8, 5, 6), 1), ((1, 8, 5, 6), 2)]:  # two images; an inner axis
        g, feed = _branches(shape, axis)
        assert concat_slices(g) == []
        ex = _executor(g, kernel_cache)
        assert _concat_node(g).name in ex.node_kernel
        got, ref = ex(feed), evaluate(g, feed, np.float64)
        np.testing.assert_allclose(got[g.outputs[0]], ref[g.outputs[0]], rtol=1e-5, atol=1e-5)


def test_inputs_without_a_compute_producer_or_that_are_graph_outputs_keep_the_copy():
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 3))
    y = b.compute1("Y[a,b,c] = exp(X[a,b,c])", {"X": x}, "e")
    cat = ops.concat(b, [x, y], 1)  # x is a graph input
    g = b.build([b.compute1("O[a,b,c] = C[a,b,c] * 2.0", {"C": cat}, "o")])
    assert concat_slices(g) == []
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 3))
    y = b.compute1("Y[a,b,c] = exp(X[a,b,c])", {"X": x}, "e")
    z = b.compute1("Z[a,b,c] = X[a,b,c] + 1.0", {"X": x}, "z")
    cat = ops.concat(b, [y, z], 1)
    g = b.build([y, b.compute1("O[a,b,c] = C[a,b,c] * 2.0", {"C": cat}, "o")])  # y is a graph output
    assert concat_slices(g) == []


def test_a_concatenation_of_a_concatenation_nests_in_the_outer_buffer(kernel_cache):
    b = GraphBuilder("nested")
    x = b.input("x", (1, 4, 3, 2))
    parts = [b.compute1(f"P[a,b,c,d] = X[a,b,c,d] * {k + 1}.0", {"X": x}, f"p{k}") for k in range(3)]
    inner = ops.concat(b, parts[:2], 1)
    outer = ops.concat(b, [inner, parts[2]], 1)
    g = b.build([b.compute1("O[a,b,c,d] = C[a,b,c,d] - 0.5", {"C": outer}, "o")])
    assert [cs.output for cs in concat_slices(g)] == [inner, outer]
    ex = _executor(g, kernel_cache)
    assert len(ex.memory.elided) == 2
    assert {ex.root[t] for t in (*parts, inner)} == {outer}
    size = g.type_of[parts[0]].nbytes
    assert [ex.memory.offset_of[t] for t in (*parts, inner)] == [0, size, 2 * size, 0]
    feed = {"x": np.random.default_rng(2).standard_normal((1, 4, 3, 2)).astype(np.float32)}
    for got in (ex(feed), ex.run_per_node(feed)):
        np.testing.assert_allclose(got[g.outputs[0]], evaluate(g, feed, np.float64)[g.outputs[0]], rtol=1e-6)


def test_a_growing_chain_of_concatenations_read_between_steps_lives_in_one_buffer(kernel_cache):
    """DenseNet's block: each step reads everything so far and appends a slice; every concatenation is
    a prefix of the last one, and a slice written through a reshape (a tile merged back) lands in place."""
    b = GraphBuilder("dense_chain")
    x = b.input("x", (1, 2, 3, 4))
    feats = b.compute1("F[a,c,y,z] = X[a,c,y,z] + 1.0", {"X": x}, "stem")
    readers = []
    for k in range(3):
        s = b.compute1("S[a,y,z] += C[a,c,y,z]", {"C": feats}, f"sum{k}", extents={"c": 2 * (k + 1)})
        new = b.compute1(f"N[a,y,z,c] = tanh(S[a,y,z]) * {k + 2}.0", {"S": s}, f"grow{k}", extents={"c": 2})
        (new,) = b.extern("reshape", [new], shape=(1, 2, 3, 4)) if k == 1 else (b.compute1(
            "M[a,c,y,z] = N[a,y,z,c]", {"N": new}, f"move{k}"),)
        feats = ops.concat(b, [feats, new], 1)
        readers.append(s)
    g = b.build([b.compute1("O[a,c,y,z] = C[a,c,y,z] * 0.5", {"C": feats}, "out")])
    slices = concat_slices(g)
    assert len(slices) == 3
    assert len(slices[1].inputs) == 3  # the reshaped slice and the compute output under it, at one offset
    assert slices[1].inputs[1][1] == slices[1].inputs[2][1] > 0
    ex = _executor(g, kernel_cache)
    last = slices[-1].output
    assert all(ex.root[cs.output] == last for cs in slices[:-1])
    assert len(ex.memory.elided) == 3
    feed = {"x": np.random.default_rng(4).standard_normal((1, 2, 3, 4)).astype(np.float32)}
    ref = evaluate(g, feed, np.float64)[g.outputs[0]]
    for got in (ex(feed), ex.run_per_node(feed), ex(feed)):
        np.testing.assert_allclose(got[g.outputs[0]], ref, rtol=1e-5, atol=1e-6)


def test_light_squeezenet_writes_its_fire_concatenations_in_place_and_matches_the_reference(kernel_cache, monkeypatch):
    from search.graph.cost import Ceilings
    from superopt.api import OptimizeConfig, load_graph, rewrite_graph
    from superopt.frontends.light_models import light_model_path

    # the graph search's layout and Winograd choices follow the machine's measured ceilings; fixed ones (a
    # 2-core AVX-512 machine) keep the graph this test checks the same on every machine
    monkeypatch.setattr(Ceilings, "measured", classmethod(lambda cls, *a, **k: Ceilings(234e9, 18e9, 5e-6, "fixed")))

    g = rewrite_graph(load_graph(str(light_model_path("squeezenet"))), OptimizeConfig(target=host_target(2)))[0]
    slices = concat_slices(g)
    assert len(slices) == 8  # every fire module's concatenation
    ex = _executor(g, kernel_cache)
    feed = {g.inputs[0]: np.random.default_rng(3).standard_normal(g.type_of[g.inputs[0]].shape).astype(np.float32)}
    got, ref = ex(feed), evaluate(g, feed, np.float64)
    for o in g.outputs:
        np.testing.assert_allclose(got[o], ref[o], rtol=1e-4, atol=1e-5)
