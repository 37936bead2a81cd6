"""BitCast (opset 26): the same bytes read as another element type of equal size (the ``bitcast`` extern)."""

from __future__ import annotations

import onnx

from superopt.frontends.onnx_ops.context import ELEM, OnnxImportError, _conv, _Ctx


@_conv("BitCast")
def _bitcast(c: _Ctx, x):
    to = int(c.attr("to"))
    if to not in ELEM:
        raise OnnxImportError(f"BitCast to {onnx.TensorProto.DataType.Name(to)}: superopt holds no such type")
    src = c.b.type(x[0]).dtype
    (y,) = c.b.extern("bitcast", [x[0]], name="bitcast", from_dtype=src, dtype=ELEM[to])
    return y
