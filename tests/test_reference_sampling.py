"""Verification of a large program against the float64 reference on a sample of its independent axes: the
reference on the sampled inputs equals the whole reference at those indices, only one-to-one axes are sampled,
and a program wrong at a sampled index (the first, the last, where tile tails are) still fails."""

import numpy as np
import pytest

from rewrite_rules.moments import EM
from superopt.api import OptimizeConfig, VerificationError, define_op, optimize, random_inputs, verify
from superopt.interp import evaluate
from superopt.interp.sampling import MIN_KEEP, sample_axes

B, X, K, I, O, RR, P = 3, 6, 3, 8, 7, 4, 9
SHAPES = {"P": (B, X + K - 1, X + K - 1, I, RR), "W": (K, K, I, O, RR, P), "R": (B, O, X, X, I)}
FEW = 20_000  # iteration points: far fewer than the EM graph's, so it is sampled


@pytest.fixture(scope="module")
def em():
    graph = define_op(EM, SHAPES)
    return graph, optimize(graph, OptimizeConfig(threads=1, reference_points=None))


def sampled_axes(sample):
    return {name: tuple(ax for ax, _ in axes) for name, axes in sample.keep.items()}


def test_only_one_to_one_axes_are_sampled_and_ends_are_kept(em):
    graph, _ = em
    sample = sample_axes(graph, FEW)
    axes = sampled_axes(sample)
    # b, o, p map one to one; x, y (shifted by the window) and i, r, kx, ky (summed) never are
    assert set(axes.get("P", ())) <= {0} and set(axes["W"]) <= {3, 5} and set(axes["R"]) <= {0, 1}
    assert axes["W"] and axes["VAR"]
    # an output's axis is sampled with the input axes it maps to: VAR[b,o,p] with P's b, W's o and p
    assert set(axes["VAR"]) == {ax for ax, on in ((0, 0 in axes.get("P", ())), (1, 3 in axes["W"]), (2, 5 in axes["W"]))
                               if on}
    for _, idx in sample.keep["VAR"]:
        assert idx[0] == 0 and len(idx) >= MIN_KEEP and np.all(np.diff(idx) > 0)
    for (_, idx), n in zip(sample.keep["VAR"], [graph.type_of["VAR"].shape[ax] for ax, _ in sample.keep["VAR"]]):
        assert idx[-1] == n - 1


def test_the_sampled_reference_is_the_whole_reference_at_those_indices(em):
    graph, _ = em
    sample = sample_axes(graph, FEW)
    feed = random_inputs(graph, 3)
    whole = evaluate(graph, feed, np.float64)
    part = evaluate(sample.graph, sample.take_all(feed), np.float64)
    for o in graph.outputs:
        np.testing.assert_allclose(part[o], sample.take(o, whole[o]), rtol=1e-12, atol=0)


def test_a_small_graph_is_not_sampled(em):
    graph, _ = em
    assert sample_axes(graph) is None
    assert sample_axes(graph, None) is None


def test_a_correct_program_passes_on_a_sample_with_cancelling_weights(em):
    graph, prog = em
    feed = random_inputs(graph, 1)
    r = feed["R"].astype(np.float64)
    r -= r.mean(axis=(2, 3, 4), keepdims=True) - 1e-5 * np.abs(r).mean(axis=(2, 3, 4), keepdims=True)
    feed["R"] = r.astype(np.float32)
    assert verify(graph, prog.executor, inputs=feed, rtol=1e-3, reference_points=FEW) <= 1e-3


@pytest.mark.parametrize("where", [0, -1])
def test_a_program_wrong_at_a_sampled_end_fails(em, monkeypatch, where):
    graph, prog = em
    ex = prog.executor
    real = type(ex).__call__

    def wrong(self, feed):
        out = dict(real(self, feed))
        var = out["VAR"].copy()
        var[..., where] *= 1.01  # the first or last p: a tile's head or tail
        out["VAR"] = var
        return out

    feed = random_inputs(graph, 2)
    feed["R"] = np.abs(feed["R"])  # routing weights: positive, so a 1% error of VAR is far beyond rounding
    assert verify(graph, ex, inputs=feed, random=False, rtol=1e-3, reference_points=FEW) <= 1e-3
    monkeypatch.setattr(type(ex), "__call__", wrong)
    with pytest.raises(VerificationError, match="checked on a sample"):
        verify(graph, ex, inputs=feed, random=False, rtol=1e-3, reference_points=FEW)


def test_a_wrong_window_fails_on_a_sample(em):
    graph, _ = em
    wrong = define_op(EM.replace("P[b,x+kx,y+ky,i,r]", "P[b,x+ky,y+kx,i,r]"), SHAPES)
    prog = optimize(wrong, OptimizeConfig(threads=1, reference_points=None))
    with pytest.raises(VerificationError):
        verify(graph, prog.executor, rtol=1e-3, reference_points=FEW)


def test_optimize_verifies_a_large_graph_on_a_sample():
    text = "T[i,j,k] += A[i,k,r] * B[r,j]\nS[i,j] += T[i,j,k]\nQ[i,j] += T[i,j,k] * T[i,j,k]"
    graph = define_op(text, {"A": (40, 30, 8), "B": (8, 24)})
    sample = sample_axes(graph, FEW)
    assert set(sampled_axes(sample)["A"]) <= {0} and set(sampled_axes(sample)["B"]) <= {1}
    prog = optimize(graph, OptimizeConfig(threads=1, reference_points=FEW))
    feed = random_inputs(graph, 0)
    got, ref = prog.executor(feed), evaluate(graph, feed, np.float64)
    np.testing.assert_allclose(got["Q"], ref["Q"], rtol=1e-4)
