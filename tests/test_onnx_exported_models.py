"""Real models exported from PyTorch (torch.onnx.export, dynamo) import, with fallbacks where superopt has no
native lowering, and match onnxruntime within 1e-4 (relative to each output's largest magnitude)."""

import functools

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from superopt.api import OptimizeConfig, optimize  # noqa: E402
from superopt.frontends.onnx_fallback import KIND  # noqa: E402
from superopt.testing.exported_models import EXPORT_OPSET, export_model, max_rel_error, ort_session  # noqa: E402

# ops each model must contain, so the test covers what the issue names
MUST_HAVE = {
    "unet": {"ConvTranspose", "Resize", "GroupNormalization", "Concat"},
    "gpt_block": {"Where", "Concat", "Softmax", "MatMul", "ReduceMean"},  # causal mask, KV-cache, RMSNorm
    "detection_head": {"TopK", "ArgMax", "GatherElements"},
    "lstm_tagger": {"LSTM", "Gather"},
}


@functools.cache
def _exported(name):
    return export_model(name)


@pytest.mark.parametrize("name", sorted(MUST_HAVE))
def test_exported_model_matches_onnxruntime(name):
    model, feed = _exported(name)
    assert {o.version for o in model.opset_import if o.domain == ""} == {EXPORT_OPSET}
    assert MUST_HAVE[name] <= {n.op_type for n in model.graph.node}
    prog = optimize(model, feed, OptimizeConfig(cost_model=None))
    externs = [n for n in prog.graph.nodes if n.is_extern and n.op.kind == KIND]
    assert len(externs) == len(prog.report.fallbacks)  # every fallback is reported, nothing else falls back
    want = ort_session(model).run(None, feed)
    got = prog(**feed)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert max_rel_error(g, w) <= 1e-4
    # a second input: the compiled program is not tied to the example values
    rng = np.random.default_rng(7)
    other = {k: (rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else
                 rng.integers(0, 50, v.shape).astype(v.dtype)) for k, v in feed.items()}
    for g, w in zip(prog(**other), ort_session(model).run(None, other)):
        assert max_rel_error(g, w) <= 1e-4
