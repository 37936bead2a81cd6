"""The zero-measurement picks' allowance counts the kernels a pick can pay on: each distinct kernel left to
pick that carries at least 1% of the graph's work (equal kernels together), at least the floor."""

import numpy as np
import pytest

from search.schedule.model_guided import PickAllowance
from superopt.builder import GraphBuilder
from superopt.ir.graph import Graph
from superopt.runtime.kernel import kernel_work


def _graph() -> Graph:
    """A 128^3 matmul (about 92% of the work), its relu (6%) and two equal row sums of the relu (0.7% each)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("allowance")
    x = b.input("x", (128, 128))
    w = b.constant(rng.standard_normal((128, 128)).astype(np.float32), "w")
    mm = b.compute1("O[i,j] += X[i,k] * W[k,j]", {"X": x, "W": w}, "mm")
    r = b.compute1("O[i,j] = relu(A[i,j])", {"A": mm}, "relu")
    s1 = b.compute1("O[i] += R[i,j]", {"R": r}, "sum1")
    s2 = b.compute1("O[i] += R[i,j]", {"R": r}, "sum2")
    return b.build([s1, s2])


def _shares(g: Graph) -> dict[str, float]:
    work = {n.name: kernel_work(n.op) for n in g.nodes if not n.is_extern}
    return {k: v / sum(work.values()) for k, v in work.items()}


def test_the_planted_shares():
    g = _graph()
    shares = _shares(g)
    names = {n.name: n for n in g.nodes}
    assert shares["mm"] > 0.9 and 0.05 < shares["relu"] < 0.1
    assert 0.005 < shares["sum1"] == shares["sum2"] < 0.01 < 2 * shares["sum1"]
    assert names["sum1"].op.digest() == names["sum2"].op.digest()  # one kernel, run twice


def test_heavy_kernels_count_and_equal_kernels_add_their_work():
    g = _graph()
    # mm, relu, and the row sum (1.4% of the work as two nodes, under 1% each)
    assert PickAllowance(per_kernel_s=1.0, min_s=0.5).seconds(g) == pytest.approx(3.0)
    # at a 2% share the row sum no longer counts
    assert PickAllowance(per_kernel_s=1.0, min_s=0.5, min_share=0.02).seconds(g) == pytest.approx(2.0)
    # a kernel the database serves is not picked: it adds nothing (its work still counts in the whole)
    assert PickAllowance(per_kernel_s=1.0, min_s=0.5).seconds(g, skip=["mm"]) == pytest.approx(2.0)
    # one node of the row sum skipped: the other carries 0.7%, under the share
    assert PickAllowance(per_kernel_s=1.0, min_s=0.5).seconds(g, skip=["sum1"]) == pytest.approx(2.0)


def test_the_floor_holds():
    g = _graph()
    assert PickAllowance(per_kernel_s=1.0, min_s=5.0).seconds(g) == pytest.approx(5.0)
    assert PickAllowance(per_kernel_s=1.0, min_s=0.5).seconds(g, skip=["mm", "relu", "sum1", "sum2"]) == 0.5
