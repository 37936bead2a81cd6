"""ONNX op converters, one module per family; importing this package fills ``CONVERTERS``."""

from superopt.frontends.onnx_ops import (  # noqa: F401  (registration)
    activations,
    attention,
    bitcast,
    constant,
    control_flow,
    data_dependent,
    detection,
    elementwise,
    flex_attention,
    geometry,
    indexing,
    linalg,
    losses,
    ml,
    movement,
    nn,
    normalization,
    pooling,
    recurrent,
    resize,
    sorting,
    spectral,
    text,
    training,
)
from superopt.frontends.onnx_ops.constant import CONST_ONLY
from superopt.frontends.onnx_ops.context import (
    CONVERTERS,
    ELEM,
    Converter,
    NeedsConstant,
    OnnxImportError,
    _conv,
    _Ctx,
)

__all__ = ["CONVERTERS", "CONST_ONLY", "ELEM", "Converter", "NeedsConstant", "OnnxImportError", "_Ctx", "_conv"]
