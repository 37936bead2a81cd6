"""Register-tile rows of a contraction whose column operand is read with a stride along the vector: at most
``STRIDED_ROWS`` where every row gathers its own vectors (a stride-2 depthwise conv), the usual tile where the
vectors are read contiguously (a stride-2 conv vectorized over its output channels); each schedule compiles
and matches the reference."""

import numpy as np
import pytest

from superopt.builder import GraphBuilder
from superopt.interp import evaluate
from superopt.runtime.executor import ExecutorConfig, GraphExecutor
from superopt.schedule.contraction import STRIDED_ROWS, TILE_LOADS
from superopt.schedule.graph_defaults import default_schedules
from superopt.schedule.primitives import Split
from superopt.target import host_target


def _graph(src: str, shapes: dict[str, tuple[int, ...]]):
    b = GraphBuilder("g")
    ins = {k: b.input(k, s) for k, s in shapes.items()}
    return b.build([b.compute1(src, ins, "op")])


def _row_split(graph, dim: str) -> int | None:
    (node,) = graph.nodes
    trace = default_schedules(graph, host_target(2))[node.name]
    return next((p.factor for p in trace if isinstance(p, Split) and p.loop == dim), None)


def _check(graph, kernel_cache) -> None:
    (node,) = graph.nodes
    ex = GraphExecutor(graph, default_schedules(graph, host_target(2)), ExecutorConfig(threads=2, compiler=kernel_cache))
    rng = np.random.default_rng(0)
    feed = {k: rng.standard_normal(graph.type_of[k].shape).astype(np.float32) for k in graph.inputs}
    want = evaluate(graph, feed, np.float64)[graph.outputs[0]]
    np.testing.assert_allclose(ex(feed)[graph.outputs[0]], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw", [28, 14])
def test_a_stride_two_depthwise_conv_gets_a_short_tile(kernel_cache, hw):
    g = _graph("O[n,c,y,x] += X[n,c,2*y+kh,2*x+kw] * W[c,kh,kw]", {"X": (1, 24, 2 * hw + 1, 2 * hw + 1), "W": (24, 3, 3)})
    rows = _row_split(g, "y")
    assert rows is not None and rows <= STRIDED_ROWS
    _check(g, kernel_cache)


def test_a_stride_one_depthwise_conv_gets_rows_by_its_loads(kernel_cache):
    # 28 columns in 2 vectors (the second overlapping), 3 unrolled window columns: 6 loads a row, 4 rows
    g = _graph("O[n,c,y,x] += X[n,c,y+kh,x+kw] * W[c,kh,kw]", {"X": (1, 24, 30, 30), "W": (24, 3, 3)})
    assert _row_split(g, "y") == TILE_LOADS // 6
    _check(g, kernel_cache)


@pytest.mark.parametrize("rows,cols", [(19, 27), (13, 21)])
def test_a_stride_two_depthwise_conv_reads_even_elements_as_vectors(kernel_cache, rows, cols):
    """Odd extents: 27 (21) output columns held as 2 vectors of 16 (the last overlapping), each image vector the
    even elements of two contiguous loads (``so_ld16s2``); 2 rows a tile (12 loads a row); exact against the
    reference."""
    from superopt.codegen.c_emit import emit_c
    from superopt.loopnest.build import build_loopnest
    from superopt.schedule.plan import lower

    g = _graph("O[n,c,y,x] += X[n,c,2*y+kh,2*x+kw] * W[c,kh,kw]",
               {"X": (1, 5, 2 * rows + 1, 2 * cols + 1), "W": (5, 3, 3)})
    target = host_target(2)
    lanes = target.lanes("float32")
    (node,) = g.nodes
    trace = default_schedules(g, target)[node.name]
    if lanes == 16:
        assert _row_split(g, "y") == TILE_LOADS // 12
        code = emit_c(build_loopnest(lower(node.op, trace, target))).code
        assert f"so_ld{lanes}s2(" in code and f"SO_MIN({lanes} * x_vec, {cols - lanes})" in code
    _check(g, kernel_cache)


def test_a_stride_two_conv_vectorized_over_output_channels_keeps_its_tall_tile(kernel_cache):
    # (the vectors are the weights' output channels, read contiguously; the strided image rows are broadcast)
    g = _graph("O[n,co,y,x] += X[n,ci,2*y+kh,2*x+kw] * W[co,ci,kh,kw]", {"X": (1, 3, 33, 33), "W": (32, 3, 3, 3)})
    assert _row_split(g, "x") > STRIDED_ROWS
    _check(g, kernel_cache)
