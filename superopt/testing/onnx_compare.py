"""Run an ONNX model through superopt's backend and onnxruntime on the same feeds, and compare."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def backend_matches_onnxruntime(model, feeds: Sequence[Mapping[str, np.ndarray]], rtol: float = 1e-5,
                                atol: float = 1e-6):
    """Prepare ``model`` once with :mod:`superopt.backend`, run every feed through it and through
    onnxruntime, and assert equal shapes, dtypes and values within ``rtol``/``atol``. Returns the
    prepared backend rep (for further checks on the compiled program)."""
    import onnxruntime as ort

    from superopt import backend

    rep = backend.prepare(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in model.graph.input]
    for feed in feeds:
        got = rep.run([feed[n] for n in names])
        for g, w in zip(got, ref.run(None, feed), strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return rep
