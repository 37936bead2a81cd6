"""resnet50, squeezenet and densenet121 (onnx's light models, seeded random weights) match onnxruntime."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from superopt.frontends.light_models import (  # noqa: E402
    light_model_inputs,
    randomized_light_model,
    run_onnxruntime,
    run_superopt,
)


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "densenet121"])  # (densenet: many kernels merged)
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


@pytest.mark.parametrize("name", ["inception_v1", "shufflenet"])
def test_calibrated_classifier_keeps_the_softmax_informative(name):
    """Uncalibrated, these two models' random weights make the softmax one-hot; calibrated, many classes
    share the probability, and the classifier's weights differ from the uncalibrated ones by one power
    of two."""
    raw = randomized_light_model(name, seed=0, calibrate=False)
    model = randomized_light_model(name, seed=0)
    feed = light_model_inputs(model, seed=0)
    assert run_onnxruntime(raw, feed)[0].max() > 0.99
    probs = run_onnxruntime(model, feed)[0]
    assert probs.max() < 0.5 and (probs > 1e-3).sum() > 50
    before = {t.name: t for t in raw.graph.initializer}
    ratios = set()
    for t in model.graph.initializer:
        a, b = (np.frombuffer(x.raw_data, np.float32) if x.raw_data else np.asarray(x.float_data, np.float32)
                for x in (t, before[t.name]))
        if a.size and not np.array_equal(a, b):
            ratios.add(float(np.median(a[b != 0] / b[b != 0])))
    assert len(ratios) == 1 and np.log2(ratios.pop()).is_integer()
