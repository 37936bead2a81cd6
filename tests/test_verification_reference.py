"""The verification's reference computed beside the pipeline: in a forked child or on a thread, the same
runs; the child's failure is raised in the parent; a dropped handle stops its child."""

import os
import time

import numpy as np
import pytest

import superopt.verification as verification
from superopt.api import define_op
from superopt.verification import ForkedReference, VerificationError, start_reference

SRC = "H[i,j] += A[i,k] * B[k,j]; C[i,j] = max(H[i,j], 0.0)"
SHAPES = {"A": (16, 8), "B": (8, 12)}


@pytest.fixture(scope="module")
def graph():
    return define_op(SRC, SHAPES)


def test_the_forked_reference_is_the_threads(graph):
    forked = start_reference(graph, seed=3, process=True)
    assert isinstance(forked, ForkedReference)
    got, want = forked.result(), start_reference(graph, seed=3, process=False).result()
    assert got.outputs == want.outputs and len(got.feeds) == len(want.feeds) == 1
    for (ref, mags), (ref2, mags2) in zip(got.expected, want.expected):
        for o in got.outputs:
            np.testing.assert_array_equal(ref[o], ref2[o])
            np.testing.assert_array_equal(mags[o], mags2[o])
    a, b = got.feeds[0]["A"], got.feeds[0]["B"]
    np.testing.assert_allclose(got.expected[0][0]["C"], np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-12)


def test_the_childs_failure_is_raised_in_the_parent(graph, monkeypatch):
    def fails(*a, **k):
        raise ValueError("no reference for this graph")

    monkeypatch.setattr(verification, "reference_runs", fails)  # (the child is forked with it)
    with pytest.raises(ValueError, match="no reference for this graph"):
        start_reference(graph, process=True).result()


def test_a_killed_child_is_a_verification_error_and_a_dropped_handle_stops_its_child(graph, monkeypatch):
    monkeypatch.setattr(verification, "reference_runs", lambda *a, **k: time.sleep(60))
    ref = start_reference(graph, process=True)
    ref.cancel()
    with pytest.raises(VerificationError, match="without a result"):
        ref.result()
    ref = start_reference(graph, process=True)
    pid = ref.pid
    del ref  # collected: the child is killed, not left to run out its minute
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # (still there, or a zombie not yet reaped by the drain thread)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the dropped reference's child still runs")
