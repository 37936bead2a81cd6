"""The graph cost prices a stride-2 vector read as two contiguous loads and a shuffle per vector, not as a gather
of every element: of three depthwise 3x3 convs with the same outputs (112 channels of 28 x 28), stride 1, 2 and 3,
it ranks them as they run (each stride about twice the time of the one before), where charging every strided
element as a gather priced stride 2 as stride 3."""

import pytest

from search.graph.cost import Ceilings, GraphCost
from superopt.lang import compile_op
from superopt.target import host_target

DW = "O[c,y,x] += X[c,{s}*y+kh,{s}*x+kw] * W[c,kh,kw]"


def _cost(stride: int, cost: GraphCost) -> float:
    side = stride * 27 + 3  # (28 outputs a row for every stride)
    c = compile_op(DW.format(s=stride), {"X": (112, side, side), "W": (112, 3, 3)})
    assert c.type_of["O"].shape == (112, 28, 28)
    return cost.kernel(c, frozenset({"W"})).seconds


@pytest.mark.parametrize("threads", [1, 2])
def test_stride_two_reads_rank_between_contiguous_and_gathered(threads):
    target = host_target(threads)
    if target.lanes("float32") < 8:
        pytest.skip("no vector unit to gather into")
    # (fixed ceilings: the ranking is the model's, not this machine's)
    cost = GraphCost(Ceilings(117e9 * threads, 36e9 * threads, 1e-6), target)
    s1, s2, s3 = (_cost(s, cost) for s in (1, 2, 3))
    assert s1 < s2 < s3
