"""resnet50 and squeezenet (onnx's light models, seeded random weights) match onnxruntime."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from superopt.frontends.light_models import (  # noqa: E402
    light_model_inputs,
    randomized_light_model,
    run_onnxruntime,
    run_superopt,
)


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_model_matches_onnxruntime(name):
    model = randomized_light_model(name, seed=0)
    feed = light_model_inputs(model, seed=0)
    want = run_onnxruntime(model, feed)
    got = run_superopt(model, feed, dtype=np.float64)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=False):
        assert g.shape == w.shape
        assert np.abs(w).max() > 1e-3  # the random weights keep the output informative
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_backend_returns_float32_in_model_order():
    import superopt.backend as be

    model = randomized_light_model("squeezenet", seed=1)
    feed = light_model_inputs(model, seed=1)
    out = be.prepare(model).run(list(feed.values()))
    assert len(out) == 1 and out[0].dtype == np.float32
    np.testing.assert_allclose(out[0], run_onnxruntime(model, feed)[0], rtol=1e-3, atol=1e-5)
