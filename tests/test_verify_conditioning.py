"""Verification that knows conditioning: each element's error is measured against the largest reference
magnitude widened by the magnitude of what the element is computed from, so a correct kernel on
ill-conditioned inputs (sums that nearly cancel, divided by) passes, and a wrong one still fails."""

import numpy as np
import pytest

from rewrite_rules.moments import EM
from superopt.api import OptimizeConfig, VerificationError, define_op, optimize, random_inputs, verify
from superopt.interp import evaluate, evaluate_compute
from superopt.interp.magnitude import U32, compute_magnitudes, graph_magnitudes
from superopt.interp.tolerance import CONDITIONING_WEIGHT, check_output
from superopt.lang.parser import compile_op
from superopt.measure.worker import outputs_match

B, X, K, I, O, RR, P = 2, 6, 3, 8, 4, 4, 4
SHAPES = {"P": (B, X + K - 1, X + K - 1, I, RR), "W": (K, K, I, O, RR, P), "R": (B, O, X, X, I)}


def cancelling_feed(graph, eps=1e-5, seed=0):
    """Random inputs whose routing weights sum to about ``eps`` times their absolute sum, for every (b, o)."""
    feed = random_inputs(graph, seed)
    r = feed["R"].astype(np.float64)
    r -= r.mean(axis=(2, 3, 4), keepdims=True)
    r += eps * np.abs(r).mean(axis=(2, 3, 4), keepdims=True)
    feed["R"] = r.astype(np.float32)
    return feed


@pytest.fixture(scope="module")
def em():
    graph = define_op(EM, SHAPES)
    return graph, optimize(graph, OptimizeConfig(threads=1))


def old_rule_error(graph, executor, feed):
    got, ref = executor(feed), evaluate(graph, feed, np.float64)
    return max(float(np.abs(got[o] - ref[o]).max() / np.abs(ref[o]).max()) for o in graph.outputs)


def test_a_sum_of_products_magnitude_is_the_reference_on_absolute_values():
    c = compile_op("Y[i,j] += A[i,k] * B[k,j]", {"A": (3, 5), "B": (5, 4)})
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 4))
    (m,) = compute_magnitudes(c, [a, b], samples=0)
    np.testing.assert_allclose(m, 2 * np.abs(a) @ np.abs(b))  # one rounding per product and per add


def test_a_quotient_by_a_cancelling_sum_inherits_its_conditioning():
    c = compile_op("S[i] += X[i,j]\nY[i,j] = X[i,j] / S[i]", {"X": (4, 64)})
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64))
    x[:2] -= x[:2].mean(1, keepdims=True) - 1e-5  # rows 0 and 1 sum to 64e-5
    (m,) = compute_magnitudes(c, [x])
    (y,) = evaluate_compute(c, [x], np.float64)
    cond = (m / np.abs(y)).min(1)
    assert cond[:2].min() > 100 * cond[2:].max()  # the cancelling rows, and only they, are ill-conditioned


def test_em_routing_on_cancelling_weights_passes_where_the_largest_magnitude_rule_fails(em):
    graph, prog = em
    feed = cancelling_feed(graph)
    assert old_rule_error(graph, prog.executor, feed) > 1e-3  # the rule this replaces fails a correct program
    assert verify(graph, prog.executor, inputs=feed, rtol=1e-3) <= 1e-3


@pytest.mark.parametrize("factor", [1.01, 0.995])
def test_a_perturbed_output_fails_even_with_cancelling_user_inputs(em, monkeypatch, factor):
    graph, prog = em
    ex = prog.executor
    real = type(ex).__call__
    monkeypatch.setattr(type(ex), "__call__", lambda self, feed: {k: v * factor for k, v in real(self, feed).items()})
    with pytest.raises(VerificationError, match="relative error"):
        verify(graph, ex, inputs=cancelling_feed(graph), rtol=1e-3)


def test_on_cancelling_inputs_alone_a_correct_kernel_passes_and_a_wrong_output_fails(em):
    # 1e-4: the weights' sum is 1e-4 of their magnitude, so float32 loses 4 digits on it; a 10% error is
    # still far beyond what rounding explains, and the correct kernel passes with room to spare
    graph, prog = em
    feed = cancelling_feed(graph, eps=1e-4)
    got, ref = prog.executor(feed), evaluate(graph, feed, np.float64)
    mags = graph_magnitudes(graph, feed)
    assert check_output("VAR", got["VAR"], ref["VAR"], mags["VAR"], 1e-3).error < 1e-4
    for factor in (1.1, 0.9):
        assert not check_output("VAR", got["VAR"] * factor, ref["VAR"], mags["VAR"], 1e-3).ok


def test_a_wrong_index_fails_even_on_cancelling_weights(em):
    graph, _ = em
    wrong = define_op(EM.replace("P[b,x+kx,y+ky,i,r]", "P[b,x+ky,y+kx,i,r]"), SHAPES)  # the window transposed
    prog = optimize(wrong, OptimizeConfig(threads=1))
    feed = cancelling_feed(graph)
    got, ref = prog.executor(feed), evaluate(graph, feed, np.float64)
    assert not check_output("VAR", got["VAR"], ref["VAR"], graph_magnitudes(graph, feed)["VAR"], 1e-3).ok
    with pytest.raises(VerificationError):
        verify(graph, prog.executor, inputs=feed, rtol=1e-3)


def test_the_measurement_worker_uses_the_same_rule():
    c = compile_op("S[i] += X[i,j]\nY[i,j] = X[i,j] / S[i]", {"X": (4, 64)})
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64))
    x -= x.mean(1, keepdims=True) - 1e-5  # each row sums to 64e-5 against an absolute sum of about 50
    x32 = x.astype(np.float32)
    (ref,) = evaluate_compute(c, [x32], np.float64)
    (f32,) = evaluate_compute(c, [x32], np.float32)  # a correct float32 evaluation
    mags = compute_magnitudes(c, [x32])
    assert not outputs_match([f32], [ref], 1e-3, 0.0)[0]  # judged by the largest magnitude alone: fails
    assert outputs_match([f32], [ref], 1e-3, 0.0, mags) == (True, "")
    for wrong in (f32 * 1.1, f32[::-1]):  # a perturbed output, rows swapped
        ok, msg = outputs_match([wrong], [ref], 1e-3, 0.0, mags)
        assert not ok and "relative error" in msg


def test_non_float_outputs_must_be_equal_and_nans_where_the_reference_has_them():
    assert not check_output("y", np.array([1, 2]), np.array([1, 3]), None, 1e-3).ok
    assert not check_output("y", np.array([np.nan, 1.0]), np.array([0.0, 1.0]), None, 1.0).ok
    assert check_output("y", np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), None, 1e-3).ok
    # the scale: the largest reference value, widened by CONDITIONING_WEIGHT times the magnitude
    r, m = np.array([1.0, 1e-6]), np.array([1.0, 64.0])
    allowed = 1e-3 * (1.0 + CONDITIONING_WEIGHT * 64.0)
    assert check_output("y", r + [0, 0.9 * allowed], r, m, 1e-3).ok
    assert not check_output("y", r + [0, 1.1 * allowed], r, m, 1e-3).ok
    assert U32 == 2.0**-24
