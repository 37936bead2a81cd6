"""Dead-code elimination: pruned graphs compute the same outputs with less work."""

import numpy as np

from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.ir.prune import prune_graph
from superopt.ops.normalization import layer_norm_with_stats


def _graph():
    b = GraphBuilder("g")
    x = b.input("x", (5, 8))
    g = b.constant(np.linspace(0.5, 1.5, 8, dtype=np.float32), "g")
    y, mean, inv_std = layer_norm_with_stats(b, x, g)
    b.compute1("Z[i,j] = tanh(X[i,j])", {"X": mean}, "dead")  # nothing reads this node
    s = b.compute1("Y[i,j] = Y0[i,j] * 2.0", {"Y0": y}, "scale")
    return b.build([s]), (y, mean, inv_std)


def test_unused_outputs_become_temporaries_and_dead_nodes_go():
    graph, (y, mean, inv_std) = _graph()
    pruned = prune_graph(graph)
    assert [n.name for n in pruned.nodes] == [n.name for n in graph.nodes if "dead" not in n.name]
    ln = next(n for n in pruned.nodes if y in n.outputs)
    assert ln.outputs == (y,) and len(ln.op.outputs) == 1
    assert mean not in pruned.type_of and inv_std not in pruned.type_of
    # the statistics are still computed inside the op, as temporaries, because y needs them
    assert len(ln.op.temporaries) >= 2
    X = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    want = evaluate(graph, {"x": X}, np.float64)[graph.outputs[0]]
    got = evaluate(pruned, {"x": X}, np.float64)[graph.outputs[0]]
    np.testing.assert_array_equal(got, want)


def test_statements_no_output_needs_are_dropped():
    b = GraphBuilder("g")
    x = b.input("x", (4, 6))
    a, _ = b.compute("A[i,j] = X[i,j] + 1.0\nB[i,j] = exp(X[i,j])", {"X": x}, "two", outputs=["A", "B"])
    graph = b.build([a])
    (node,) = prune_graph(graph).nodes
    assert [st.out for st in node.op.statements] == ["A"]
    assert prune_graph(prune_graph(graph)) == prune_graph(graph)  # idempotent


def test_a_graph_with_nothing_dead_is_unchanged():
    b = GraphBuilder("g")
    x = b.input("x", (3,))
    graph = b.build([b.compute1("Y[i] = X[i] * X[i]", {"X": x}, "sq")])
    assert prune_graph(graph) == graph


def test_an_extern_with_an_unread_output_keeps_every_output_typed():
    # TopK's indices unread (found by the differential fuzzer): the extern runs whole, so both outputs keep types
    import numpy as np

    from superopt import ops
    from superopt.builder import GraphBuilder
    from superopt.interp import evaluate
    from superopt.ir.prune import prune_graph

    b = GraphBuilder("g")
    x = b.input("x", (3, 5))
    values, _indices = ops.topk(b, x, 2, axis=1)
    g = prune_graph(b.build([values]))
    assert len(g.nodes) == 1 and all(o in g.type_of for o in g.nodes[0].outputs)
    a = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(g, {"x": a})[g.outputs[0]], -np.sort(-a, axis=1)[:, :2])
