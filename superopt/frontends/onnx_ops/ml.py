"""Ops of ONNX's classical machine-learning domain (``ai.onnx.ml``) that are plain tensor ops: Binarizer and
ArrayFeatureExtractor."""

from __future__ import annotations

import numpy as np

from superopt import ops
from superopt.frontends.onnx_ops.context import _conv, _Ctx
from superopt.ops._util import ewise, lit

DOMAIN = "ai.onnx.ml"


@_conv(f"{DOMAIN}.Binarizer")
def _binarizer(c: _Ctx, x):
    """1 where X > threshold, else 0, in X's element type."""
    return ewise(c.b, f"where({{0}} > {lit(float(c.attr('threshold', 0.0)))}, 1.0, 0.0)", [x[0]], "binarizer")


@_conv(f"{DOMAIN}.ArrayFeatureExtractor")
def _array_feature_extractor(c: _Ctx, x):
    """X[..., indices] with the indices flattened; a 1-D X gives one row (onnxruntime's and onnx.reference's
    reading of the spec)."""
    shape = c.b.shape(x[0])
    idx = x[1]
    if len(c.b.shape(idx)) != 1:
        idx = ops.reshape(c.b, idx, [-1])
    out = ops.gather(c.b, x[0], idx, len(shape) - 1)
    if len(shape) == 1:
        out = ops.reshape(c.b, out, [1, int(np.prod(c.b.shape(idx)))])
    return out
