"""Every op-table case, built into a Graph and run by the reference interpreter, matches its reference."""

import numpy as np
import pytest

from superopt.interp import evaluate
from superopt.testing.op_table import CASES, case_graph, case_reference


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_matches_reference(case):
    graph, feed = case_graph(case)
    got = evaluate(graph, feed)
    want = case_reference(case)
    assert len(graph.outputs) == len(want)
    for name, w in zip(graph.outputs, want, strict=False):
        g = got[name]
        assert g.shape == w.shape, f"{case.name}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype or (g.dtype.kind == w.dtype.kind == "f"), (
            f"{case.name}: {g.dtype} vs {w.dtype}"
        )
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol, err_msg=case.name)
