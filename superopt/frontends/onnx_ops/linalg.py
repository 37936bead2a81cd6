"""Det (opset 11): the ``det`` extern over the last two axes."""

from __future__ import annotations

from superopt.frontends.onnx_ops.context import _conv, _Ctx


@_conv("Det")
def _det(c: _Ctx, x):
    (y,) = c.b.extern("det", [x[0]], name="det")
    return y
