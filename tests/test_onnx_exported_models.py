"""Real models exported from PyTorch (torch.onnx.export, dynamo) import, with fallbacks where superopt has no
native lowering, and match onnxruntime within 1e-4 (relative to each output's largest magnitude)."""

import functools

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from superopt.api import OptimizeConfig, OptimizedModel, optimize  # noqa: E402
from superopt.frontends.onnx_fallback import KIND  # noqa: E402
from superopt.testing.exported_models import EXPORT_OPSET, export_model, max_rel_error, ort_session  # noqa: E402

# ops each model must contain, so the test covers the ops these models are exported for
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


def test_exported_dynamic_batch_compiles_each_shape_once():
    """The detection head exported with a symbolic batch runs at batch 1, 4 and 7 through one OptimizedModel."""
    model, feed = export_model("detection_head", dynamic_batch=True)
    [(name, x)] = feed.items()
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # symbolic in the ONNX file
    prog = optimize(model, feed, OptimizeConfig(cost_model=None))
    assert isinstance(prog, OptimizedModel)
    rng = np.random.default_rng(3)
    xs = {b: rng.standard_normal((b,) + x.shape[1:]).astype(np.float32) for b in (1, 4, 7)}
    sess = ort_session(model)
    for b in (1, 4, 7, 4):
        for g, w in zip(prog(xs[b]), sess.run(None, {name: xs[b]})):
            assert g.shape == w.shape and max_rel_error(g, w) <= 1e-4
    assert [s[name][0] for s in prog.compiled_shapes] == [1, 4, 7] and prog.compiles == 3
