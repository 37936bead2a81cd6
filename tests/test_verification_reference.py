"""The verification's reference computed beside the pipeline: in a forked child or on a thread, the same
runs; the child's failure is raised in the parent; a dropped handle stops its child."""

import os
import sys
import time

import numpy as np
import pytest

import superopt.verification as verification
from superopt.api import define_op
from superopt.verification import ForkedReference, VerificationError, start_reference

SRC = "H[i,j] += A[i,k] * B[k,j]; C[i,j] = max(H[i,j], 0.0)"
SHAPES = {"A": (16, 8), "B": (8, 12)}


# the forked reference is Linux's (elsewhere the thread runs it)
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reference forks on Linux only")


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


def test_a_reference_that_calls_onnxruntime_runs_on_a_thread(monkeypatch):
    from onnx import TensorProto, helper

    from superopt.frontends.onnx_fallback import KIND
    from superopt.frontends.onnx_frontend import import_onnx_model
    from superopt.frontends.onnx_ops import CONVERTERS
    from superopt.verification import FOREIGN_EXTERN, runs_foreign_code

    assert FOREIGN_EXTERN == KIND
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    # Det without its native lowering: an onnx_node extern, run by an onnxruntime session (cached per process)
    monkeypatch.delitem(CONVERTERS, "Det", raising=False)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"])], "g", [x], [y])
    imported = import_onnx_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), strict=False).graph
    assert runs_foreign_code(imported) and not runs_foreign_code(define_op(SRC, SHAPES))
    ref = start_reference(imported, process=True)
    assert not isinstance(ref, ForkedReference)
    runs = ref.result()
    x = runs.feeds[0][imported.inputs[0]].astype(np.float64)
    np.testing.assert_allclose(runs.expected[0][0][imported.outputs[0]], np.linalg.det(np.maximum(x, 0)), rtol=1e-4)
