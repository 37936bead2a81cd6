"""The graph search's kernel cost sees strides: on kernels whose answer is known (the same loops reading an
operand contiguously, packed, or with a large stride along the vector loop), the strided one is predicted
several times slower, as it measures, where a flops-and-bytes roofline predicts them equal."""

from __future__ import annotations

from search.graph.cost import Ceilings, GraphCost
from superopt.lang import compile_op
from superopt.schedule.default import default_schedule
from superopt.schedule.primitives import Pack, PackAt
from superopt.target import avx512_target

CEILINGS = Ceilings(flops_per_s=2.3e11, bytes_per_s=1.8e10, launch_s=1e-6, source="test ceilings")
# the capsule votes' conv as an exported model with the weight as an input runs it: the weight's output-channel
# axis is outermost, so a loop vectorized over output channels reads it with a stride of 3*3*128
CAPSULE_CONV = "out0[d0,d1,d2,d3,d4] += in0[d0,2*d2+d6,2*d3+d7,d5] * in1[16*d1+d4,d6,d7,d5]"


def _capsule():
    return compile_op(CAPSULE_CONV, {"in0": (32, 15, 15, 128), "in1": (128, 3, 3, 128)},
                      extents={"d1": 8, "d4": 16, "d2": 7, "d3": 7, "d6": 3, "d7": 3})


def _estimates(cost: GraphCost, compute, traces):
    roof = cost.roofline(compute, sum(compute.type_of[n].nbytes for n in (*compute.inputs, *compute.outputs)))
    return roof, [cost.scheduled(compute, frozenset(), roof, t) for t in traces]


def test_an_unpacked_strided_weight_is_predicted_an_order_of_magnitude_slower_than_the_packed_one():
    """Measured side by side on an AMD EPYC at 2 threads: 44 ms unpacked, 3 ms packed."""
    target = avx512_target()
    c = _capsule()
    cost = GraphCost(CEILINGS, target)
    packed = default_schedule(c, target, frozenset())
    assert any(isinstance(p, Pack) and p.stage == "in1" for p in packed)
    unpacked = [p for p in packed if not isinstance(p, Pack)]
    roof, (fast, slow) = _estimates(cost, c, [packed, unpacked])
    assert fast.how == slow.how == "schedule"
    assert 5.0 <= slow.seconds / fast.seconds <= 40.0, (fast, slow)
    assert slow.seconds > 10 * roof.seconds  # the roofline alone cannot tell them apart
    assert cost.kernel(c).seconds == fast.seconds  # the graph search costs the kernel by its default schedule


def test_the_same_loops_read_a_transposed_operand_slower():
    target = avx512_target()
    shapes = {"A": (256, 256), "B": (256, 256)}
    contiguous = compile_op("C[i,j] += A[i,k] * B[k,j]", shapes)
    transposed = compile_op("C[i,j] += A[i,k] * B[j,k]", shapes)
    # (without its packs: the box packs of a panel go with them)
    trace = [p for p in default_schedule(contiguous, target, frozenset()) if not isinstance(p, (Pack, PackAt))]
    cost = GraphCost(CEILINGS, target)
    _, (fast,) = _estimates(cost, contiguous, [trace])
    _, (slow,) = _estimates(cost, transposed, [trace])
    assert slow.seconds >= 4 * fast.seconds, (fast, slow)


def test_without_a_target_or_with_schedules_off_the_cost_is_the_roofline():
    c = _capsule()
    for cost in (GraphCost(CEILINGS), GraphCost(CEILINGS, avx512_target(), schedules=False)):
        est = cost.kernel(c)
        assert est.how == "roofline" and "default schedule" not in cost.method


# a Winograd-style transform: the row r picks one of three combinations of strided reads (X walked along c by the
# vector loop with a stride of 64); unrolled over r, each copy folds the chain to one branch
ROWS = "O[r,c] = where(r == 0, X[c,0] - X[c,2], where(r == 1, X[c,1] + X[c,2], X[c,3] - X[c,1]))"
DATA = "O[r,c] = where(M[r,c] > 0, X[c,0] - X[c,2], where(M[r,c] < -1, X[c,1] + X[c,2], X[c,3] - X[c,1]))"


def _gathers(src, shapes):
    from costmodel.base import Candidate
    from costmodel.features import named_features
    from superopt.schedule.primitives import Unroll, Vectorize

    c = compile_op(src, shapes, extents={"r": 3})
    f = named_features(Candidate(c, (Unroll("O", "r"), Vectorize("O", "c")), avx512_target(2), frozenset()))
    return f["mem.vector_gathers"]


def test_a_chain_of_where_on_loop_indices_counts_one_branch_of_strided_reads():
    """6 strided reads over 3 branches: each evaluation reads 2 of them (a third of the reads, not all 6);
    a condition on the data keeps them all counted (a vector computes both sides of its select)."""
    on_index = _gathers(ROWS, {"X": (64, 64)})
    on_data = _gathers(DATA, {"X": (64, 64), "M": (3, 64)})
    assert abs(on_index - 3 * 64 * 2) < 1.0, on_index
    assert abs(on_data - 3 * 64 * 6) < 1.0, on_data
