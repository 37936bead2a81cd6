"""A candidate lowered once serves both of its readings: the features and the strided vector reads taken from
:func:`costmodel.features.lowered` are those each computes by lowering the candidate itself (the graph cost
reads both off one loop nest per kernel estimate)."""

import math

import pytest

from costmodel.base import Candidate
from costmodel.features import lowered, named_features, strided_vector_reads
from superopt.lang import compile_op
from superopt.schedule.default import default_schedule
from superopt.schedule.primitives import Split
from superopt.target import host_target

# depthwise convs of stride 2 and 3: their image read with a stride in the vector loop
OPS = [("O[c,y,x] += X[c,2*y+kh,2*x+kw] * W[c,kh,kw]", {"X": (16, 33, 33), "W": (16, 3, 3)}, {"W"}),
       ("O[c,y,x] += X[c,3*y+kh,3*x+kw] * W[c,kh,kw]", {"X": (16, 48, 48), "W": (16, 3, 3)}, {"W"})]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x == y or math.isnan(x) and math.isnan(y) for x, y in
                                        ((a[k], b[k]) for k in a))


@pytest.mark.parametrize("src,shapes,consts", OPS)
def test_one_lowering_gives_what_each_reading_computes_alone(src, shapes, consts):
    target = host_target(2)
    c = compile_op(src, shapes)
    cand = Candidate(c, tuple(default_schedule(c, target, frozenset(consts))), target, frozenset(consts))
    once = lowered(cand)
    assert once is not None
    assert _same(named_features(cand, once), named_features(cand))
    assert strided_vector_reads(cand, once) == strided_vector_reads(cand)
    assert sum(strided_vector_reads(cand).values()) > 0  # (both read with a stride in a vector loop)


def test_a_trace_that_does_not_lower_has_no_lowering_and_no_features():
    target = host_target(2)
    c = compile_op("O[i,j] = X[i,j] + 1.0", {"X": (8, 8)})
    cand = Candidate(c, (Split("nope", 2, ("a", "b")),), target)
    assert lowered(cand) is None
    assert named_features(cand) is None and named_features(cand, None) is None
    assert strided_vector_reads(cand) == {}
