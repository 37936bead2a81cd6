"""An elementwise stage that reads a contraction at a permutation of its own index (a channel shuffle after a
grouped conv: ``O[n, c, g, p] = f(P[n, g, c, p])``) runs as the contraction's epilogue, written back transposed
from the register tile: the default picks it, the result matches the reference, and reads that are no
permutation are rejected with the reason."""

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.plan import ScheduleError, lower
from superopt.schedule.primitives import Epilogue
from superopt.target import host_target

SHUFFLE = ("P[n,g,co,p] += X[n,ci+{c}*g,p] * W[co+{c}*g,ci]\n"
           "O[n,co,g,p] = relu(P[n,g,co,p] * S[g,co] + B[g,co])")


def _graph(groups: int, per_group: int, pixels: int, src: str = SHUFFLE):
    rng = np.random.default_rng(0)
    b = GraphBuilder("g")
    x = b.input("X", (1, groups * per_group, pixels))
    w = b.constant(rng.standard_normal((groups * per_group, per_group)).astype(np.float32), "W")
    s = b.constant(rng.uniform(0.5, 1.5, (groups, per_group)).astype(np.float32), "S")
    t = b.constant(rng.standard_normal((groups, per_group)).astype(np.float32), "B")
    return b.build([b.compute1(src.format(c=per_group), {"X": x, "W": w, "S": s, "B": t}, "op", outputs=["O"])])


@pytest.mark.parametrize("groups,per_group,pixels", [(4, 34, 196), (3, 7, 45)])
def test_a_shuffled_epilogue_is_the_default_and_matches_the_reference(kernel_cache, groups, per_group, pixels):
    g = _graph(groups, per_group, pixels)
    (node,) = g.nodes
    traces = default_schedules(g, host_target(2))
    assert any(isinstance(p, Epilogue) for p in traces[node.name]), traces[node.name]
    ex = GraphExecutor(g, traces, ExecutorConfig(threads=2, compiler=kernel_cache))
    feed = {"X": np.random.default_rng(1).standard_normal(g.type_of["X"].shape).astype(np.float32)}
    want = evaluate(g, feed, np.float64)[g.outputs[0]]
    np.testing.assert_allclose(ex(feed)[g.outputs[0]], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("src", [
    # O reads P at a fixed co: one element broadcast over a dim, not a transposed write-back
    "P[n,g,co,p] += X[n,ci+{c}*g,p] * W[co+{c}*g,ci]\nO[n,co,g,p] = relu(P[n,g,0,p] * S[g,co] + B[g,co])",
    # O[p, co, g] = f(P[g, co, p]) moves the innermost dim: every vector of the tile would be stored lane by lane
    "P[n,g,co,p] += X[n,ci+{c}*g,p] * W[co+{c}*g,ci]\nO[n,p,co,g] = relu(P[n,g,co,p] * S[g,co] + B[g,co])",
], ids=["no permutation", "innermost dim moved"])
def test_an_epilogue_that_is_no_whole_vector_transposed_write_back_is_rejected(src):
    g = _graph(2, 4, 32, src)
    (node,) = g.nodes
    trace = [p for p in default_schedules(g, host_target(2))[node.name] if not isinstance(p, Epilogue)]
    with pytest.raises(ScheduleError, match="permutation"):
        lower(node.op, [*trace, Epilogue(node.op.outputs[0], "P")], host_target(2))


def test_the_graph_cost_counts_no_round_trip_for_a_transposed_epilogue():
    from search.graph.cost import workspace_bytes

    (node,) = _graph(4, 34, 196).nodes
    assert workspace_bytes(node.op) == 0
    # (read at a shifted index, no permutation: the contraction's result is stored and read back)
    (node,) = _graph(2, 4, 32, SHUFFLE.replace("P[n,g,co,p] *", "P[n,g,0,p] *")).nodes
    assert workspace_bytes(node.op) == 2 * node.op.type_of["P"].nbytes
