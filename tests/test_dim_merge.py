"""A contraction's output dims that run together in every tensor, as one dim (the layout pass): exact, only where
every tensor reads them next to each other and whole, and what the default schedule then does with the merged dim."""

import numpy as np
import pytest

from rewrite_rules import RuleNotApplicable
from rewrite_rules.dim_merge import MERGE_DIMS, merge_dims_where
from superopt.builder import GraphBuilder
from superopt.interp.reference import evaluate


def _graph(text: str, shapes: dict[str, tuple[int, ...]], constant: str | None = None,
           extents: dict[str, int] | None = None):
    b = GraphBuilder("contraction")
    rng = np.random.default_rng(0)
    ins = {k: b.constant(rng.standard_normal(s).astype(np.float32), k) if k == constant else b.input(k, s)
           for k, s in shapes.items()}
    return b.build([b.compute1(text, ins, "contract", extents=extents)])


def _kernel(graph):
    (node,) = (n for n in graph.nodes if not n.is_extern)
    return node


def test_the_output_dims_that_run_together_in_every_tensor_merge_exactly():
    graph = _graph("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", {"A": (3, 5, 4, 2), "B": (6, 4, 2)})
    (site,) = MERGE_DIMS.sites(graph)
    merged = MERGE_DIMS.apply(graph, site)
    node = _kernel(merged)
    assert merged.type_of[node.inputs[0]].shape == (15, 4, 2)  # A: j, i as one dim, a free reshape
    assert merged.type_of[node.inputs[1]].shape == (6, 4, 2)  # B reads neither: untouched
    assert merged.type_of[node.outputs[0]].shape == (6, 15)
    assert merged.type_of[merged.outputs[0]].shape == (6, 3, 5)  # the graph's output keeps its shape
    rng = np.random.default_rng(1)
    feed = {"A": rng.standard_normal((3, 5, 4, 2)), "B": rng.standard_normal((6, 4, 2))}
    want = evaluate(graph, feed)[graph.outputs[0]]
    np.testing.assert_allclose(evaluate(merged, feed)[merged.outputs[0]], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(want, np.einsum("jiml,kml->kji", feed["A"], feed["B"]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("text, shapes, constant, extents", [
    ("C[k,j,i] += A[i,j,r] * B[k,r]", {"A": (5, 3, 4), "B": (6, 4)}, None, None),  # j, i swapped in A
    ("C[k,j,i] += A[j,r,i] * B[k,r]", {"A": (3, 4, 5), "B": (6, 4)}, None, None),  # r between them
    ("C[k,j,i] += A[j,i,r] * B[k,j,r]", {"A": (3, 5, 4), "B": (6, 3, 4)}, None, None),  # B reads j but not i
    ("C[k,j,i] += A[j,i,r] * A[j,i,r] * B[k,r]", {"A": (3, 5, 4), "B": (6, 4)}, None, None),  # (one reshape each)
    ("C[k,j,i] += A[j,2*i,r] * B[k,r]", {"A": (3, 10, 4), "B": (6, 4)}, None, {"i": 5}),  # a strided read
    ("C[k,j,i] += A[j,i,r] * B[k,r]", {"A": (3, 5, 4), "B": (6, 4)}, "A", None),  # a constant operand
    ("C[j,i] = A[j,i] * 2.0", {"A": (3, 5)}, None, None),  # no contraction
    ("C[k,j,i] += A[j,i,i,r] * B[k,r]", {"A": (3, 5, 5, 4), "B": (6, 4)}, None, None),  # a diagonal
    # A's output dims are k, j, i: j, i would be one of its two free dims, tiled beside k
    ("C[k,j,i] += A[k,j,i,r] * B[k,r]", {"A": (6, 3, 5, 4), "B": (6, 4)}, None, None),
])
def test_dims_that_do_not_run_together_in_every_tensor_are_no_site(text, shapes, constant, extents):
    graph = _graph(text, shapes, constant, extents)
    assert MERGE_DIMS.sites(graph) == []
    if constant is None:
        with pytest.raises(RuleNotApplicable):
            MERGE_DIMS.apply(graph, (_kernel(graph).name,))


def test_an_innermost_dim_of_whole_vectors_is_left_alone():
    graph = _graph("C[k,j,i] += A[j,i,r] * B[k,r]", {"A": (3, 32, 4), "B": (6, 4)})
    assert MERGE_DIMS.sites(graph)
    assert merge_dims_where(graph, 16) is graph
    assert merge_dims_where(_graph("C[k,j,i] += A[j,i,r] * B[k,r]", {"A": (3, 20, 4), "B": (6, 4)}), 16) is not graph


def test_the_op_runs_a_permuted_contraction_over_the_merged_dim_with_a_packed_panel_matching_einsum():
    import superopt
    from superopt.schedule.primitives import Pack, Vectorize

    a = np.random.default_rng(2).standard_normal((5, 46, 9, 7)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((70, 9, 7)).astype(np.float32)
    op = superopt.op("C[k,j,i] += A[j,i,m,l] * B[k,m,l]", threads=2)
    prog = op.program(a, b)
    node = _kernel(prog.executor.graph)
    assert prog.executor.graph.type_of[node.outputs[0]].shape == (70, 230)
    trace = prog.executor.traces[node.name]
    # the 230 columns split in whole vectors, each panel of the column operand packed (46 columns of i under j
    # split only by whole rows of 46 before)
    assert sum(isinstance(p, Vectorize) for p in trace) == 1
    assert any(isinstance(p, Pack) and p.split_axis >= 0 and p.factor % 16 == 0 for p in trace), trace
    got = op(a, b)
    np.testing.assert_allclose(got, np.einsum("jiml,kml->kji", a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    assert np.count_nonzero(got) > got.size // 2
